"""Each node's reading of whether a rank that makes no progress is frozen or busy: a rank is
alive while its main thread runs, it reads or writes, or a process it started runs.

Progress events say when a rank steps; between them a rank may be busy alone (rank 0 saving a
checkpoint its own way, evaluating, uploading, running ``tar``) while its peers wait for it in
the next step's collective. What the kernel keeps of the rank's process tells the two apart:

* the main thread's scheduled run time (``/proc/PID/task/PID/schedstat``, in nanoseconds; a
  stack cannot change without it, so it stands for the Python stack too). Only the main
  thread's: the framework's own threads (heartbeats, event loops, the rank hook's reporter) run
  a little whatever the script does;
* the bytes the process read and wrote through ``read``/``write`` calls (``/proc/PID/io``:
  files and pipes, every thread's, and those of the child processes it reaped);
* the CPU time of the processes in the rank's session (each rank leads its own: a ``tar`` or
  ``cp`` it started, a data loader's workers), and the CPU time of the children it reaped.

A socket's ``send``/``recv`` is not counted in ``/proc/PID/io``; the main thread's run time
still moves while an upload goes on. A rank whose main thread waits while another of its
threads works (an upload thread it joins) reads as frozen: see ``docs/guides/hangs.md``.

``LifeWatch`` reads only ranks that made no progress for ``INTERVAL`` seconds and are
outside a framework call (inside one, life is progress alone: a rank waiting in a collective
is not judged by its CPU), at most every ``INTERVAL`` seconds, so a job that steps costs
nothing; what moved becomes an ``alive`` event for node 0 (``contract.EVENT_ALIVE``).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Iterator, Mapping, Optional

from launcher.ranks.record import RankRecord
from parallel import contract
from parallel.contract import Event

INTERVAL = 1.0
"""Seconds between two readings of a quiet rank, and without progress before a rank is read at
all; less under a low ``--hang-floor`` (``every``): a rank is read twice before it is judged."""


_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 10_000_000


@dataclasses.dataclass(frozen=True)
class Reading:
    """What the kernel says of one rank's process at one moment: the main thread's run time and
    the children's CPU time in nanoseconds, and the bytes read and written (the process's and
    its children's)."""

    runtime: int
    children: int
    bytes_read: int
    bytes_written: int

    def moved(self, before: "Reading") -> tuple[str, ...]:
        """What advanced since ``before``: ``cpu``, ``io``, ``children``."""
        how = []
        if self.runtime > before.runtime:
            how.append("cpu")
        if self.bytes_read > before.bytes_read or self.bytes_written > before.bytes_written:
            how.append("io")
        if self.children > before.children:
            how.append("children")
        return tuple(how)


def read_rank(pid: int, sessions: Mapping[int, list[tuple[int, int]]]) -> Optional[Reading]:
    """``pid``'s reading, its session's other processes taken from ``sessions`` (session id ->
    (pid, CPU nanoseconds), ``sessions_now``); None when its ``/proc`` cannot be read."""
    stat = _stat_fields(pid)
    io = _io(pid)
    if stat is None or io is None:
        return None
    children = (int(stat[13]) + int(stat[14])) * _TICK_NS  # the children it reaped
    child_read = child_written = 0
    for child, cpu in sessions.get(pid, ()):
        if child != pid:
            child_io = _io(child) or (0, 0)
            children += cpu
            child_read += child_io[0]
            child_written += child_io[1]
    return Reading(_runtime(pid, stat), children, io[0] + child_read, io[1] + child_written)


def sessions_now() -> dict[int, list[tuple[int, int]]]:
    """Every process on this host, with its CPU time in nanoseconds, by its session id (one
    pass over ``/proc``)."""
    found: dict[int, list[tuple[int, int]]] = {}
    for pid in _pids():
        fields = _stat_fields(pid)
        if fields is not None:
            cpu = (int(fields[11]) + int(fields[12])) * _TICK_NS
            found.setdefault(int(fields[3]), []).append((pid, cpu))
    return found


def _pids() -> Iterator[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def _stat_fields(pid: int) -> Optional[list[str]]:
    """``/proc/PID/stat`` after the command's closing parenthesis: state first (field 3)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def _runtime(pid: int, stat: list[str]) -> int:
    """The main thread's run time in nanoseconds: schedstat's, else its CPU ticks (kernels
    without ``CONFIG_SCHED_INFO``, where the process's ticks stand in)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return (int(stat[11]) + int(stat[12])) * _TICK_NS


def _io(pid: int) -> Optional[tuple[int, int]]:
    """(characters read, characters written) through read/write calls, from ``/proc/PID/io``."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            lines = dict(line.split(b": ", 1) for line in f.read().splitlines() if b": " in line)
        return int(lines[b"rchar"]), int(lines[b"wchar"])
    except (OSError, KeyError, ValueError):
        return None


class LifeWatch:
    """On each node: the ranks here that made no progress for ``every`` seconds and are outside a
    framework call are read every ``every`` seconds (``read``); each that moved since its
    previous reading gives an ``alive`` event. ``rested`` drops the previous readings
    of ranks whose stacks were just dumped (the dump itself runs the main thread and writes)."""

    def __init__(self, records: Mapping[int, RankRecord], host: str,
                 every: float = INTERVAL) -> None:
        self._records = records
        self._host = host
        self._every = every
        self._readings: dict[int, Reading] = {}
        self._next = 0.0

    def read(self, pids: Mapping[int, int], now: float) -> list[Event]:
        """The ``alive`` events of the ranks of ``pids`` (rank -> pid) that moved."""
        if now < self._next:
            return []
        self._next = now + self._every
        quiet = {rank: pid for rank, pid in pids.items() if self._quiet(rank, now)}
        for rank in set(self._readings) - set(quiet):
            del self._readings[rank]  # it stepped meanwhile: its next quiet spell starts afresh
        if not quiet:
            return []
        sessions = sessions_now()
        alive = []
        for rank, pid in sorted(quiet.items()):
            reading = read_rank(pid, sessions)
            before = self._readings.pop(rank, None)
            if reading is None:
                continue
            self._readings[rank] = reading
            how = reading.moved(before) if before is not None else ()
            if how and before is not None:
                alive.append(self._event(rank, how, reading, before))
        return alive

    def rested(self, ranks: Mapping[int, int]) -> None:
        for rank in ranks:
            self._readings.pop(rank, None)

    def _quiet(self, rank: int, now: float) -> bool:
        record = self._records.get(rank)
        return record is not None and record.since is not None and not record.busy \
            and not record.script_ended and now - record.since >= self._every

    def _event(self, rank: int, how: tuple[str, ...], reading: Reading, before: Reading) -> Event:
        record = {"event": contract.EVENT_ALIVE, "rank": rank, "host": self._host,
                  "time": time.time(), "how": ",".join(how),
                  "bytes_written": reading.bytes_written - before.bytes_written,
                  "bytes_read": reading.bytes_read - before.bytes_read}
        return Event.parse(record) or Event(contract.EVENT_ALIVE, rank, self._host, record=record)
