"""torch ranks under npu-launch and under torchrun (issue 22): wall time and hang to exit.

    python bench/bench_torch.py --pairs 5 --steps 300 --timeouts 3 5 --hang-runs 2

1. Wall time. ``tests/rank_scripts/torch_ddp.py --steps S`` (a torchrun-style DDP script, gloo,
   2 ranks on this host) under ``npu-launch --device cpu --cards 2`` and under
   ``python -m torch.distributed.run --standalone --nproc-per-node 2``, alternating (the first
   of a pair swaps each time), N pairs: command start to exit. Prints both medians and the
   ratio npu-launch / torchrun (goal <= 1.1). Every run must print both ranks' checksums,
   equal, and npu-launch's equal to torchrun's; one that then ends non-zero is recorded
   (``wall_failed``) and run again.
2. Hang to exit. The same script with ``--hang-rank 1 --hang-at 5`` (rank 1 sleeps before step
   5 while rank 0 waits in the all-reduce), run through ``bench/torch_hang_mark.py``, which
   writes the time the sleep began. For each ``--hang-timeout T``: seconds from that time to
   npu-launch's exit, its exit code (124 for a hang) and ``summary.json``'s ``stall`` (the rank
   it names); goal within T + 2 s. Then torchrun once on the same hang, stopped (SIGTERM to
   torchrun, which stops its ranks) after ``--torchrun-cap`` seconds if still running: gloo's
   default timeout is 30 minutes. ``--without-py-spy`` adds each hang again with py-spy off
   PATH, to show what its native stacks (read before any rank is stopped) add.

Both launchers get the same environment without OMP_NUM_THREADS (each sets it to 1 for 2
ranks). Raw figures go to ``--out`` (JSON) with the load average around each run: this machine
has 2 cores shared with other work, so alternate and read medians.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DDP = REPO / "tests" / "rank_scripts" / "torch_ddp.py"
MARKER = HERE / "torch_hang_mark.py"
_CHECKSUM = re.compile(r"rank (\d+)/\d+ checksum (-?\d+\.\d{12})")  # lines may run together
LAUNCHERS = ("npu-launch", "torchrun")


@dataclass
class WallRun:
    """One clean run of the DDP script: who launched it, how long it took, what it printed."""

    launcher: str
    seconds: float
    checksums: dict[int, str]
    load: tuple[float, float]
    exit_code: int = 0
    stderr: str = ""


@dataclass
class HangRun:
    """One hung run: from rank 1's sleep to the launcher's exit, and what ended the job."""

    launcher: str
    hang_timeout: Optional[float]
    hang_to_exit: Optional[float]
    exit_code: Optional[int]
    ended_by: str
    stall: Optional[dict] = None
    root_cause: Optional[dict] = None
    ranks_left: list[int] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)
    phases: dict[str, float] = field(default_factory=dict)
    py_spy: bool = True


def argv_for(launcher: str, log_dir: Path, script: list[str], options: tuple[str, ...] = ()
             ) -> list[str]:
    """The command line of ``launcher`` for ``script`` (2 ranks on this host)."""
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", *script]
    return [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2",
            "--log-dir", str(log_dir), *options, *script]


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, **extra}


def path_without_py_spy() -> str:
    """PATH without the directories that hold py-spy: npu-launch then reads Python stacks only
    (its ranks run from sys.executable's absolute path, so nothing else needs PATH here)."""
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if not (Path(d) / "py-spy").exists())


def load_pair(before: tuple[float, float, float]) -> tuple[float, float]:
    """The 1-minute load average before and after a run."""
    return before[0], os.getloadavg()[0]


def wall_once(launcher: str, steps: int) -> WallRun:
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        work = Path(tmp)
        load = os.getloadavg()
        start = time.monotonic()
        done = subprocess.run(argv_for(launcher, work / "logs", [str(DDP), "--steps", str(steps)]),
                              cwd=work, env=base_env(), capture_output=True, text=True,
                              timeout=600)
        seconds = time.monotonic() - start
    sums = {int(m.group(1)): m.group(2) for m in _CHECKSUM.finditer(done.stdout)}
    if len(sums) != 2 or len(set(sums.values())) != 1:
        raise SystemExit(f"{launcher}: exit {done.returncode}, checksums {sums}\n"
                         f"{done.stderr[-3000:]}")
    return WallRun(launcher, seconds, sums, load_pair(load), done.returncode,
                   "" if done.returncode == 0 else done.stderr[-2000:])


