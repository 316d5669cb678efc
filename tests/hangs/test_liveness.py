"""Each node's reading of whether a quiet rank is frozen or busy alone
(``launcher.hangs.liveness``), on real processes the tests start as the supervisor starts a rank
(``python -c``, in its own session) and kill: what the kernel keeps of a process that sleeps,
writes, spins, or waits on a child in its session; and ``LifeWatch``, which reads only the
ranks that are quiet and outside a framework call."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
from helpers import alive, wait_for

from launcher.hangs.liveness import INTERVAL, LifeWatch, Reading, read_rank, sessions_now
from launcher.ranks.record import RankRecord
from parallel import contract
from parallel.contract import Event

SLEEPS = "import time\nprint('ready', flush=True)\ntime.sleep(600)\n"
WRITES = ("import sys, time\nprint('ready', flush=True)\n"
          "with open(sys.argv[1], 'w') as f:\n"
          "    while True:\n"
          "        f.write('x' * 4096)\n"
          "        f.flush()\n"
          "        time.sleep(0.01)\n")
SPINS = "print('ready', flush=True)\nwhile True:\n    pass\n"
WAITS_ON_A_CHILD = ("import subprocess, sys\n"
                    f"child = subprocess.Popen([sys.executable, '-c', {SPINS!r}], stdout=subprocess.PIPE)\n"
                    "child.stdout.readline()\n"
                    "print(child.pid, flush=True)\n"
                    "child.wait()\n")
REAPS_A_CHILD = ("import subprocess, sys, time\n"
                 "print('ready', flush=True)\n"
                 "sys.stdin.readline()\n"
                 "subprocess.run([sys.executable, '-c', 'import time\\nend = time.time() + 0.3\\n"
                 "while time.time() < end:\\n    pass\\n'])\n"
                 "print('reaped', flush=True)\n"
                 "time.sleep(600)\n")

Start = Callable[..., "tuple[subprocess.Popen[str], str]"]


@pytest.fixture()
def start() -> Iterator[Start]:
    """Starts ``python -c CODE ARGS...`` in its own session and returns it with the first line
    it printed. After the test every process of those sessions is killed (``killpg``) and
    asserted gone."""
    procs: list[subprocess.Popen[str]] = []

    def start_(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        assert proc.stdout is not None
        return proc, proc.stdout.readline().strip()

    try:
        yield start_
    finally:
        sessions = sessions_now()
        seen = [pid for proc in procs
                for pid in {proc.pid, *(pid for pid, _ in sessions.get(proc.pid, ()))}]
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate(timeout=10)
        wait_for(lambda: not any(alive(pid) for pid in seen), "the test's processes to end",
                 timeout=10)


def reading(pid: int) -> Reading:
    read = read_rank(pid, sessions_now())
    assert read is not None, f"process {pid} could not be read"
    return read


def two_readings(pid: int, apart: float = 0.3) -> tuple[Reading, Reading]:
    time.sleep(0.1)  # past the line it printed, into what it does next
    first = reading(pid)
    time.sleep(apart)
    return first, reading(pid)


def test_a_reading_says_what_advanced() -> None:
    before = Reading(runtime=10, children=5, bytes_read=100, bytes_written=200)
    assert before.moved(before) == ()
    assert Reading(11, 5, 100, 200).moved(before) == ("cpu",)
    assert Reading(10, 5, 101, 200).moved(before) == ("io",)
    assert Reading(10, 5, 100, 201).moved(before) == ("io",)
    assert Reading(10, 6, 100, 200).moved(before) == ("children",)
    assert Reading(11, 6, 101, 201).moved(before) == ("cpu", "io", "children")
    assert Reading(9, 4, 99, 199).moved(before) == (), "only what advanced"


def test_a_sleeping_process_reads_the_same_twice(start: Start) -> None:
    proc, _ = start(SLEEPS)
    first, second = two_readings(proc.pid)
    assert second == first and second.moved(first) == ()


def test_a_process_writing_a_file_moves_its_io(start: Start, tmp_path: Path) -> None:
    proc, _ = start(WRITES, str(tmp_path / "a 'file' being written"))
    first, second = two_readings(proc.pid)
    assert "io" in second.moved(first)
    assert second.bytes_written - first.bytes_written >= 10 * 4096


def test_a_spinning_process_moves_its_cpu(start: Start) -> None:
    proc, _ = start(SPINS)
    first, second = two_readings(proc.pid)
    assert second.moved(first) == ("cpu",)
    assert second.runtime - first.runtime >= 100_000_000, "nanoseconds of the main thread"


def test_a_rank_waiting_on_a_child_in_its_session_moves_its_children(start: Start) -> None:
    """A rank that waits on a process it started (``tar``, ``cp``, a data loader's worker): its
    own main thread and I/O are still, the child in its session runs."""
    proc, child = start(WAITS_ON_A_CHILD)
    assert int(child) in [pid for pid, _ in sessions_now()[proc.pid]]
    first, second = two_readings(proc.pid)
    assert second.moved(first) == ("children",)
    assert second.children - first.children >= 100_000_000
    alone = read_rank(proc.pid, {})
    assert alone is not None and alone.children < second.children, \
        "the processes of its session are what count"


def test_a_child_the_rank_reaped_still_counts(start: Start) -> None:
    proc, _ = start(REAPS_A_CHILD)
    first = reading(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "reaped"
    second = reading(proc.pid)
    assert "children" in second.moved(first)
    assert second.children - first.children >= 100_000_000


def test_a_process_gone_cannot_be_read(start: Start) -> None:
    proc, _ = start(SLEEPS)
    proc.kill()
    proc.wait(timeout=10)
    assert read_rank(proc.pid, sessions_now()) is None


def test_the_watch_reads_quiet_ranks_outside_a_call_and_forgets_rested_ones(start: Start) -> None:
    """One spinning process stands for four ranks: rank 0 quiet outside a call (read), rank 1
    inside a call (progress alone tells), rank 2 that just made progress, rank 3 whose script
    ended. Only rank 0 gives ``alive`` events; a reading is compared with the previous one of
    the same quiet spell only: not across progress, nor across a stack dump (``rested``)."""
    proc, _ = start(SPINS)
    records = {rank: RankRecord() for rank in range(4)}
    for rank, record in records.items():
        record.observe(Event(contract.EVENT_INITIALISED, rank), 100.0)

    def progress(rank: int, at: float, busy: bool = False) -> None:
        count = records[rank].count + (0 if busy else 1)
        records[rank].observe(Event(contract.EVENT_PROGRESS, rank, count=count, busy=busy,
                                    loads=0), at)

    progress(1, 150.0, busy=True)
    exiting = Event.parse({"event": contract.EVENT_EXITING, "rank": 3, "clean": True})
    assert exiting is not None
    records[3].observe(exiting, 150.0)
    watch = LifeWatch(records, "node a")
    pids = {rank: proc.pid for rank in records}

    def read(at: float) -> list[Event]:
        progress(2, at)  # rank 2 steps on
        return watch.read(pids, at)

    now = 200.0
    assert read(now) == [], "a first reading: nothing to compare it with"
    time.sleep(0.2)
    assert read(now + INTERVAL / 2) == [], f"at most every {INTERVAL:g} s"
    told = read(now + INTERVAL)
    assert [(e.kind, e.rank, e.host, e.how, e.bytes_written, e.bytes_read) for e in told] == [
        (contract.EVENT_ALIVE, 0, "node a", "cpu", 0, 0)]
    watch.rested({0: proc.pid})  # its stacks were just dumped: that ran it
    time.sleep(0.2)
    assert read(now + 2 * INTERVAL) == [], "read afresh after a stack dump"
    time.sleep(0.2)
    assert [e.rank for e in read(now + 3 * INTERVAL)] == [0]
    progress(0, now + 3.5 * INTERVAL)
    assert read(now + 4 * INTERVAL) == [], f"progress less than {INTERVAL:g} s ago"
    at = now + 3.5 * INTERVAL + INTERVAL + INTERVAL
    assert read(at) == [], "a new quiet spell: its first reading"
    time.sleep(0.2)
    assert [e.rank for e in read(at + INTERVAL)] == [0]
