"""CPU the host side spends watching a job: EventTail polling plus JobMonitor, per core.

    python bench/bench_monitor_cpu.py --seconds 60 --ranks 8 --display pty

R emitter processes stand in for ranks: each writes its events with the real rank-side writer
(``parallel.events.emit``, to ``<log_dir>/events/rank_<r>.jsonl``): ``started``, ``initialised``,
then one ``step`` event every --interval seconds on a fixed schedule. This process does what the
supervisor's watch loop does for events: every --tick seconds it reads every rank's file with
``EventTail``, hands each record to ``JobMonitor.on_event`` and calls ``JobMonitor.tick``, with
the live table on. ``--display pty`` draws it on a pseudo-terminal (80x40, drained by a ``cat``
process, as a terminal emulator would); ``devnull`` writes the same escape sequences to
/dev/null.

The figure is this process's CPU time (``time.process_time``: every thread, user + system) over
the wall time of the loop, as a percentage of one core. The emitters' and ``cat``'s CPU is not
counted: they stand for the ranks and the terminal. The split by phase (tails, on_event, tick,
the loop's own sleep/wake) comes from reading ``process_time`` around each phase.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import os
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path
from typing import Optional, TextIO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.hangs.hang_limits import Limits  # noqa: E402
from launcher.hangs.stalls import HangCheck  # noqa: E402
from launcher.observe.monitor import JobMonitor  # noqa: E402
from launcher.run.events import EventTail  # noqa: E402

EMITTER = """\
import sys, time
from parallel import events
seconds, interval = float(sys.argv[1]), float(sys.argv[2])
events.emit("started", role="MS_WORKER")
events.emit("initialised")
start = time.monotonic()
n = 0
while True:
    n += 1
    due = start + n * interval
    if due > start + seconds:
        break
    time.sleep(max(0.0, due - time.monotonic()))
    events.emit("step", step=n, epoch=n // 100, loss=1.0 / n, samples_per_s=320.0,
                loss_scale=65536.0)
events.emit("finished", steps=n - 1, final_loss=1.0 / n, samples_per_s=320.0)
"""


@dataclasses.dataclass
class Usage:
    """CPU seconds of this process spent in each phase of the watch loop."""

    tails: float = 0.0
    on_event: float = 0.0
    tick: float = 0.0
    events: int = 0
    ticks: int = 0


def start_emitters(log_dir: Path, ranks: int, seconds: float, interval: float) -> list:
    (log_dir / "events").mkdir(parents=True)
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "NPU_LAUNCH_EVENTS_FILE": str(log_dir / "events" / f"rank_{rank}.jsonl"),
               "RANK_ID": str(rank), "RANK_SIZE": str(ranks), "NPU_LAUNCH_HOST": "bench-host",
               "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen([sys.executable, "-c", EMITTER, str(seconds), str(interval)],
                                      env=env))
    return procs


def open_display(kind: str) -> tuple[TextIO, Optional[subprocess.Popen]]:
    """The stream the live table goes to, and the process draining it (a pty's reader)."""
    if kind == "devnull":
        return open(os.devnull, "w"), None
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 80, 0, 0))
    drain = subprocess.Popen(["cat"], stdin=master, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # EIO once the pty closes
    os.close(master)
    return open(slave, "w"), drain


def watch(procs: list, tails: list[EventTail], monitor: JobMonitor, behind: HangCheck,
          tick: float) -> tuple[float, Usage]:
    """The watch loop until every emitter exited; wall seconds and CPU by phase."""
    usage = Usage()
    wall0 = time.monotonic()
    next_tick = wall0
    while any(p.poll() is None for p in procs):
        c0 = time.process_time()
        batches = [t.read() for t in tails]
        c1 = time.process_time()
        for batch in batches:
            for record in batch:
                monitor.on_event(record)
                usage.events += 1
        c2 = time.process_time()
        monitor.tick()
        behind()  # the stall check the launcher runs with --hang-timeout
        c3 = time.process_time()
        usage.tails += c1 - c0
        usage.on_event += c2 - c1
        usage.tick += c3 - c2
        usage.ticks += 1
        next_tick += tick
        time.sleep(max(0.0, next_tick - time.monotonic()))
    for t in tails:  # the last lines written before the emitters exited
        for record in t.read():
            monitor.on_event(record)
            usage.events += 1
    return time.monotonic() - wall0, usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between step events")
    parser.add_argument("--tick", type=float, default=0.02)
    parser.add_argument("--display", choices=("pty", "devnull"), default="pty")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp) / "job"
        procs = start_emitters(log_dir, args.ranks, args.seconds, args.interval)
        stream, drain = open_display(args.display)
        try:
            monitor = JobMonitor(str(log_dir), "bench", {r: "bench-host" for r in range(args.ranks)},
                                 stream, live=True)
            behind = HangCheck(monitor.rank_states, Limits(30.0, 30.0))
            tails = [EventTail(str(log_dir / "events" / f"rank_{r}.jsonl")) for r in range(args.ranks)]
            cpu0 = time.process_time()
            wall, usage = watch(procs, tails, monitor, behind, args.tick)
            cpu = time.process_time() - cpu0
            summary = monitor.close("succeeded", 0)
        finally:
            stream.close()
            if drain is not None:
                drain.wait()
        report(args, wall, cpu, usage, summary, log_dir)


def report(args: argparse.Namespace, wall: float, cpu: float, usage: Usage, summary: dict,
           log_dir: Path) -> None:
    metrics_lines = sum(1 for _ in open(log_dir / "metrics.jsonl"))
    print(f"{args.ranks} ranks x 1 step event / {args.interval} s for {args.seconds:.0f} s, "
          f"tick {args.tick * 1000:.0f} ms, live table on {args.display}")
    print(f"wall {wall:.1f} s, {usage.ticks} ticks, {usage.events} events "
          f"({metrics_lines} lines in metrics.jsonl), last step {summary['last_step']}")
    print(f"CPU {cpu:.3f} s = {100 * cpu / wall:.2f} % of one core")
    rest = cpu - usage.tails - usage.on_event - usage.tick
    for name, value in (("EventTail.read", usage.tails), ("JobMonitor.on_event", usage.on_event),
                        ("JobMonitor.tick", usage.tick), ("loop, sleep and wake", rest)):
        print(f"  {name:<22} {value:7.3f} s  {100 * value / wall:5.2f} %")


if __name__ == "__main__":
    main()
