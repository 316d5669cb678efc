"""A restart's way to its first step with MindSpore's compile cache (the default) and without.

    python bench/bench_compile_cache.py --pairs 3

A 2-rank job fails once and is restarted (``--max-restarts 1``): the main digits job
(``--job digits``: ``tests/rank_scripts/digits_faults.py``, rank 1 SIGKILLs itself after step
``--kill-at-step`` of its first attempt; 1 epoch) or a small CNN on 8x8 inputs (``--job small``:
``tests/rank_scripts/compiled_steps.py``, rank 1 raises after its first step). "without" is the
same job with ``MS_COMPILER_CACHE_ENABLE=0`` in the user's environment, which npu-launch leaves
alone. The two alternate, ``--pairs`` times each. From ``metrics.jsonl`` (the second attempt's
events are each rank's second ``started`` and what follows it):

  restart->step   the first rank's exit in the first attempt -> the second attempt's first
                  ``step`` event (the last rank's): teardown, the restart, start-up, compilation
  start->step     the second attempt's first ``started`` -> the same step
  init->step      the second attempt's last ``initialised`` -> the same step: where compilation
                  is (what the cache saves), and the steps before the first ``step`` event
                  (the digits trainer reports every 5th step: steps 1-5; the small job: step 0)
  first init->step  the same in the first attempt, which compiles in both: a control

Prints the median of each for both and the ratio with/without, and whether every run ended with
the same parameters (the ranks' checksums). Do not run other work meanwhile: 2 cores, every
figure is a wall time (each run's line shows the 1-minute load average it started at).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
JOBS = {
    "digits": (REPO / "tests" / "rank_scripts" / "digits_faults.py", "--epochs", "1"),
    "small": (REPO / "tests" / "rank_scripts" / "compiled_steps.py", "--fail-rank", "1"),
}
PHASES = ("restart->step", "start->step", "init->step", "first init->step")
CACHE_VARS = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")


def command(job: str, kill_at: int, log_dir: Path) -> list[str]:
    script, *args = JOBS[job]
    fault = ["--kill-at-step", str(kill_at)] if job == "digits" else ["--fail-after-step", "0"]
    return [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2",
            "--max-restarts", "1", "--log-dir", str(log_dir), str(script), *args, *fault]


def attempts(metrics: Path) -> list[list[dict[str, Any]]]:
    """The records of each attempt: a rank's ``started`` opens its next attempt."""
    seen: dict[int, int] = {}
    split: list[list[dict[str, Any]]] = [[], []]
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        rank = record.get("rank")
        if rank is None:
            continue
        if record["event"] == "started":
            seen[rank] = seen.get(rank, -1) + 1
        split[min(seen.get(rank, 0), 1)].append(record)
    return split


def times(records: list[dict[str, Any]], event: str) -> list[float]:
    return [r["time"] for r in records if r["event"] == event]


def first_step(records: list[dict[str, Any]]) -> float:
    """When every rank had reported its first ``step`` event of the attempt."""
    firsts: dict[int, float] = {}
    for r in records:
        if r["event"] == "step":
            firsts.setdefault(r["rank"], r["time"])
    return max(firsts.values())


def run_once(job: str, kill_at: int, cached: bool) -> tuple[dict[str, float], str]:
    work = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    if not cached:
        env["MS_COMPILER_CACHE_ENABLE"] = "0"
    result = subprocess.run(command(job, kill_at, work / "logs"), env=env, cwd=work,
                            capture_output=True, text=True, timeout=900)
    try:
        if result.returncode != 0 or "restart 1 of 1" not in result.stderr:
            raise SystemExit(f"the job did not restart and finish:\n{result.stderr[-3000:]}")
        first, second = attempts(work / "logs" / "metrics.jsonl")
        step = first_step(second)
        phases = {"restart->step": step - min(times(first, "exited")),
                  "start->step": step - min(times(second, "started")),
                  "init->step": step - max(times(second, "initialised")),
                  "first init->step": first_step(first) - max(times(first, "initialised"))}
        return phases, " ".join(sorted(re.findall(r"checksum (\S+)", result.stdout)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--job", choices=sorted(JOBS), default="digits")
    parser.add_argument("--kill-at-step", type=int, default=7,
                        help="digits: after its step 5 is reported [default: 7]")
    args = parser.parse_args()
    samples: dict[tuple[bool, str], list[float]] = {}
    results = set()
    for pair in range(args.pairs):
        for cached in ((True, False) if pair % 2 == 0 else (False, True)):
            load = os.getloadavg()[0]
            phases, checksum = run_once(args.job, args.kill_at_step, cached)
            results.add(checksum)
            for phase, value in phases.items():
                samples.setdefault((cached, phase), []).append(value)
            print(f"pair {pair} {'with' if cached else 'without'} (load {load:.1f}): "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()), flush=True)
    print(f"\n{'phase':<17} {'with s':>8} {'without s':>10} {'ratio':>7}")
    for phase in PHASES:
        with_, without = (statistics.median(samples[(c, phase)]) for c in (True, False))
        print(f"{phase:<17} {with_:>8.2f} {without:>10.2f} {with_ / without:>7.2f}")
    print(f"same parameters in every run: {'yes' if len(results) == 1 else results}")


if __name__ == "__main__":
    main()
