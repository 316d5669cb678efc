"""Last words: when a rank of a data-parallel job fails or hangs, one healthy replica saves the
state of the last step it completed before npu-launch stops anything.

npu-launch (node 0) writes ``contract.LAST_WORDS_REQUEST_FILE`` into the log directory:
``<rank> <attempt> <since>``, ``since`` the time (``time.time()``) from which the lost rank can
no longer have completed a step with the others: its hang's start, or the request itself. A
thread of each rank (:class:`Listener`) looks for it every ``POLL`` seconds while the trainer
fits; the rank named answers, the others ignore it. While the main thread is blocked inside the
step's all-reduce (its peer is gone), MindSpore has released the GIL, and the parameters are
those after the last completed step: the optimizer runs after the all-reduce, so a step whose
all-reduce cannot finish changes nothing. MindSpore runs one all-reduce per parameter (or fusion
group), and a peer killed while a step's collectives were in flight may have finished some of
them: the trainer's step (``train_cells.Update``) updates only once all have finished, so such a
step is not applied at all, never in part.

Whether the state is consistent is the trainer's to say, through :class:`Progress`: the steps
begun and completed, and when that last changed. The state is saved only once the main thread
has been quiet (no step begun or completed) for ``SETTLE`` seconds or five times the longest
recent step, whichever is longer, counted from ``since``: a main thread that waited in an
all-reduce before a peer died may still complete that step, the peer having sent its share
before it died, so quiet from before the loss proves nothing. Quiet alone is no proof on a
loaded machine, where a step being applied can go longer than that without a sign: the rank's
other threads must also have used almost no CPU over the quiet (``IDLE``), as a main thread
blocked in an all-reduce does and one applying a step does not. It must still be quiet once the
file is written; otherwise (the step was still being applied) nothing is kept and the answer
says why. The answer is ``contract.LAST_WORDS_REPLY_FILE``: ``saved <step>`` or ``none <why>``,
within ``WAIT`` seconds (npu-launch waits a little longer, then stops the job either way).

Nothing here imports MindSpore: the trainer passes the save.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import threading
import time
from typing import Any, Callable, Optional, Protocol

from parallel import contract
from parallel.checkpoints.manifest import DataPosition, atomic_write_bytes

POLL = 0.02
"""Seconds between two looks for the request (a ``stat``)."""
SETTLE = 0.25
"""The shortest quiet (no step begun or completed) that counts as the main thread blocked."""
QUIET_STEPS = 5
"""The quiet needed is also this many times the longest recent step."""
WAIT = 2.0
"""Seconds a rank asked tries to find a consistent state before it answers ``none``."""
IDLE = 0.1
"""The most CPU, as a share of one core, the rank's other threads may use over the quiet for it
to count: a 2-rank MindSpore job's rank blocked in the all-reduce used 1.3% here, a step being
applied uses what it is given."""


def others_cpu() -> float:
    """CPU seconds used so far by this process's threads but the calling one."""
    return time.process_time() - time.thread_time()


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where the main thread stands, replaced (never mutated) at each step's start and end.

    ``begun`` is the step being run (``done + 1`` inside the optimizer step's call, ``done``
    between steps); ``position`` is the data position after step ``done``; ``at`` when this
    was last replaced (``time.monotonic``); ``longest`` the longest recent step, in seconds;
    ``held`` what the trainer copied of the state at the end of step ``done`` (what the next
    step may change before its all-reduce: BatchNorm statistics, the optimizer's step count)."""

    begun: int
    done: int
    position: DataPosition
    at: float
    longest: float = 0.0
    held: Any = None

    @classmethod
    def start(cls, position: DataPosition) -> "Progress":
        """Before the first step of a fit: ``position`` is the state's (resumed or initial)."""
        return cls(position.global_step, position.global_step, position, time.monotonic())

    def begin(self) -> "Progress":
        """The main thread enters the call that updates the parameters."""
        return dataclasses.replace(self, begun=self.done + 1, at=time.monotonic())

    def complete(self, position: DataPosition, took: Optional[float],
                 held: Any = None) -> "Progress":
        """That call returned: ``position`` is the state's now; ``took`` the step's seconds
        (None for a step that compiled)."""
        longest = self.longest if took is None else max(took, self.longest * 0.9)
        return Progress(position.global_step, position.global_step, position, time.monotonic(),
                        longest, held)

    def quiet_needed(self) -> float:
        return max(SETTLE, QUIET_STEPS * self.longest)


class Saver(Protocol):
    """How the rank's state is written (the trainer's): ``save`` writes this rank's checkpoint
    of ``step`` at ``position`` with the parameters, optimizer state and loss scale as they are
    now, but for what it ``held`` of them at the step's end (``Progress.held``); ``publish``
    reports it (the state was consistent); ``discard`` removes it (it was not)."""

    def save(self, step: int, position: DataPosition, held: Any) -> Any: ...

    def publish(self, saved: Any) -> None: ...

    def discard(self, saved: Any) -> None: ...


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the rank asked says: the step saved, or why none was."""

    step: Optional[int] = None
    why: str = ""

    def line(self) -> str:
        return f"saved {self.step}\n" if self.step is not None else f"none {self.why}\n"


def answer(progress: Callable[[], Progress], saver: Saver, wait: float = WAIT,
           poll: float = POLL, since: Optional[float] = None,
           cpu: Callable[[], float] = others_cpu) -> Answer:
    """Save the last completed step once the main thread has been quiet since ``since``
    (``time.monotonic()``; None: now, when asked) and the rank's other threads idle (``cpu``:
    their CPU seconds so far) over the quiet needed, within ``wait`` seconds."""
    asked = time.monotonic()
    deadline, start = asked + wait, asked if since is None else min(since, asked)
    idle = _Idle(cpu)
    while True:
        seen = progress()
        needed = seen.quiet_needed()
        quiet = time.monotonic() - max(seen.at, start) >= needed
        if idle.over(needed) and quiet:
            if seen.done < 1:
                return Answer(why="no step completed yet")
            saved = saver.save(seen.done, seen.position, seen.held)
            if progress() is seen:
                saver.publish(saved)
                return Answer(step=seen.done)
            saver.discard(saved)  # the main thread moved while the state was read
        if time.monotonic() >= deadline:
            inside = f"inside step {seen.begun}" if seen.begun > seen.done else "between steps"
            why = (f"its threads still used {idle.share:.0%} of a core" if quiet
                   else f"the trainer was still {inside}, not quiet for {needed:.2f} s")
            return Answer(why=f"{why} within {wait:g} s (a step being applied is never saved)")
        time.sleep(poll)


class _Idle:
    """The CPU the rank's other threads used over the latest seconds, from samples taken at
    each look."""

    def __init__(self, cpu: Callable[[], float]) -> None:
        self._cpu = cpu
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        self.share = 0.0
        """The share of one core they used over the last window measured."""

    def over(self, seconds: float) -> bool:
        """Whether samples span ``seconds`` and the threads used at most ``IDLE`` of a core
        over the latest ``seconds`` of them."""
        now, used = time.monotonic(), self._cpu()
        self._samples.append((now, used))
        while len(self._samples) > 1 and self._samples[1][0] <= now - seconds:
            self._samples.popleft()
        then, before = self._samples[0]
        if now - then < seconds:
            return False
        self.share = (used - before) / (now - then)
        return self.share <= IDLE


@dataclasses.dataclass(frozen=True)
class Request:
    """npu-launch's request: the rank that answers, in which attempt, and since when (wall
    clock) the lost rank can no longer have completed a step with the others."""

    rank: int
    attempt: int
    since: float

    @classmethod
    def read(cls, path: str) -> "Optional[Request]":
        """The request in ``path``; None when it is missing, being written or unreadable."""
        try:
            with open(path) as f:
                words = f.read().split()
        except OSError:
            return None
        if len(words) != 3 or not all(w.isdigit() for w in words[:2]):
            return None
        try:
            since = float(words[2])
        except ValueError:
            return None
        if not math.isfinite(since):
            return None
        return cls(int(words[0]), int(words[1]), since)

    def text(self) -> str:
        return f"{self.rank} {self.attempt} {self.since:.3f}\n"

    def since_monotonic(self) -> float:
        """``since`` on ``time.monotonic()``'s clock."""
        return time.monotonic() - max(0.0, time.time() - self.since)


