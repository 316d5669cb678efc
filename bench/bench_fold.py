"""What node 0 spends folding rank events (issue 23 part 2: one fold for each fact), this tree
against another side by side.

    python bench/bench_fold.py [--against DIR] [--runs 7] [--ranks 8] [--steps 2000]

The events are what a MindSpore rank with the rank hook sends: ``started``, ``framework``,
``init-started``, ``initialised`` (twice: the hook's and ``parallel.init()``'s), ``first-step``,
then per step two ``progress`` events (into a call, out of it) and a ``step``. They are parsed
once, then handed to node 0's ``Attempt.event`` (the monitor's fold, metrics.jsonl, the
attempt's own reading) and the time of that loop is taken (``time.perf_counter``). Each run is
a fresh process; with ``--against DIR`` (a checkout or ``git archive`` of another commit's
``launcher``, ``parallel`` and ``rank_tables``) runs alternate between the two trees, so drift on
a shared machine hits both alike. Prints the median microseconds per event of each.
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _events(ranks: int, steps: int) -> list:
    from parallel.contract import Event

    def event(kind: str, rank: int, at: float, **fields: object) -> Event:
        parsed = Event.parse({"event": kind, "rank": rank, "host": "h", "time": at, **fields})
        assert parsed is not None
        return parsed
    out = [event(kind, r, 1.0, **fields) for r in range(ranks)
           for kind, fields in (("started", {}), ("framework", {"name": "mindspore"}),
                                ("init-started", {}), ("initialised", {}), ("initialised", {}),
                                ("first-step", {}))]
    for s in range(steps):
        for r in range(ranks):
            out += [event("progress", r, 2.0 + s, count=2 * s, busy=True, loads=0),
                    event("progress", r, 2.5 + s, count=2 * s + 1, busy=False, loads=0),
                    event("step", r, 2.6 + s, step=s, loss=1.0)]
    return out


def one_run(ranks: int, steps: int) -> float:
    """Microseconds per event of one pass, in this process's tree."""
    from launcher.attempt import Attempt
    from launcher.observe.monitor import JobMonitor
    events = _events(ranks, steps)
    with tempfile.TemporaryDirectory() as logs:
        monitor = JobMonitor(logs, "bench", {r: "h" for r in range(ranks)}, io.StringIO(), False)
        attempt = Attempt(monitor)
        started = time.perf_counter()
        for e in events:
            attempt.event(e)
        took = time.perf_counter() - started
        monitor.close("succeeded", 0)
    return took / len(events) * 1e6


def _run_in(tree: Path, ranks: int, steps: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--one", "--ranks", str(ranks),
                          "--steps", str(steps)], env=env, check=True, capture_output=True,
                         text=True, cwd=tree).stdout
    return float(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one_run(args.ranks, args.steps))
        return
    trees = {"this tree": REPO, **({str(args.against): args.against} if args.against else {})}
    times: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            times[name].append(_run_in(tree.resolve(), args.ranks, args.steps))
    events = args.ranks * (6 + 3 * args.steps)
    print(f"{events} events ({args.ranks} ranks x {args.steps} steps), median of {args.runs} runs")
    for name, runs in times.items():
        print(f"  {name}: {statistics.median(runs):.2f} us/event "
              f"(min {min(runs):.2f}, max {max(runs):.2f})")


if __name__ == "__main__":
    main()
