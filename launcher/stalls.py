"""Hang detection, all of it: which rank stopped making progress, and where it is stuck.

Two checks, one module. ``FallingBehind`` reads the job's events (the monitor's rank states,
every rank of every node on node 0): a rank silent for ``--hang-timeout`` while others step on
is a ``Stall``. ``StallWatch`` runs in each node's supervisor for the case where nobody steps:
a rank makes progress when it reports a step. Once every running rank of this node has been
silent for ``--hang-timeout`` (after the first step of the job), the launcher asks each one for
its Python stack (the rank hook registered ``faulthandler`` on SIGUSR1): in synchronous data
parallelism the healthy ranks wait inside MindSpore's collectives, so a rank whose main thread
is anywhere else (user code, a sleep, a data loader) is the one that hangs.

``FallingBehind``: a rank is stalled once it made no progress (no step event; before its first
one, its ``initialised`` event) for longer than the timeout while some other rank stepped
within that window. Times are the monitor's clock when a record arrived, not the rank's own
``time``, so clock skew between hosts cannot fake or hide a stall. Nothing is flagged
before any rank has stepped: start-up belongs to the supervisor's start-up timeout. The check
runs at most every 0.5 s; summary.json records the first stall seen. In synchronous data
parallelism the others block in the next collective soon after one rank hangs, so this names a
rank only when the others still advance for a while (looser coupling, or a timeout shorter
than the gap); when every rank goes quiet nothing is flagged, by design (an evaluation looks
the same). A restarted job is judged afresh (``begin_attempt`` here and in the monitor).
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import time
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_MINDSPORE = os.sep + "mindspore" + os.sep
_DUMP_WAIT = 0.5
_BEHIND_CHECK_INTERVAL = 0.5


@dataclasses.dataclass(frozen=True)
class Stall:
    """A hang, as either check finds it: the rank that stopped making progress (None when every
    rank went silent and none stands out), since when, and where the ranks are when their
    stacks were read. ``others_advanced``: found by ``FallingBehind`` (the others stepped on);
    else by ``StallWatch`` (this node's ranks all silent), with ``waiting`` the ranks waiting
    inside MindSpore, ``also`` any further rank stuck outside it."""

    rank: Optional[int]
    host: str
    last_step: Optional[int]
    silent_for: float
    others_advanced: bool = True
    timeout: float = 0.0
    also: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    stacks: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """(rank, frames, most recent call first) of the ranks the block shows."""


def describe_stall(stall: Stall, job_id: str) -> str:
    """The block printed when the job is stopped because of ``stall``."""
    if stall.others_advanced:
        where = (f"at step {stall.last_step}" if stall.last_step is not None
                 else "before its first step")
        return (f"npu-launch: job {job_id} stopped: rank {stall.rank} on {stall.host} stalled "
                f"{where}: no progress for {stall.silent_for:.0f} s while other ranks advanced")
    window = f"{stall.silent_for:.0f} s (--hang-timeout {stall.timeout:g})"
    if stall.rank is None:
        head = f"npu-launch: job {job_id} stopped: no rank made progress for {window}"
    else:
        names = ", ".join(f"rank {r} on {stall.host}" for r in (stall.rank, *stall.also))
        head = (f"npu-launch: job {job_id} stopped: {names} hangs: no step for {window} while "
                f"rank(s) {', '.join(map(str, stall.waiting))} wait in MindSpore")
    lines = [head]
    for rank, frames in stall.stacks:
        lines.append(f"  rank {rank} is at (most recent call first):")
        lines += [f"    {frame}" for frame in frames[:6]] or ["    (no stack)"]
    return "\n".join(lines)


class Progress(Protocol):
    """What the stall check reads of a rank (the monitor's ``RankState``)."""

    rank: int
    host: str
    step: Optional[int]
    stepped_at: Optional[float]
    progress_at: Optional[float]

    @property
    def done(self) -> bool: ...


def find_stall(ranks: Iterable[Progress], now: float, timeout: float) -> Optional[Stall]:
    """The rank silent longest beyond ``timeout`` while another stepped within it, if any."""
    states = list(ranks)
    recent = {s.rank for s in states if s.stepped_at is not None and now - s.stepped_at <= timeout}
    silent = [(s.progress_at, s.rank, s) for s in states if not s.done and s.progress_at is not None
              and now - s.progress_at > timeout and recent - {s.rank}]
    if not silent:
        return None
    since, _, worst = min(silent, key=lambda item: item[:2])
    return Stall(worst.rank, worst.host, worst.step, now - since, timeout=timeout)


class FallingBehind:
    """``find_stall`` over the job's rank states every half second; ``first`` is the first
    stall seen (``summary.json`` keeps it). ``begin_attempt`` forgets the last attempt's stall
    (the monitor forgets its progress: ``JobMonitor.begin_attempt``)."""

    def __init__(self, states: Callable[[], Iterable[Progress]], timeout: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._states = states
        self._timeout = timeout
        self._clock = clock
        self._next_check = 0.0
        self._stall: Optional[Stall] = None
        self.first: Optional[Stall] = None

    def begin_attempt(self) -> None:
        self._stall, self._next_check = None, 0.0

    def __call__(self) -> Optional[Stall]:
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + _BEHIND_CHECK_INTERVAL
            self._stall = find_stall(self._states(), now, self._timeout)
            self.first = self.first or self._stall
        return self._stall


@dataclasses.dataclass(frozen=True)
class StackSample:
    """A rank's main-thread stack, most recent call first, as ``file:line in func``."""

    rank: int
    frames: tuple[str, ...]

    @property
    def top(self) -> str:
        return self.frames[0] if self.frames else "(no Python frame)"

    @property
    def in_mindspore(self) -> bool:
        return bool(self.frames) and _MINDSPORE in self.frames[0]


class StallWatch:
    """When each local rank last made progress (the launcher's clock, not the rank's)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._last: dict[int, float] = {}
        self._next_check = 0.0

    def progress(self, rank: int, now: float) -> None:
        self._last[rank] = now

    def due(self, running: Sequence[int], now: float) -> bool:
        """All running ranks silent longer than the timeout (once a step was seen), and not
        asked already in the last half timeout."""
        if not self._last or not running or now < self._next_check:
            return False
        last = max(self._last.get(r, 0.0) for r in running)
        if now - last < self.timeout:
            return False
        self._next_check = now + self.timeout / 2
        return True

    def last_progress(self) -> float:
        return max(self._last.values(), default=0.0)

    def check(self, running: Mapping[int, int], stack_files: Mapping[int, str],
              main_threads: Mapping[int, str], host: str, alone: bool) -> Optional[Stall]:
        """Once every running rank here (rank -> pid) is silent, read their stacks and say who
        hangs. With other nodes (not ``alone``), silence without a culprit here is left for one
        more timeout to the node that has one."""
        now = time.time()
        if not self.due(sorted(running), now):
            return None
        samples = sample_stacks(running, stack_files, main_threads)
        stall = hang_of(samples, now - self.last_progress(), self.timeout, host)
        if stall.rank is None and not alone and stall.silent_for < 2 * self.timeout:
            return None
        return stall


def sample_stacks(pids: Mapping[int, int], stack_files: Mapping[int, str],
                  main_threads: Mapping[int, str]) -> dict[int, StackSample]:
    """Ask each rank (rank -> pid) for its stack and read its main thread's frames."""
    for rank, path in stack_files.items():
        try:
            open(path, "w").close()
            os.kill(pids[rank], signal.SIGUSR1)
        except (OSError, KeyError):
            continue
    time.sleep(_DUMP_WAIT)
    return {rank: StackSample(rank, _main_frames(path, main_threads.get(rank, "")))
            for rank, path in stack_files.items()}


def _main_frames(path: str, main_thread: str) -> tuple[str, ...]:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return ()
    frames: dict[str, list[str]] = {}
    current = ""
    for line in lines:
        thread = _THREAD.match(line)
        if thread:
            current = thread.group(1)
            frames[current] = []
        elif current and (frame := _FRAME.match(line)):
            frames[current].append(f"{frame['file']}:{frame['line']} in {frame['func']}")
    return tuple(frames.get(main_thread) or next(iter(frames.values()), []))


def culprits(samples: Mapping[int, StackSample]) -> list[int]:
    """The ranks stuck outside MindSpore while others wait inside it."""
    outside = [r for r, s in samples.items() if s.frames and not s.in_mindspore]
    inside = [r for r, s in samples.items() if s.in_mindspore]
    return sorted(outside) if outside and inside else []


def hang_of(samples: Mapping[int, StackSample], silent: float, timeout: float,
            host: str) -> Stall:
    """The ``Stall`` this node's stack samples show: the culprits, or nobody."""
    guilty = culprits(samples)
    shown = guilty if guilty else sorted(samples)
    return Stall(rank=guilty[0] if guilty else None, host=host, last_step=None,
                 silent_for=silent, others_advanced=False, timeout=timeout,
                 also=tuple(guilty[1:]),
                 waiting=tuple(sorted(r for r, s in samples.items() if s.in_mindspore)),
                 stacks=tuple((r, samples[r].frames) for r in shown[:4]))
