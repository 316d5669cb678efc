"""How fast a hang is named with the default (learnt) limit, against the former default.

    python bench/bench_hang_limits.py --runs 2

A plain MindSpore data-parallel job (``tests/plain_scripts/plain_loop.py``, graph mode, 2 CPU
ranks, steps of a few tens of ms) whose rank 1 sleeps before its step 300 (a few seconds after
compilation): the seconds from its sleep (the timestamp it prints) to npu-launch's exit, what
ended the job (npu-launch's own hang check, or MindSpore's 30 s collective timeout on rank 0,
blamed on rank 1 afterwards) and the limit the message names. Side by side in one run: no
``--hang-timeout`` (the limit learnt from the job) and ``--hang-timeout 600`` (the former
default, which MindSpore's timeout beats on CPU; on Ascend HCCL's is 1836 s, so there the job
would hold its cards for the 600 s).

Do not run other work meanwhile: 2 cores, every figure is a wall time.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLAIN = REPO / "tests" / "plain_scripts" / "plain_loop.py"
JOB = [str(PLAIN), "--steps", "2000", "--hang-rank", "1", "--hang-at-step", "300", "--graph"]
VARIANTS = {"learnt (no option)": [], "--hang-timeout 600 (former default)": ["--hang-timeout",
                                                                               "600"]}


def one_run(options: list[str]) -> tuple[float, int, str, str]:
    """(hang -> exit seconds, exit code, what ended it, the limit named)."""
    with tempfile.TemporaryDirectory(prefix="bench-hang-limits-") as logs:
        argv = [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2",
                "--log-dir", logs, *options, *JOB]
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
        end = time.time()
    hung = re.search(r"hangs before step \d+ at (\S+)", proc.stdout + proc.stderr)
    if hung is None:
        raise SystemExit(f"no hang seen: {proc.stderr[-3000:]}")
    head = next((line for line in proc.stderr.splitlines() if " stopped: " in line), "")
    limit = re.search(r"no progress for \d+ s \(([^)]*)\)", head)
    ended = "MindSpore's timeout" if "failure followed from it" in proc.stderr else "hang check"
    return end - float(hung.group(1)), proc.returncode, ended, limit.group(1) if limit else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    print(f"{'variant':<36} {'hang -> exit s (median, runs)':>30} {'code':>5}  ended by; limit")
    for name, options in VARIANTS.items():
        runs = [one_run(options) for _ in range(args.runs)]
        took = statistics.median(r[0] for r in runs)
        shown = ", ".join(f"{r[0]:.1f}" for r in runs)
        print(f"{name:<36} {took:>12.1f} ({shown}){'':>6} {runs[-1][1]:>5}  {runs[-1][2]}; "
              f"{runs[-1][3]}")


if __name__ == "__main__":
    main()
