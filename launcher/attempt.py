"""One attempt of the job as node 0 sees it: the ``watch.Reporter`` that carries every rank's
events to the monitor, the checkpoint ledger, the hang check and node 0's copies of the ranks'
stacks. Which ranks initialised, stepped and exited it reads from the ranks' records, folded
once by the monitor (``launcher.ranks.RankRecord``). ``Attempts`` holds what outlives an
attempt: the monitor, the ledger, the hang check."""
from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
from typing import Callable, Mapping, Optional, Sequence, TextIO

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.checkpoints.script_saves import ScriptSaves
from launcher.cluster import control
from launcher.config.frameworks import FrameworkNote
from launcher.files import write_if_changed
from launcher.hangs.stack_samples import StackSample, native_path
from launcher.hangs.stalls import HANG_EXIT_CODE, HangCheck, Stall, describe_stall, stalled_before
from launcher.observe.monitor import JobMonitor
from launcher.plan.launch_plan import LaunchPlan
from launcher.ranks.ranges import runs_text
from launcher.ranks.record import RankRecord
from launcher.run.failures import JobResult, Outcome, stall_cause
from launcher.run.restarts import BEFORE_ANY_PROGRESS, FailurePoint
from parallel import contract
from parallel.checkpoints.manifest import atomic_write_bytes
from parallel.contract import Event


@dataclasses.dataclass(frozen=True)
class Attempts:
    """What outlives one attempt of the job: the monitor, the checkpoint ledger and the hang
    check."""

    monitor: JobMonitor
    ledger: CheckpointLedger
    hangs: Optional[HangCheck] = None
    frameworks: Optional[FrameworkNote] = None
    saves: Optional[ScriptSaves] = None
    """The files the script saved itself, for the next attempt's ``{checkpoint}``."""

    def begin(self, plan: LaunchPlan) -> "Attempt":
        return Attempt(self.monitor, self.hangs, self.ledger, _stack_paths(plan),
                       {s.rank: s.host for s in plan.ranks if s.rank is not None},
                       self.frameworks,
                       0.0 if plan.foreground else plan.timeouts.exit,  # pdb has no clock
                       self.saves)


