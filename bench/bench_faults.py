"""What a fault costs the main job (issue 24, part 5): work redone and time, side by side.

    python bench/bench_faults.py --runs 1 --at-step 50

The digits job (``scripts/train_digits.py``, 2 CPU ranks, its defaults: 10 epochs of 22 steps,
a periodic checkpoint every 5 epochs) three ways, in one run:

* uninterrupted;
* a crash: rank 1 SIGKILLs itself after step ``--at-step`` (``tests/rank_scripts/digits_faults.py
  --kill-at-step``), ``--max-restarts 1`` and npu-launch's defaults otherwise (since stop 38:
  the first restart at once, warm spares; until then ``--restart-backoff 1`` was passed);
* a hang: rank 1 stops (sleeps) after step ``--at-step`` in the first attempt
  (``tests/rank_scripts/digits_last_words.py --hang-at-step``), ``--max-restarts 1``, the hang
  limit npu-launch's default (learnt from the job);
* a stop: SIGTERM to npu-launch once rank 0 reported step ``--at-step``, then the same command
  again (how a preempted job goes on).

For each: the job's wall time (both launches for the stop) and its ratio to the uninterrupted
one, the steps redone (the fault's step less the step the next attempt resumed from), and the
seconds from the fault to the next attempt's first step, split where npu-launch's own files
say (the fault to the attempt's end, which holds the last-words save, then the backoff, then
the next attempt's start to its ranks' first step, split by rank 0's start-up marks).

Do not run other work meanwhile: 2 cores, every figure is a wall time.
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
MAIN = REPO / "scripts" / "train_digits.py"
FAULTS = REPO / "tests" / "rank_scripts" / "digits_faults.py"
HANGS = REPO / "tests" / "rank_scripts" / "digits_last_words.py"
SAVED = re.compile(r"last words: rank \d+ saved step (\d+) .*\(([\d.]+) s\)")
LAUNCH = [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2", "--console",
          "none"]


def children_cpu() -> float:
    """CPU seconds of every process this one waited for, with theirs (npu-launch reaps its
    ranks and scheduler): far less bent by other work on the machine than wall time."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def records(logs: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records, in order (every launch into this log dir appends)."""
    path = logs / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def last_step(logs: Path) -> int:
    steps = [r.get("step") for r in records(logs) if r.get("event") == "step" and r.get("rank") == 0]
    return max((s for s in steps if isinstance(s, int)), default=-1)


def first_step_after(logs: Path, after: float) -> Optional[dict[str, Any]]:
    """The first ``step`` record at or after ``after`` (the next attempt's first step)."""
    return next((r for r in records(logs) if r.get("event") == "step"
                 and (r.get("time") or 0.0) >= after), None)


def uninterrupted(tmp: Path) -> dict[str, Any]:
    logs = tmp / "plain"
    started, cpu = time.monotonic(), children_cpu()
    done = subprocess.run([*LAUNCH, "--log-dir", str(logs), str(MAIN)], capture_output=True,
                          text=True, cwd=REPO)
    return {"wall_s": time.monotonic() - started, "cpu_s": children_cpu() - cpu,
            "exit": done.returncode, "steps": last_step(logs)}


def crash(tmp: Path, at_step: int) -> dict[str, Any]:
    fault = [str(FAULTS), "--kill-at-step", str(at_step)]
    return restarted(tmp / "crash", at_step, fault, lambda logs: next(
        (r["time"] for r in records(logs) if r.get("event") == "exited" and r.get("rank") == 1
         and r.get("returncode") == -signal.SIGKILL), None))


def hang(tmp: Path, at_step: int) -> dict[str, Any]:
    fault = [str(HANGS), "--hang-at-step", str(at_step)]
    return restarted(tmp / "hang", at_step, fault, lambda logs: next(
        (r["time"] for r in records(logs) if r.get("event") == "step" and r.get("rank") == 1
         and r.get("step") == at_step), None))


