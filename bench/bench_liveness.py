"""CPU a node spends reading whether its quiet ranks are alive (``launcher.hangs.liveness``).

    python bench/bench_liveness.py --ranks 64 --seconds 30

The worst case of the hang watch's reading: every rank of a node quiet and outside a framework
call at once (each busy alone, or all frozen), so ``LifeWatch`` reads all of them every second:
one pass over ``/proc`` for the sessions, then each rank's ``stat``, ``schedstat``, ``io`` and
its session's processes. R real processes stand in for the ranks, each the leader of its own
session with one child (``sleep``), as a rank with a ``tar`` would be; half of them write a
little every 0.2 s, so both answers (alive, not) are read. This process runs the node's watch
loop's part: ``LifeWatch.read`` on the 20 ms tick, for --seconds. The figure is its CPU time
(``time.process_time``) over the wall time, as a percentage of one core; in a job that steps,
no rank is quiet and the reading costs nothing (``LifeWatch`` returns before reading ``/proc``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from launcher.hangs.liveness import LifeWatch  # noqa: E402
from launcher.ranks.record import RankRecord  # noqa: E402

_RANK = ("import os, subprocess, sys, time\n"
         "child = subprocess.Popen(['sleep', '3600'])\n"
         "while True:\n"
         "    time.sleep(0.2)\n"
         "    if sys.argv[1] == 'write':\n"
         "        os.write(1, b'.')\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    ranks = [subprocess.Popen([sys.executable, "-c", _RANK, "write" if r % 2 else "sleep"],
                              stdout=subprocess.DEVNULL, start_new_session=True)
             for r in range(args.ranks)]
    try:
        time.sleep(1.0)
        records = {r: RankRecord(since=time.time() - 5.0) for r in range(args.ranks)}
        watch = LifeWatch(records, "bench")
        pids = {r: p.pid for r, p in enumerate(ranks)}
        alive = 0
        cpu, wall = time.process_time(), time.monotonic()
        while time.monotonic() - wall < args.seconds:
            alive += len(watch.read(pids, time.time()))
            time.sleep(0.02)
        used = time.process_time() - cpu
        took = time.monotonic() - wall
    finally:
        for p in ranks:
            os.killpg(p.pid, 9)
            p.wait()
    print(f"{args.ranks} quiet ranks read for {took:.0f} s: {100 * used / took:.2f}% of one core "
          f"({alive} alive readings, {alive / took:.1f}/s)")


if __name__ == "__main__":
    main()