class Attempt:
    """One attempt of the job, as node 0 sees it (a ``watch.Reporter``): events go to the
    monitor, checkpoint events to the ledger, the script's own saves to ``saves``, stack
    samples to the hang check and to node 0's copy of the rank's stack file; what each rank
    did in this attempt is its record, read from the monitor; ``tick`` redraws the display
    and says whether the job hangs; ``blame`` names a stalled rank as the root cause of a
    failure it caused."""

    def __init__(self, monitor: JobMonitor, hangs: Optional[HangCheck] = None,
                 ledger: Optional[CheckpointLedger] = None,
                 stack_paths: Optional[Mapping[int, str]] = None,
                 ranks: Optional[Mapping[int, str]] = None,
                 frameworks: Optional[FrameworkNote] = None, exit_timeout: float = 0.0,
                 saves: Optional[ScriptSaves] = None) -> None:
        self.monitor = monitor
        self.saves = saves
        self.hangs = hangs
        self.ledger = ledger
        self._stack_paths = stack_paths or {}
        self._frameworks = frameworks
        self._ranks = tuple(ranks or ())
        self._exit_timeout = exit_timeout
        self._next_exit_look = 0.0
        self.log_every = 1
        self.step_times: list[tuple[float, int]] = []
        """(when it arrived, step) of the last few step events, for the pace of steps."""
        monitor.begin_attempt(ranks)
        if hangs is not None:
            hangs.begin_attempt()

    def event(self, event: Event) -> None:
        if event.kind == contract.EVENT_CHECKPOINT and self.ledger is not None:
            self.ledger.record(event)
        elif event.kind == contract.EVENT_SAVED and self.saves is not None:
            self.saves.record(event)
        elif event.kind == contract.EVENT_STACK:
            self._keep_stack(event)
        elif event.kind == contract.EVENT_FRAMEWORK and self._frameworks is not None:
            self._frameworks.see(event)
        elif event.kind == contract.EVENT_STEP and event.step is not None:
            self._stepped(event, event.step)
        self.monitor.on_event(event)

    def ranks_done(self, node_rank: int) -> None:
        pass  # the node's supervisor goes on to its scheduler; the monitor saw every exit

    def tick(self) -> Optional[Stall]:
        self.monitor.tick()
        return self.hangs() if self.hangs is not None else None

    def exits_overdue(self) -> bool:
        """Whether the job is over but for exit handlers that do not return: every rank's script
        ended well ``--exit-timeout`` seconds ago or more, and a rank still runs (MindSpore's
        finalisation waiting on a cluster that is gone, a handler of the script's that never
        returns). npu-launch then stops it, and counts it as exited 0 with a line of its own
        (``monitor.teardown_note``). Looked at twice a second."""
        now = self.monitor.now()
        if self._exit_timeout <= 0 or not self._ranks or now < self._next_exit_look:
            return False
        self._next_exit_look = now + 0.5
        stuck = lingering({rank: self.monitor.record(rank) for rank in self._ranks}, now,
                          self._exit_timeout)
        if stuck:
            self.monitor.stopped_in_exit(stuck, self._exit_timeout)
        return bool(stuck)

    @property
    def exited(self) -> set[int]:
        """The ranks whose process ended in this attempt."""
        return self.monitor.ranks_where(lambda r: r.exited)

    @property
    def saving(self) -> set[int]:
        """The ranks that save a step asked of them on a stop (``saves_on_stop``)."""
        return self.monitor.ranks_where(lambda r: bool(r.saves_on_stop))

    @property
    def savers(self) -> set[int]:
        """The ranks that save last words when asked: the trainer's with a checkpoint folder
        (``saves_on_stop``), not ``Model.train``'s, which save on a stop only."""
        return self.monitor.ranks_where(lambda r: bool(r.saves_on_stop) and r.answers_last_words)

    def all_of(self, plan: LaunchPlan) -> bool:
        """Whether every rank of ``plan`` initialised communication in this attempt."""
        return {spec.rank for spec in plan.ranks} <= self.monitor.ranks_where(lambda r: r.initialised)

    def called_init(self, rank: int) -> bool:
        """Whether ``rank`` called ``init()`` (or finished it) in this attempt."""
        return rank in self.monitor.ranks_where(lambda r: r.calling_init or r.initialised)

    def all_called_init(self, plan: LaunchPlan) -> bool:
        """Whether every rank of ``plan`` called ``init()`` (or finished it) in this attempt."""
        called = self.monitor.ranks_where(lambda r: r.calling_init or r.initialised)
        return {spec.rank for spec in plan.ranks} <= called

    def _stepped(self, event: Event, step: int) -> None:
        every = event.whole("log_every")
        if every is not None and every > 0:
            self.log_every = every
        self.step_times = [*self.step_times[-7:], (time.monotonic(), step)]

    def stop_step(self, ranks: Sequence[int]) -> Optional[int]:
        """The step every rank of ``ranks`` can still reach, when all of them obey a stop
        request (each said ``saves_on_stop``, true or false: one that does not save stops at the
        step too, as a data-parallel script's ranks do when rank 0 alone saves) and one of them
        saves: past the newest step reported, by the steps between two reports and by a
        second's worth of steps (events arrive late), plus one."""
        said = self.monitor.ranks_where(lambda r: r.saves_on_stop is not None)
        if not ranks or not set(ranks) <= said or not self.saving & set(ranks):
            return None
        steps = [r.step for rank in ranks if (r := self.monitor.record(rank)) and r.step is not None]
        (t0, s0), (t1, s1) = self.step_times[0], self.step_times[-1]
        per_second = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
        return max(steps) + self.log_every + math.ceil(per_second) + 1

    def resumed_from(self, plan: LaunchPlan) -> Optional[int]:
        """The complete step this attempt resumed from: the one its plan told the ranks
        (``NPU_LAUNCH_RESUME_STEP``, a restart's); else, once a rank of it loaded a checkpoint,
        the newest an earlier launch into the log directory left complete (the same command
        run again: the trainer's ``resume='auto'`` loads the newest complete checkpoint)."""
        if plan.resume is not None:
            return plan.resume.step
        if self.ledger is None or not self.monitor.ranks_where(lambda r: r.loads > 0):
            return None
        return self.ledger.earlier_step

    def failure_point(self, result: JobResult) -> FailurePoint:
        """Where this attempt failed (its root-cause rank's last step, else its progress
        count, else before any), why, and the newest complete checkpoint now (an earlier
        launch's, until this one completes a step)."""
        rank = result.cause.rank if result.cause else None
        record = self.monitor.record(rank) if rank is not None else None
        where: Optional[tuple[str, int]] = None
        if record is not None and record.step is not None:
            where = ("step", record.step)
        elif record is not None and record.count:
            where = ("count", record.count)
        elif record is not None:
            where = BEFORE_ANY_PROGRESS
        resume = self.ledger.resume_point() if self.ledger is not None else None
        earlier = self.ledger.earlier_step if self.ledger is not None else None
        return FailurePoint.of(result, where, resume.step if resume else earlier)

    def blame(self, result: JobResult) -> JobResult:
        """``result``, or, when its failed rank was waiting on one that had stopped making
        progress (a communication timeout, say), the hang of that one, with the failure told
        as its consequence."""
        cause = result.cause
        if result.outcome is not Outcome.FAILED or cause is None or cause.rank is None \
                or cause.process != "rank":
            return result
        stall = stalled_before(self.monitor.rank_states(), cause.rank, cause.time or time.time())
        if stall is None:
            return result
        if self.hangs is not None:  # the failure came first: say which limit it beat
            limits = self.hangs.limits
            stall = dataclasses.replace(stall, timeout=limits.quiet,
                                        limit=f"{limits.why}, not reached")
        block = describe_stall(stall, self.monitor.job_id)
        consequence = "\n".join("  " + line for line in result.message.splitlines()[:12])
        message = (f"{block}\n  rank {cause.rank}'s failure followed from it (it waited on rank "
                   f"{stall.rank}):\n{consequence}")
        return JobResult(Outcome.STALLED, HANG_EXIT_CODE, message, result.ended_at,
                         stall_cause(stall, consequence=cause))

    def _keep_stack(self, event: Event) -> None:
        """A node's stack sample: for the hang check, and in node 0's log directory (the files
        on the rank's own host, when that is this one, already hold the same)."""
        if self.hangs is not None:
            self.hangs.sample(StackSample.of(event))
        path = self._stack_paths.get(event.rank)
        if path is not None:
            for target, field in ((path, "text"), (native_path(path), "native")):
                text = event.text(field)
                if text:
                    write_if_changed(target, text)


