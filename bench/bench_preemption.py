"""What a stop signal costs the main job: the save on preemption (issue 24, part 2).

    python bench/bench_preemption.py --runs 2 --at-step 30

The digits job (``scripts/train_digits.py``, 2 CPU ranks, 3 epochs, a periodic checkpoint only
at the end) gets SIGTERM once rank 0 reported step ``--at-step``: the step every rank saved, the
seconds from the signal to npu-launch's exit, and then the same command run again: the step it
resumed from and its exit code. Beside it, the same signal with the save turned off (the ranks
stopped at once, as before: ``--kill-timeout 0``), which leaves only the periodic checkpoints.

Do not run other work meanwhile: 2 cores, every figure is a wall time.
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAIN = REPO / "scripts" / "train_digits.py"


def last_step(logs: Path) -> int:
    path = logs / "events" / "rank_0.jsonl"
    if not path.exists():
        return -1
    steps = [json.loads(line).get("step") for line in path.read_text().splitlines()
             if '"event": "step"' in line]
    return max((s for s in steps if isinstance(s, int)), default=-1)


def one_run(at_step: int, kill_timeout: str) -> tuple[int, str, float, str, int]:
    """(step at the signal, step saved, signal -> exit s, resumed from, rerun's exit code)."""
    with tempfile.TemporaryDirectory(prefix="bench-preemption-") as tmp:
        logs = Path(tmp) / "logs"
        argv = [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2",
                "--console", "none", "--kill-timeout", kill_timeout, "--log-dir", str(logs),
                str(MAIN), "--epochs", "3"]
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=REPO)
        while last_step(logs) < at_step:
            time.sleep(0.02)
        at, sent = last_step(logs), time.time()
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate()[1]
        took = time.time() - sent
        saved = re.search(r"every rank saves step (\d+)", err)
        again = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
        resumed = re.search(r"resumed from step (\d+)", (logs / "rank_0.log").read_text())
        return (at, saved.group(1) if saved else "-", took,
                resumed.group(1) if resumed else "start", again.returncode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--at-step", type=int, default=30)
    args = parser.parse_args()
    print(f"{'variant':<34} {'signal at':>9} {'saved':>6} {'signal->exit s':>15} "
          f"{'rerun resumed from':>19} {'rerun exit':>10}")
    for name, kill in (("save on stop (--kill-timeout 10)", "10"),
                       ("no save (--kill-timeout 0)", "0")):
        for _ in range(args.runs):
            at, saved, took, resumed, code = one_run(args.at_step, kill)
            print(f"{name:<34} {at:>9} {saved:>6} {took:>15.2f} {resumed:>19} {code:>10}")


if __name__ == "__main__":
    main()
