"""The one watch loop: start a node's processes, watch them until the job ends, stop them all.

A ``Watched`` source says what is watched: ``supervisor.LocalRanks`` (this node's ranks and
MindSpore's scheduler) or ``cluster.NodeAgents`` (one agent per host, or one srun/mpirun for
all). The loop owns what both share: the stop signals (SIGINT/SIGTERM/SIGHUP), the tick, the
hang check of the job's events (``tick``, which also redraws the display), the success and
interrupt messages, and closing the process group in a ``finally``. Each source says when its
processes ended the job, and how (the root cause).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Callable, Optional, Protocol

from launcher.hangs.stalls import HANG_EXIT_CODE, Stall, describe_stall
from launcher.plan.launch_plan import LaunchPlan
from launcher.run.failures import Cause, JobResult, Outcome, stall_cause
from launcher.run.process import Exit, ProcessGroup
from parallel import contract
from parallel.checkpoints.manifest import atomic_write_bytes
from parallel.contract import Event

_TICK = 0.02
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Reporter(Protocol):
    """Where a watched node's news goes: node 0's monitor, or an agent's control lines."""

    def event(self, event: Event) -> None:
        """A rank's event, or its supervisor's ``exited``."""

    def ranks_done(self, node_rank: int) -> None:
        """Every rank of this node exited 0."""

    def tick(self) -> Optional[Stall]:
        """Called every tick: redraw, and say whether a rank fell behind the others."""

    def exits_overdue(self) -> bool:
        """Called every tick: whether the job is over but for ranks that stay in their exit
        handlers past ``--exit-timeout`` (node 0 alone knows every rank's end)."""


class StopHook(Protocol):
    """What a stop signal does before the processes are stopped (``attempt.StopRequest``)."""

    def __call__(self, signum: int) -> float:
        """The seconds the ranks get to save a checkpoint and exit on their own (0: none)."""

    def ranks_stopped(self) -> bool:
        """Every rank exited: nothing to wait for."""


class FaultHook(Protocol):
    """What a failed or hung job does before any process is stopped (``last_words``)."""

    def __call__(self, group: ProcessGroup, stall: Optional[Stall]) -> None:
        """Bounded: a few seconds at most."""


class _NoSave:
    def __call__(self, signum: int) -> float:
        return 0.0

    def ranks_stopped(self) -> bool:
        return False


class Watched(Protocol):
    """The processes one watch loop supervises."""

    def start(self, group: ProcessGroup, wake: threading.Event) -> None:
        """Start every process; ``wake`` (settable from any thread) cuts a tick short."""

    def check(self, group: ProcessGroup, exits: list[Exit]) -> Optional[Outcome]:
        """After each poll (``exits``: processes that ended since the last): the job's outcome
        once it is decided, else None."""

    def before_close(self, group: ProcessGroup, outcome: Outcome) -> None:
        """The job ends with ``outcome``: gather what its account needs while processes live."""

    def after_close(self, exits: list[Exit]) -> None:
        """Every process is gone (``exits``: those ``close`` stopped)."""

    def conclude(self, outcome: Outcome) -> JobResult:
        """The result of a job that failed (``FAILED`` or ``STARTUP_TIMEOUT``)."""

    def finished(self, elapsed: float) -> str:
        """The line for a job that succeeded."""

    @property
    def everything(self) -> str:
        """What an interrupt ended: ``every process``, ``every node's processes``."""