def lingering(records: Mapping[int, Optional[RankRecord]], now: float,
              limit: float) -> tuple[int, ...]:
    """The ranks stuck in their exit handlers: those still running when every rank's script
    ended well (``RankRecord.ended_well``) and the last of them ``limit`` seconds or more before
    ``now``; () while any script runs, failed or is not known to have ended."""
    ended = [r.script_ended_at for r in records.values()
             if r is not None and r.ended_well and r.script_ended_at is not None]
    if not records or len(ended) < len(records) or now - max(ended) < limit:
        return ()
    return tuple(sorted(rank for rank, r in records.items() if r is not None and not r.exited))


def _stack_paths(plan: LaunchPlan) -> dict[int, str]:
    return {spec.rank: spec.stack_path for spec in plan.ranks
            if spec.rank is not None and spec.stack_path}


@dataclasses.dataclass(frozen=True)
class StopRequest:
    """On a stop signal to a job run here: when every rank obeys a stop request and one saves
    (``Attempt.stop_step``), the step they all stop at (and save) goes into the log directory
    (``contract.STOP_REQUEST_FILE``), and they get ``--kill-timeout`` to do it and exit;
    else they are stopped at once, as before. Several nodes: ``send`` gives the step to every
    node agent too (on its stdin: ssh and srun reach every agent, mpirun the first only),
    which writes it into its own host's log directory."""

    plan: LaunchPlan
    attempt: Attempt
    err: Optional[TextIO] = None
    send: Optional[Callable[[bytes], None]] = None

    def __call__(self, signum: int) -> float:
        ranks = [s.rank for s in self.plan.ranks if s.rank is not None]
        step = self.attempt.stop_step(ranks)
        if step is None or self.plan.timeouts.kill <= 0:
            return 0.0
        path = os.path.join(self.plan.log_dir, contract.STOP_REQUEST_FILE)
        try:
            atomic_write_bytes(path, f"{step}\n".encode())
        except OSError:
            if self.send is None:
                return 0.0
        if self.send is not None:
            self.send(control.save_line(step))
        if self.err is not None:
            savers = sorted(self.attempt.saving & set(ranks))
            who = ("every rank saves" if len(savers) == len(ranks) else
                   f"rank {runs_text(savers)} saves" if len(savers) == 1 else
                   f"ranks {runs_text(savers)} save")
            stops = "stops" if len(savers) == len(ranks) else "every rank stops there"
            self.err.write(f"npu-launch: {signal.Signals(signum).name}: {who} step {step} and "
                           f"{stops} (--kill-timeout {self.plan.timeouts.kill:g} s; again to "
                           "stop at once)\n")
            self.err.flush()
        return self.plan.timeouts.kill

    def ranks_stopped(self) -> bool:
        return {s.rank for s in self.plan.ranks if s.rank is not None} <= self.attempt.exited
