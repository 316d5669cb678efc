"""The launcher's own CPU use while a real 2-rank job trains (about 60 s), status table on.

    python bench/bench_launcher_cpu.py [--steps 2800] [--ranks 2]

npu-launch runs on a pseudo-terminal (so the live status table is drawn) with every rank line
on the console; the job steps as fast as the CPU allows and reports every step. Prints the
launcher process's user+system CPU seconds over its wall time, as a percentage of one core.
"""
from __future__ import annotations

import argparse
import os
import pty
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent


def drain(fd: int, counter: list[int]) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        if not data:
            return
        counter[0] += data.count(b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2800)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    master, slave = pty.openpty()
    logs = tempfile.mkdtemp(prefix="bench-cpu-")
    argv = [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", str(args.ranks),
            "--log-dir", logs, str(HERE / "steady_job.py"), "--steps", str(args.steps)]
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    start = time.time()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    lines = [0]
    threading.Thread(target=drain, args=(master, lines), daemon=True).start()
    me = psutil.Process(proc.pid)
    cpu = 0.0
    while proc.poll() is None:
        try:
            t = me.cpu_times()
            cpu = t.user + t.system
        except psutil.Error:
            break
        time.sleep(0.2)
    wall = time.time() - start
    steps = sum(1 for line in open(os.path.join(logs, "metrics.jsonl")) if '"step"' in line)
    print(f"launcher CPU {cpu:.2f} s over {wall:.1f} s wall = {100 * cpu / wall:.2f}% of one core "
          f"({args.ranks} ranks, {steps} step events, {lines[0]} console lines, exit "
          f"{proc.returncode})")


if __name__ == "__main__":
    main()