def restarted(logs: Path, at_step: int, fault: list[str], fault_time: Any) -> dict[str, Any]:
    """The job with ``fault`` and one restart; ``fault_time(logs)`` says when the fault was."""
    started, cpu = time.monotonic(), children_cpu()
    done = subprocess.run([*LAUNCH, "--max-restarts", "1",
                           "--log-dir", str(logs), *fault], capture_output=True, text=True,
                          cwd=REPO)
    wall = time.monotonic() - started
    summary = json.loads((logs / "summary.json").read_text())
    attempts = summary.get("attempts") or []
    result: dict[str, Any] = {"wall_s": wall, "cpu_s": children_cpu() - cpu,
                              "exit": done.returncode, "attempts": len(attempts)}
    said = SAVED.search(done.stderr)
    result["last_words"] = f"step {said.group(1)} in {said.group(2)} s" if said else \
        next((line for line in done.stderr.splitlines() if "no last words" in line), None)
    if len(attempts) >= 2:
        failed, again = attempts[-2], attempts[-1]
        resumed = again.get("resumed_from") or 0
        first = first_step_after(logs, again["started_at"])
        result.update({
            "resumed_from": resumed, "steps_redone": at_step - resumed,
            "fault_to_attempt_end_s": None,
            "attempt_end_to_next_start_s": again["started_at"] - failed["ended_at"],
            "next_start_to_first_step_s": (first["time"] - again["started_at"]) if first else None,
            "next_start_phases_s": phases(logs, again["started_at"]),
        })
        fault = fault_time(logs)
        if fault is not None:
            result["fault_to_attempt_end_s"] = failed["ended_at"] - fault
            if first:
                result["fault_to_next_first_step_s"] = first["time"] - fault
    return result


def phases(logs: Path, since: float) -> dict[str, float]:
    """Rank 0's start-up marks after ``since`` (the next attempt's start), as seconds from it:
    where the time to its first step goes."""
    marks = {"started": "process", "framework": "imports", "init-started": "init() called",
             "initialised": "init() done", "first-step": "first step"}
    seen: dict[str, float] = {}
    for r in records(logs):
        kind = r.get("event")
        if kind in marks and r.get("rank") == 0 and (r.get("time") or 0.0) >= since \
                and marks[kind] not in seen:
            seen[marks[kind]] = round(r["time"] - since, 2)
    return seen


def stop(tmp: Path, at_step: int) -> dict[str, Any]:
    logs = tmp / "stop"
    argv = [*LAUNCH, "--log-dir", str(logs), str(MAIN)]
    started, cpu = time.monotonic(), children_cpu()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    while last_step(logs) < at_step and proc.poll() is None:
        time.sleep(0.02)
    at, signalled = last_step(logs), time.time()
    proc.send_signal(signal.SIGTERM)
    proc.communicate()
    first_wall = time.monotonic() - started
    again_started, relaunched = time.monotonic(), time.time()
    again = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    said = re.search(r"resumed from step (\d+)", (logs / "rank_0.log").read_text())
    resumed = int(said.group(1)) if said else 0  # the trainer resumes by itself: its log says
    first = first_step_after(logs, relaunched)
    return {"wall_s": first_wall + time.monotonic() - again_started,
            "cpu_s": children_cpu() - cpu, "exit": again.returncode,
            "signal_at_step": at, "resumed_from": resumed, "steps_redone": max(at - resumed, 0),
            "signal_to_exit_s": relaunched - signalled,
            "relaunch_to_first_step_s": (first["time"] - relaunched) if first else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--at-step", type=int, default=50)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "faults.json")
    parser.add_argument("--faults", nargs="+", choices=("crash", "hang", "stop"),
                        default=["crash", "hang", "stop"],
                        help="the faults to run beside the uninterrupted job")
    args = parser.parse_args()
    cases = {"crash": crash, "hang": hang, "stop": stop}
    rows: dict[str, list[dict[str, Any]]] = {"uninterrupted": [],
                                             **{fault: [] for fault in args.faults}}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
            rows["uninterrupted"].append(uninterrupted(Path(tmp)))
            for fault in args.faults:
                rows[fault].append(cases[fault](Path(tmp), args.at_step))
    base = statistics.median(r["wall_s"] for r in rows["uninterrupted"])
    base_cpu = statistics.median(r["cpu_s"] for r in rows["uninterrupted"])
    for kind, runs in rows.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        print(f"{kind}: median wall {wall:.1f} s ({wall / base:.2f}x uninterrupted), "
              f"CPU {cpu:.1f} s ({cpu / base_cpu:.2f}x)")
        for r in runs:
            print("   ", json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                     for k, v in r.items()}))
    args.out.write_text(json.dumps({"at_step": args.at_step, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