def wall_until_clean(launcher: str, steps: int, failed: list[WallRun], tries: int = 3
                     ) -> WallRun:
    """A clean run of ``launcher``; a run that printed both checksums and then ended non-zero
    (torch 2.13's gloo sometimes aborts a rank in its teardown, under either launcher) is kept
    in ``failed`` and run again."""
    for _ in range(tries):
        run = wall_once(launcher, steps)
        if run.exit_code == 0:
            return run
        failed.append(run)
        print(f"  {launcher}: exit {run.exit_code} after its checksums; again", flush=True)
    raise SystemExit(f"{launcher}: {tries} runs failed\n{failed[-1].stderr}")


def walls(pairs: int, steps: int, failed: list[WallRun]) -> list[WallRun]:
    runs: list[WallRun] = []
    for pair in range(pairs):
        order = LAUNCHERS if pair % 2 == 0 else LAUNCHERS[::-1]
        for launcher in order:
            runs.append(wall_until_clean(launcher, steps, failed))
            print(f"  pair {pair}: {launcher:<10} {runs[-1].seconds:6.2f} s "
                  f"(load {runs[-1].load[0]:.1f})", flush=True)
    sums = {tuple(sorted(r.checksums.values())) for r in runs}
    if len(sums) > 1:
        raise SystemExit(f"checksums differ between runs: {sums}")
    return runs


def hang_script() -> list[str]:
    return [str(MARKER), str(DDP), "--steps", "100000", "--hang-rank", "1", "--hang-at", "5"]


def read_marks(marks: Path, name: str) -> dict[int, str]:
    return {int(p.name.split("_")[1]): p.read_text().strip() for p in marks.glob(f"{name}_*")}


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def ranks_left(marks: Path) -> list[int]:
    """Rank processes of this run still alive; they are killed (this benchmark started them)."""
    left = [int(pid) for pid in read_marks(marks, "pid").values() if alive(int(pid))]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def wait_for_hang(proc: subprocess.Popen, marks: Path, limit: float = 300) -> Optional[float]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        hung = read_marks(marks, "hang")
        if hung:
            return float(next(iter(hung.values())))
        time.sleep(0.05)
    hung = read_marks(marks, "hang")
    return float(next(iter(hung.values()))) if hung else None


def phases(logs: Path, hung_at: float) -> dict[str, float]:
    """Seconds from the hang to each thing npu-launch did about it, read from its files: the
    ranks' last progress event (the hook writes one every 0.5 s), rank 1's Python stacks
    (faulthandler), its native stacks (py-spy), the ranks' exits (metrics.jsonl)."""
    found: dict[str, float] = {}
    for rank in (0, 1):
        events = logs / "events" / f"rank_{rank}.jsonl"
        times = [json.loads(line)["time"] for line in events.read_text().splitlines()
                 if '"progress"' in line] if events.exists() else []
        if times:
            found[f"last_progress_event_rank{rank}"] = max(times) - hung_at
    for name, path in (("python_stacks", "rank_1.txt"), ("native_stacks", "rank_1.native.txt")):
        if (logs / "stacks" / path).exists():
            found[name] = (logs / "stacks" / path).stat().st_mtime - hung_at
    exits = [json.loads(line)["time"] for line in (logs / "metrics.jsonl").read_text().splitlines()
             if '"exited"' in line]
    if exits:
        found["ranks_exited"] = max(exits) - hung_at
    return found


def ours_hang(hang_timeout: float, py_spy: bool = True) -> HangRun:
    with tempfile.TemporaryDirectory(prefix="bench-torch-hang-") as tmp:
        work, load = Path(tmp), os.getloadavg()
        (work / "marks").mkdir()
        argv = argv_for("npu-launch", work / "logs", hang_script(),
                        ("--hang-timeout", f"{hang_timeout:g}", "--console", "none"))
        env = base_env(BENCH_HANG_MARK=str(work / "marks"))
        if not py_spy:
            env["PATH"] = path_without_py_spy()
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        proc.communicate(timeout=hang_timeout + 600)
        end = time.time()
        hung = read_marks(work / "marks", "hang")
        if 1 not in hung:
            raise SystemExit(f"npu-launch: rank 1 never reached its hang (exit {proc.returncode})")
        summary = json.loads((work / "logs" / "summary.json").read_text())
        stall = summary.get("stall")
        return HangRun("npu-launch", hang_timeout, end - float(hung[1]), proc.returncode,
                       "stall" if stall else "other", stall, summary.get("root_cause"),
                       ranks_left(work / "marks"), load_pair(load),
                       phases(work / "logs", float(hung[1])), py_spy)


