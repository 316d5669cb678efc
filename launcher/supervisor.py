"""Run a plan's processes on this node and watch them until the job ends.

The first rank that exits non-zero or by a signal ends the job; so do ranks that never
initialise within the start-up timeout, and SIGINT/SIGTERM/SIGHUP to the launcher. Whatever the
ending, ``ProcessGroup.close`` runs in a ``finally``.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, TextIO

from parallel import contract
from launcher.config import ConsoleFilter
from launcher.events import EventTail
from launcher.failures import (ErrorReport, Failure, Outcome, describe_failure, describe_stuck,
                               root_cause)
from launcher.output import Console
from launcher.plan import LaunchPlan, ProcessSpec, Role, StartMode
from launcher.process import Exit, ProcessGroup
from launcher.stalls import Stall, StallWatch, culprits, describe_hang, describe_stall, sample_stacks

_TICK = 0.02
_DRAIN_TIMEOUT = 0.5
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclasses.dataclass(frozen=True)
class JobResult:
    """How the job ended: the outcome, the launcher's exit code, the block it prints."""

    outcome: Outcome
    exit_code: int
    root_cause: Optional[Failure]
    message: str
    ended_at: float


@dataclasses.dataclass(frozen=True)
class SupervisorSettings:
    kill_timeout: float
    startup_timeout: float
    console: ConsoleFilter
    hang_timeout: float = 0.0

    @classmethod
    def of(cls, plan: LaunchPlan, console: ConsoleFilter) -> "SupervisorSettings":
        """The plan's timeouts, and which ranks this node's console shows."""
        t = plan.timeouts
        return cls(t.kill, t.startup, console, t.hang)