def request_path(log_dir: str) -> str:
    return os.path.join(log_dir, contract.LAST_WORDS_REQUEST_FILE)


def reply_path(log_dir: str) -> str:
    return os.path.join(log_dir, contract.LAST_WORDS_REPLY_FILE)


class Listener:
    """A daemon thread of the rank that waits for the request and, when this rank is asked,
    answers it (``why_not``: the reason this rank can never answer, such as a sliced layout)."""

    def __init__(self, log_dir: str, rank: int, attempt: int, progress: Callable[[], Progress],
                 saver: Saver, why_not: str = "") -> None:
        self._request, self._reply = request_path(log_dir), reply_path(log_dir)
        self._rank, self._attempt = rank, attempt
        self._progress, self._saver = progress, saver
        self._why_not = why_not
        self._stop = threading.Event()
        self.answered = threading.Event()
        self._thread = threading.Thread(target=self._run, name="npu-launch-last-words",
                                        daemon=True)

    @classmethod
    def from_environ(cls, rank: int, progress: Callable[[], Progress], saver: Saver,
                     why_not: str = "") -> "Optional[Listener]":
        """A listener for this rank under npu-launch, None outside it."""
        log_dir = os.environ.get(contract.LOG_DIR)
        if not log_dir:
            return None
        attempt = int(os.environ.get(contract.RESTART, "0") or 0)
        return cls(log_dir, rank, attempt, progress, saver, why_not)

    def start(self) -> "Listener":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def linger(self, seconds: float) -> None:
        """The main thread is leaving on an exception: give a request that may be on its way
        ``seconds`` to arrive, and the answer to one that came the time it takes (the peer
        that broke the collective may be the rank that failed)."""
        deadline = time.monotonic() + seconds
        while not self.answered.is_set():
            asked = self._asked()
            if asked is False or (asked is None and time.monotonic() >= deadline):
                return
            time.sleep(POLL)

    def _asked(self) -> Optional[bool]:
        """True: this rank is asked; False: another is; None: no request (yet)."""
        request = self._read()
        return None if request is None else request.rank == self._rank

    def _read(self) -> Optional[Request]:
        request = Request.read(self._request)
        return request if request is not None and request.attempt == self._attempt else None

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            request = self._read()
            if request is None:
                continue
            if request.rank == self._rank:
                self._answer(request)
            return

    def _answer(self, request: Request) -> None:
        if self._why_not:
            said = Answer(why=self._why_not)
        else:
            try:
                said = answer(self._progress, self._saver, since=request.since_monotonic())
            except Exception as error:  # noqa: BLE001 (the answer says it; the rank goes on)
                said = Answer(why=f"the save failed: {type(error).__name__}: {error}")
        try:
            atomic_write_bytes(self._reply, said.line().encode())
        finally:
            self.answered.set()