class Watch:
    """Runs one ``Watched`` source to its end and returns one ``JobResult``."""

    def __init__(self, plan: LaunchPlan, source: Watched, group: ProcessGroup,
                 tick: Callable[[], Optional[Stall]] = lambda: None,
                 interval: float = _TICK, on_stop: Optional[StopHook] = None,
                 on_fault: Optional[FaultHook] = None,
                 exits_overdue: Callable[[], bool] = lambda: False) -> None:
        self._plan = plan
        self._source = source
        self._group = group
        self._tick = tick
        self._exits_overdue = exits_overdue
        """Whether the job is over but for ranks stuck in their exit handlers: it succeeded,
        and closing the group stops them (``Reporter.exits_overdue``)."""
        self._interval = interval
        """Seconds between two checks at most (a stop signal or the source's ``wake`` cuts one
        short)."""
        self._signal: Optional[int] = None
        self.stop_requested_at: Optional[float] = None
        """When the first stop request (a signal, or node 0's order) came (``time.time()``)."""
        self._on_stop: StopHook = on_stop or _NoSave()
        """Called once on a stop signal: the seconds the ranks get to save and exit on their
        own (0: stop them now)."""
        self._stop_by: Optional[float] = None
        self._on_fault = on_fault
        self._wake = threading.Event()
        self._stall: Optional[Stall] = None

    def run(self) -> JobResult:
        started = time.time()
        previous = self._install_signal_handlers()
        signum = HeldStopSignals.take_from(previous)  # one that came before this loop began
        if signum is not None:
            self._note_stop(signum)
        try:
            self._source.start(self._group, self._wake)
            outcome = self._loop()
            if self._on_fault is not None and outcome in (Outcome.FAILED, Outcome.STALLED):
                self._on_fault(self._group, self._stall)
            self._source.before_close(self._group, outcome)
        finally:
            _no_save(self._plan.log_dir)
            closed = self._group.close(self._plan.timeouts.kill)
            restore_signal_handlers(previous)
        self._source.after_close(closed)
        return self._result(outcome, time.time() - started)

    def request_stop(self, signum: int) -> None:
        """Stop the job as if ``signum`` had reached the launcher (any thread may call this)."""
        self._note_stop(signum)
        self._wake.set()

    def _note_stop(self, signum: int) -> None:
        if self._signal is None:
            self.stop_requested_at = time.time()
            self._signal = signum
        else:  # a second signal: stop now, saved or not
            self._stop_by = 0.0

    def _loop(self) -> Outcome:
        while True:
            if self._signal is not None and self._stopping():
                return Outcome.INTERRUPTED
            outcome = self._source.check(self._group, self._group.poll())
            if outcome is not None:
                return Outcome.INTERRUPTED if self._signal is not None else outcome
            self._stall = self._tick()
            if self._stall is not None:
                return Outcome.STALLED
            if self._exits_overdue():
                return Outcome.SUCCEEDED
            self._wake.wait(self._interval)
            self._wake.clear()

    def _stopping(self) -> bool:
        """Whether to stop the processes now that a stop signal came: at once, or once the time
        the ranks were given to save a checkpoint and exit on their own (``on_stop``) is up."""
        if self._stop_by is None:
            self._stop_by = time.monotonic() + self._on_stop(self._signal or 0)
        return time.monotonic() >= self._stop_by or self._on_stop.ranks_stopped()

    def _result(self, outcome: Outcome, elapsed: float) -> JobResult:
        job, now = self._plan.job_id, time.time()
        if outcome is Outcome.INTERRUPTED:
            name = signal.Signals(self._signal or 0).name
            return JobResult(outcome, 128 + (self._signal or 0),
                             f"npu-launch: job {job} stopped by {name}: "
                             f"{self._source.everything} ended", now, Cause(outcome, signal=name))
        if outcome is Outcome.STALLED and self._stall is not None:
            return JobResult(outcome, HANG_EXIT_CODE, describe_stall(self._stall, job), now,
                             stall_cause(self._stall))
        if outcome is Outcome.SUCCEEDED:
            return JobResult(outcome, 0, self._source.finished(elapsed), now)
        return self._source.conclude(outcome)

    def _install_signal_handlers(self) -> "SignalHandlers":
        previous: SignalHandlers = {}
        for sig in STOP_SIGNALS:
            # Ctrl-C reaches a foreground rank through the terminal: pdb or the script decides.
            foreground_sigint = sig == signal.SIGINT and self._plan.foreground
            previous[sig] = signal.signal(sig, signal.SIG_IGN if foreground_sigint
                                          else self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame: object) -> None:
        # Python runs a handler on the loop's own thread, between two bytecodes: maybe inside
        # the wake event's wait or clear, which hold its lock. That lock is not reentrant:
        # setting the event here would wait for it forever, and nothing would stop the ranks.
        # The loop sees the request within a tick (a wait the signal cut short resumes).
        self._note_stop(signum)


SignalHandlers = dict[signal.Signals, Any]
"""What ``signal.signal`` returned for each signal, to put back when the job ends."""


def _no_save(log_dir: str) -> None:
    """Tell ranks that get a stop signal now that no save comes: they die at once
    (``parallel.hook.preemption``; a save asked for is made or given up by now)."""
    path = os.path.join(log_dir, contract.STOP_REQUEST_FILE)
    try:
        atomic_write_bytes(path, f"{contract.STOP_NO_SAVE}\n".encode())
    except OSError:
        pass


def restore_signal_handlers(previous: SignalHandlers) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class HeldStopSignals:
    """Stop signals held while the restart loop runs but no watch loop does (``launch._attempts``:
    from one attempt's end through the decision and the backoff, and while the next attempt is
    made ready), when by default SIGTERM would kill npu-launch before it writes ``summary.json``
    or says why it stopped. One that came is ``take``n by the loop and acted on, or by the next
    ``Watch`` as it starts (``take_from``), which then stops its attempt at once; one nobody took
    is delivered again as the handlers before are put back, as it would have been."""

    def __init__(self) -> None:
        self._received: list[int] = []
        self._previous: SignalHandlers = {}

    def __enter__(self) -> "HeldStopSignals":
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        restore_signal_handlers(self._previous)
        signum = self.take()
        if signum is not None:
            signal.raise_signal(signal.Signals(signum))

    def pending(self) -> bool:
        """Whether a stop signal came (it stays held)."""
        return bool(self._received)

    def take(self) -> Optional[int]:
        """The first stop signal held (None: none came); every one held is forgotten."""
        received, self._received = self._received, []
        return received[0] if received else None

    def _on_signal(self, signum: int, frame: object) -> None:
        self._received.append(signum)  # no lock here: see ``Watch._on_signal``

    @staticmethod
    def take_from(handlers: "SignalHandlers") -> Optional[int]:
        """What the ``HeldStopSignals`` whose handler is among ``handlers`` (those a watch loop
        replaced as it began) held: the first stop signal, taken; None when there was none."""
        for handler in handlers.values():
            held = getattr(handler, "__self__", None)
            if isinstance(held, HeldStopSignals):
                return held.take()
        return None


def wait_unless_signalled(seconds: float) -> Optional[int]:
    """Wait ``seconds`` (a restart's backoff: nothing runs); the stop signal that cut it short,
    or None."""
    if seconds <= 0:
        return None
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)  # no lock here: see ``Watch._on_signal``

    previous: SignalHandlers = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    deadline = time.monotonic() + seconds
    try:
        while not received and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _TICK))
    finally:
        restore_signal_handlers(previous)
    return received[0] if received else None