class Supervisor:
    """Starts ``plan.on_node(node_rank)`` and watches it. ``run`` returns once all are gone."""

    def __init__(self, plan: LaunchPlan, settings: SupervisorSettings,
                 base_env: Mapping[str, str], node_rank: int = 0,
                 console_stream: Optional[Console] = None,
                 on_event: Optional[Callable[[dict], None]] = None,
                 stall_check: Optional[Callable[[], Optional[Stall]]] = None) -> None:
        """``on_event`` gets every rank event, plus ``rank-exited`` and ``node-ranks-done``;
        ``stall_check`` (``stalls.FallingBehind``, also the display's tick) may name a rank that
        fell behind the others."""
        self._plan = plan
        self._settings = settings
        self._base_env = base_env
        self._specs = plan.on_node(node_rank)
        self._node_rank = node_rank
        self._console = console_stream or Console(sys.stdout.buffer)
        self._on_event = on_event
        self._tails = {s.rank: EventTail(s.events_path) for s in self._specs if s.rank is not None}
        self._initialised: set[int] = set()
        self._in_init: set[int] = set()
        self._signal: Optional[int] = None
        self._wake = threading.Event()
        self._finish = threading.Event()
        self._ranks_done_sent = False
        self._stall_check = stall_check
        self._stalls = StallWatch(settings.hang_timeout) if settings.hang_timeout > 0 else None
        self._main_threads: dict[int, str] = {}
        self._stall_message = ""
        self._by_rank = {s.rank: s for s in self._specs if s.rank is not None}

    def run(self) -> JobResult:
        started = time.time()
        group = ProcessGroup(self._plan.token, self._base_env, self._plan.workdir,
                             self._node_rank)
        previous = self._install_signal_handlers()
        try:
            self._start_all(group)
            outcome, ended, failures = self._watch(group, started)
            for failure in failures:
                group.drain(failure.spec.label, _DRAIN_TIMEOUT)
            stuck = self._stuck_ranks(group)
        finally:
            ended_at_close = group.close(self._settings.kill_timeout)
            restore_signal_handlers(previous)
            self._read_events()
            for tail in self._tails.values():
                tail.close()
        self._report_exits(ended_at_close)
        return self._result(outcome, failures, stuck, started)

    def _start_all(self, group: ProcessGroup) -> None:
        for spec in self._specs:
            _remove_stale(spec)
            if spec.rank is not None and self._plan.foreground:
                group.start_foreground(spec)
            else:
                show = spec.rank is not None and self._settings.console.shows(spec.rank)
                group.start(spec, self._console.sink(spec.label) if show else None)

    def _watch(self, group: ProcessGroup,
               started: float) -> tuple[Outcome, list[Exit], list[Failure]]:
        ranks = {s.label for s in self._specs if s.rank is not None}
        deadline = self._startup_deadline(started)
        ended: list[Exit] = []
        while True:
            if self._signal is not None:
                return Outcome.INTERRUPTED, ended, []
            new = group.poll()
            ended += new
            self._read_events()
            self._report_exits(new)
            failures = [Failure.from_exit(e) for e in new if not e.ok] + _reported(group)
            if failures:
                return Outcome.FAILED, ended, failures
            if self._stalled(group):
                return Outcome.STALLED, ended, []
            if ranks <= {e.spec.label for e in ended}:
                self._announce_ranks_done()
                if self._scheduler_done(group):
                    return Outcome.SUCCEEDED, ended, []
            if deadline is not None and time.time() > deadline and self._stuck_ranks(group):
                return Outcome.STARTUP_TIMEOUT, ended, []
            self._wake.wait(_TICK)
            self._wake.clear()

    def _report_exits(self, exits: list[Exit]) -> None:
        for exit_ in exits:
            if exit_.spec.rank is not None:
                self._emit({"event": contract.EVENT_RANK_EXITED, "rank": exit_.spec.rank,
                            "host": exit_.spec.host, "returncode": exit_.returncode,
                            "time": exit_.time})

    def _emit(self, event: dict) -> None:
        if self._on_event is not None:
            self._on_event(event)

    def _stalled(self, group: ProcessGroup) -> bool:
        """A rank the monitor saw fall behind, or, once all are silent, the one whose stack is
        outside MindSpore (with other nodes, silence everywhere is left to the node that has
        such a rank for one more timeout)."""
        if self._stall_check is not None:
            stall = self._stall_check()
            if stall is not None:
                self._stall_message = describe_stall(stall, self._plan.job_id)
                return True
        if self._stalls is None:
            return False
        now = time.time()
        running = {s.rank: group.pids[s.label] for s in group.running() if s.rank is not None}
        if not self._stalls.due(sorted(running), now):
            return False
        stacks = {r: self._by_rank[r].stack_path for r in running}
        samples = sample_stacks(running, stacks, self._main_threads)
        guilty = culprits(samples)
        silent = now - self._stalls.last_progress()
        if not guilty and self._plan.nnodes > 1 and silent < 2 * self._stalls.timeout:
            return False
        self._stall_message = describe_hang(self._plan.job_id, samples, guilty, silent,
                                            self._stalls.timeout, self._by_rank)
        return True

    def _announce_ranks_done(self) -> None:
        if not self._ranks_done_sent:
            self._ranks_done_sent = True
            self._emit({"event": contract.EVENT_NODE_DONE, "node_rank": self._node_rank,
                        "time": time.time()})

    def _scheduler_done(self, group: ProcessGroup) -> bool:
        """Whether the job is over for this node once its ranks are done. With other nodes,
        their ranks may still need the scheduler: it exits by itself once every rank has left
        the cluster, or node 0 says every node is done (``finish``)."""
        if self._plan.nnodes == 1 or self._finish.is_set():
            return True
        return not any(spec.role is Role.SCHEDULER for spec in group.running())

    def finish(self) -> None:
        """Node 0 says every node's ranks are done: the scheduler is no longer needed."""
        self._finish.set()
        self._wake.set()

    def _startup_deadline(self, started: float) -> Optional[float]:
        if self._plan.mode is StartMode.SINGLE or self._plan.foreground:
            return None  # nobody sits at a pdb prompt against a clock
        timeout = self._settings.startup_timeout
        return started + timeout if timeout > 0 else None

    def _stuck_ranks(self, group: ProcessGroup) -> list[ProcessSpec]:
        return sorted((s for s in group.running()
                       if s.rank is not None and s.rank not in self._initialised),
                      key=lambda s: s.rank or 0)  # every spec here has a rank

    def _read_events(self) -> None:
        for rank, tail in self._tails.items():
            for event in tail.read():
                kind = event.get("event")
                if kind == contract.EVENT_STARTED and event.get("main_thread"):
                    self._main_threads[rank] = str(event["main_thread"])
                elif kind == contract.EVENT_STEP and self._stalls is not None:
                    self._stalls.progress(rank, time.time())
                elif kind == contract.EVENT_INIT_STARTED:
                    self._in_init.add(rank)
                elif kind == contract.EVENT_INITIALISED:
                    self._initialised.add(rank)
                self._emit(event)

    def _result(self, outcome: Outcome, failures: list[Failure], stuck: list[ProcessSpec],
                started: float) -> JobResult:
        job = self._plan.job_id
        cause = root_cause(failures)
        if cause is not None:
            code, message = cause.exit_code, describe_failure(cause, job)
        elif outcome is Outcome.STARTUP_TIMEOUT:
            code = 1
            message = describe_stuck(stuck, self._in_init, job, self._settings.startup_timeout)
        elif outcome is Outcome.STALLED:
            code, message = 1, self._stall_message
        elif outcome is Outcome.INTERRUPTED:
            code = 128 + (self._signal or 0)
            message = (f"npu-launch: job {job} stopped by "
                       f"{signal.Signals(self._signal or 0).name}: every process ended")
        else:
            code = 0
            message = (f"npu-launch: job {job} finished: {len(self._tails)} rank(s) exited 0 "
                       f"in {time.time() - started:.1f} s; logs in {self._plan.log_dir}")
        return JobResult(outcome, code, cause, message, time.time())

    def _install_signal_handlers(self) -> "SignalHandlers":
        previous: SignalHandlers = {}
        for sig in STOP_SIGNALS:
            # Ctrl-C reaches a foreground rank through the terminal: pdb or the script decides.
            foreground_sigint = sig == signal.SIGINT and self._plan.foreground
            previous[sig] = signal.signal(sig, signal.SIG_IGN if foreground_sigint
                                          else self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame: object) -> None:
        self.request_stop(signum)

    def request_stop(self, signum: int) -> None:
        """Stop the job as if ``signum`` had reached the launcher (any thread may call this)."""
        if self._signal is None:
            self._signal = signum
        self._wake.set()


def _remove_stale(spec: ProcessSpec) -> None:
    """Reports of an earlier attempt of this job (a restart) must not end this one."""
    for path in (spec.events_path, spec.error_path, spec.stack_path):
        if path and os.path.exists(path):
            os.remove(path)


def _reported(group: ProcessGroup) -> list[Failure]:
    """Running ranks that already reported an uncaught exception: they are on their way out,
    and the job need not wait the second MindSpore takes to finalise them."""
    failures = []
    for spec in group.running():
        if spec.error_path and os.path.exists(spec.error_path):
            report = ErrorReport.read(spec.error_path)
            if report is not None:
                failures.append(Failure.from_report(spec, group.pids[spec.label], report))
    return failures


SignalHandlers = dict[signal.Signals, Any]
"""What ``signal.signal`` returned for each signal, to put back when the job ends."""


def restore_signal_handlers(previous: SignalHandlers) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def print_message(result: JobResult, stream: TextIO) -> None:
    if result.message:
        stream.write(result.message + "\n")
        stream.flush()