def torchrun_hang(cap: float) -> HangRun:
    with tempfile.TemporaryDirectory(prefix="bench-torchrun-hang-") as tmp:
        work, load = Path(tmp), os.getloadavg()
        (work / "marks").mkdir()
        proc = subprocess.Popen(argv_for("torchrun", work, hang_script()), cwd=work,
                                env=base_env(BENCH_HANG_MARK=str(work / "marks")),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        hung_at = wait_for_hang(proc, work / "marks")
        if hung_at is None:
            proc.kill()
            raise SystemExit("torchrun: rank 1 never reached its hang")
        try:
            proc.wait(timeout=max(0.0, hung_at + cap - time.time()))
            return HangRun("torchrun", None, time.time() - hung_at, proc.returncode, "exited",
                           ranks_left=ranks_left(work / "marks"), load=load_pair(load))
        except subprocess.TimeoutExpired:
            pass
        proc.send_signal(signal.SIGTERM)  # torchrun's handler stops its ranks, then exits
        proc.wait(timeout=120)
        return HangRun("torchrun", None, None, proc.returncode, f"still hung at {cap:g} s",
                       ranks_left=ranks_left(work / "marks"), load=load_pair(load))


def hangs(timeouts: list[float], runs: int, cap: float, with_torchrun: bool,
          without_py_spy: bool) -> list[HangRun]:
    results: list[HangRun] = []
    settings = [(t, True) for t in timeouts] + ([(t, False) for t in timeouts]
                                                if without_py_spy else [])
    for run in range(runs):
        for timeout, py_spy in (settings if run % 2 == 0 else settings[::-1]):
            results.append(ours_hang(timeout, py_spy))
            r = results[-1]
            print(f"  --hang-timeout {timeout:g}{'' if py_spy else ' (no py-spy)'}: "
                  f"hang -> exit {r.hang_to_exit:.2f} s, exit {r.exit_code}, "
                  f"stall rank {(r.stall or {}).get('rank')}, left {r.ranks_left}", flush=True)
            print("    " + ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items()), flush=True)
    if with_torchrun:
        results.append(torchrun_hang(cap))
        print(f"  torchrun: {results[-1].ended_by}, exit {results[-1].exit_code}, "
              f"left {results[-1].ranks_left}", flush=True)
    return results


def summarise(wall_runs: list[WallRun], hang_runs: list[HangRun]) -> dict:
    table: dict = {}
    if wall_runs:
        med = {name: statistics.median(r.seconds for r in wall_runs if r.launcher == name)
               for name in LAUNCHERS}
        table = {"wall_median_s": med, "ratio": med["npu-launch"] / med["torchrun"]}
    settings = {(r.hang_timeout, r.py_spy) for r in hang_runs if r.hang_timeout is not None}
    for timeout, py_spy in sorted(settings, key=lambda ts: (ts[0], not ts[1])):
        took = [r.hang_to_exit for r in hang_runs if (r.hang_timeout, r.py_spy) == (timeout, py_spy)
                and r.hang_to_exit is not None]
        key = f"hang_to_exit_s@{timeout:g}{'' if py_spy else '_no_py_spy'}"
        table[key] = {"median": statistics.median(took), "max": max(took)}
    return table


def report(table: dict, hang_runs: list[HangRun]) -> None:
    if "wall_median_s" in table:
        med = table["wall_median_s"]
        print(f"wall median: npu-launch {med['npu-launch']:.2f} s, "
              f"torchrun {med['torchrun']:.2f} s, ratio {table['ratio']:.2f}; "
              f"runs re-done after a non-zero exit: {table.get('wall_failed')}")
    for key, value in table.items():
        if key.startswith("hang_to_exit"):
            print(f"{key}: median {value['median']:.2f} s, max {value['max']:.2f} s")
    for r in hang_runs:
        if r.launcher == "torchrun":
            print(f"torchrun on the same hang: {r.ended_by} (exit {r.exit_code} after SIGTERM)")


def git_head() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="0: no wall-time runs")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--timeouts", type=float, nargs="*", default=[3, 5])
    parser.add_argument("--hang-runs", type=int, default=2)
    parser.add_argument("--torchrun-cap", type=float, default=60)
    parser.add_argument("--no-torchrun-hang", action="store_true")
    parser.add_argument("--without-py-spy", action="store_true",
                        help="also each hang with py-spy off PATH (Python stacks only)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "torch.json")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"wall: {args.pairs} pairs, --steps {args.steps}", flush=True)
    failed: list[WallRun] = []
    wall_runs = walls(args.pairs, args.steps, failed)
    print("hang to exit:", flush=True)
    hang_runs = hangs(args.timeouts, args.hang_runs, args.torchrun_cap,
                      not args.no_torchrun_hang, args.without_py_spy)
    table = summarise(wall_runs, hang_runs)
    table["wall_failed"] = {name: sum(r.launcher == name for r in failed) for name in LAUNCHERS}
    report(table, hang_runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", "bench/bench_torch.py", *sys.argv[1:]]),
        "started": started, "commit": git_head(), "cpus": os.cpu_count(),
        "summary": table, "wall": [asdict(r) for r in wall_runs],
        "wall_failed": [asdict(r) for r in failed],
        "hang": [asdict(r) for r in hang_runs]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
