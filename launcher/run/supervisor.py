"""This node's ranks, as the watch loop (``launcher.run.watch``) supervises them.

MindSpore's scheduler (dynamic-cluster mode, on the first host) starts only once a rank of its
host begins importing MindSpore (the rank hook's ``framework`` event), in parallel with the
rank's own import: a job whose ranks never import MindSpore (torch, plain Python) runs no
MindSpore process and leaves ``MASTER_PORT`` free for its rank 0 to listen on, as under torchrun.

The first rank that exits non-zero or by a signal, or reports an uncaught exception, ends the
job; so do ranks that never initialise within the start-up timeout (their stacks are read first,
to show where they are stuck). A quiet rank's process is read for signs of life
(``liveness.LifeWatch``: ``alive`` events); once every rank here is frozen past its limit
(``stack_samples.StallWatch``), their stacks are sent as ``stack`` events: node 0 judges the
hang over every node's ranks (``stalls.HangCheck``). The loop handles signals and closing.
"""
from __future__ import annotations

import os
import re
import threading
import time
from typing import Callable, Mapping, Optional, TextIO

from launcher.config.launch_config import ConsoleFilter
from launcher.files import remove
from launcher.hangs.hang_limits import Limits
from launcher.hangs.node_watch import NodeWatch
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec, Role, StartMode
from launcher.ranks.record import RankRecord
from launcher.run import hookless
from launcher.run.events import EventTail
from launcher.run.failures import (
    Cause,
    ErrorReport,
    Failure,
    JobResult,
    Outcome,
    describe_failure,
    describe_stuck,
    root_cause,
)
from launcher.run.output import Console, LineSink, mark_attempt
from launcher.run.process import Exit, ProcessGroup
from launcher.run.spares import Spares
from launcher.run.watch import FaultHook, Reporter, StopHook, Watch
from parallel import contract
from parallel.contract import Event

_DRAIN_TIMEOUT = 0.5
_SPARES_AFTER = 10.0
"""Seconds after ``init()`` a rank that reports no first step is taken as past its compile."""


class LocalRanks:
    """``plan.on_node(node_rank)``: this node's ranks (and MindSpore's scheduler), watched by
    ``watch.Watch``. Rank events and exits go to ``reporter``, and so do ``LifeWatch``'s
    ``alive`` readings and the ranks' stacks when ``StallWatch`` finds them all frozen."""

    everything = "every process"

    def __init__(self, plan: LaunchPlan, base_env: Mapping[str, str], node_rank: int,
                 console: Console, console_filter: ConsoleFilter, reporter: Reporter,
                 spares: Optional[Spares] = None) -> None:
        self._plan = plan
        self._spares = None if plan.foreground else spares
        """Where this attempt's processes come from when warm, and the next's are stood by
        (``launcher.run.spares``); None where no attempt follows another."""
        self._stood_by = False
        self._warm_scheduler = False
        """The scheduler is a warm spare: it starts once every rank here waits for it in
        ``init()``, so that their registrations reach it together. MindSpore's CPU collective
        sleeps 3 s in ``init()`` when one rank leaves the cluster build before another, and ranks
        that register apart, or when the scheduler is already busy, leave apart."""
        self._base_env = base_env
        self._specs = plan.on_node(node_rank)
        self._node_rank = node_rank
        self._console = console
        self._filter = console_filter
        self._reporter = reporter
        self._by_rank = {s.rank: s for s in self._specs if s.rank is not None}
        self._tails = {rank: EventTail(s.events_path) for rank, s in self._by_rank.items()}
        self._records = {rank: RankRecord() for rank in self._by_rank}
        """This node's ranks' records, folded from their events as they arrive (this node's
        clock) and their exits: what the start-up timeout and ``StallWatch`` read."""
        self._failures: list[Failure] = []
        self._exits: list[Exit] = []
        self._scheduler_after_scripts: list[Exit] = []
        """The scheduler's end, not 0, once every rank's script had ended well: said, not
        counted (``_after_every_script``)."""
        self._stuck: list[ProcessSpec] = []
        self._stuck_at: dict[int, tuple[str, ...]] = {}
        # Nobody sits at a pdb prompt against a clock (``--debug``).
        limits = Limits(0.0 if plan.foreground else plan.timeouts.hang, plan.timeouts.hang_grace,
                        floor=plan.timeouts.hang_floor)
        self._hangs = NodeWatch(limits, self._records,
                                {r: s.stack_path for r, s in self._by_rank.items()},
                                {r: s.host for r, s in self._by_rank.items()},
                                self._fold, self._reporter.event)
        self._finish = threading.Event()
        self._wake = threading.Event()
        self._ranks_done_sent = False
        self._deadline: Optional[float] = None
        self._group: Optional[ProcessGroup] = None
        self._scheduler = next((s for s in self._specs if s.role is Role.SCHEDULER), None)
        """Not started yet: the scheduler this node runs once a rank needs it."""
        self._looks: Optional[hookless.Looks] = None
        """When to look for ranks without the hook: until the scheduler starts."""
        self._hookless: set[int] = set()
        """Ranks found running MindSpore without the rank hook: they cannot be timed."""
        self._warm: set[int] = set()
        """Ranks that are warm spares: the hook is theirs by making (and a spare still importing
        MindSpore when taken maps its library before it says so)."""

    def group(self) -> ProcessGroup:
        """The process group these ranks run in."""
        return ProcessGroup(self._plan.token, self._base_env, self._plan.workdir,
                            self._node_rank)

    def start(self, group: ProcessGroup, wake: threading.Event) -> None:
        self._wake = wake
        self._group = group
        self._deadline = self._startup_deadline(time.time())
        self._looks = None if self._scheduler is None else hookless.Looks(
            time.time(), self._deadline or time.time() + hookless.WINDOW)
        self._warm_scheduler = self._scheduler is not None and self._spares is not None \
            and self._scheduler.label in self._spares
        for rank, spec in self._by_rank.items():
            _remove_stale(spec)
            if self._plan.foreground:
                group.start_foreground(spec)
            else:
                mark_attempt(spec.log_path, self._plan.job_id, self._plan.restart, time.time())
                sink = self._console.rank_sink(spec.host, rank, self._plan.restart)
                self._start_one(group, spec, sink if self._filter.shows(rank) else None)
        if not self._by_rank:  # a pod that runs the scheduler alone: the other pods' ranks need it
            self._start_scheduler()

    def _start_scheduler(self) -> None:
        """Start MindSpore's scheduler, once, if this node runs it."""
        if self._scheduler is None or self._group is None:
            return
        spec, self._scheduler, self._looks = self._scheduler, None, None
        self._start_one(self._group, spec, None)

    def _start_one(self, group: ProcessGroup, spec: ProcessSpec, sink: Optional[LineSink]) -> None:
        """Start ``spec``: its warm spare if one stands by for it, else a new process."""
        spare = self._spares.take(spec) if self._spares is not None else None
        if spare is not None and group.adopt(spare, spec, sink) is not None:
            if spec.rank is not None:
                self._warm.add(spec.rank)
        else:
            group.start(spec, sink)

    def _stand_spares_by(self, now: float) -> None:
        """Once, when every rank here trained its first step (or initialised 10 s ago) and
        began importing MindSpore alone, as it was started: the next attempt's spares."""
        if self._spares is None or self._stood_by or not self._records or self._hookless:
            return
        for r in self._records.values():
            if r.frameworks != {"mindspore"} or r.kept != {"mindspore"} or r.exited \
                    or r.initialised_time is None:
                return
            if r.first_step_time is None and now - r.initialised_time < _SPARES_AFTER:
                return
        self._stood_by = True
        self._spares.stand_by(self._specs, "mindspore")

    def check(self, group: ProcessGroup, exits: list[Exit]) -> Optional[Outcome]:
        self._exits += exits
        self._read_events()
        self._stand_spares_by(time.time())
        if self._looks is not None and self._looks.due(time.time()):
            self._look_for_hookless(group)
        self._report_exits(exits)
        self._scheduler_after_scripts += [e for e in exits if not e.ok and self._after_every_script(e)]
        self._failures = [Failure.from_exit(e) for e in exits if self._failed(e)] + _reported(group)
        if self._failures:
            return Outcome.FAILED
        # A rank whose script ended waits in its exit handlers: no hang.
        self._hangs.look({rank: pid for rank, pid in self._running_ranks(group).items()
                          if not self._records[rank].script_ended})
        if all(r.exited for r in self._records.values()):
            self._announce_ranks_done()
            if self._scheduler_done(group):
                return Outcome.SUCCEEDED
        if self._deadline is not None and time.time() > self._deadline and self._late(group):
            return Outcome.STARTUP_TIMEOUT
        return None

    def before_close(self, group: ProcessGroup, outcome: Outcome) -> None:
        for failure in self._failures:
            group.drain(failure.spec.label, _DRAIN_TIMEOUT)
        self._stuck = self._stuck_ranks(group)
        if outcome is Outcome.STARTUP_TIMEOUT and self._stuck:
            stuck = {s.rank: group.pids[s.label] for s in self._stuck if s.rank is not None}
            samples = self._hangs.send_stacks(stuck)
            self._stuck_at = {r: sample.frames for r, sample in samples.items()}
        self._hangs.join()

    def _running_ranks(self, group: ProcessGroup) -> dict[int, int]:
        return {s.rank: group.pids[s.label] for s in group.running() if s.rank is not None}

    def after_close(self, exits: list[Exit]) -> None:
        self._exits += exits
        self._read_events()
        for tail in self._tails.values():
            tail.close()
        self._report_exits(exits, stopped=True)

    def failed_before(self, at: float) -> Optional[JobResult]:
        """A failure of this node's ranks that began before ``at`` (``time.time()``: its error
        report, else its exit), as ``conclude`` reports it; None when none did. An agent that
        node 0 told to stop a moment after one of its ranks failed, before its own loop saw it,
        reports that failure, not the stop: node 0 compares every node's earliest."""
        seen = [Failure.from_exit(e) for e in self._exits if self._failed(e)] + self._failures
        early = [f for f in seen if f.time < at]
        if not early:
            return None
        self._failures = early
        return self.conclude(Outcome.FAILED)

    def conclude(self, outcome: Outcome) -> JobResult:
        job, now = self._plan.job_id, time.time()
        cause = root_cause(self._failures)
        if cause is not None:
            return JobResult(outcome, cause.exit_code, describe_failure(cause, job), now,
                             cause.cause())
        message = describe_stuck(self._stuck, self._ranks_where(lambda r: r.calling_init), job,
                                 self._plan.timeouts.startup, self._stuck_at)
        return JobResult(Outcome.STARTUP_TIMEOUT, 1, message, now,
                         Cause(Outcome.STARTUP_TIMEOUT, "rank", host=self._host,
                               ranks=tuple(s.rank for s in self._stuck if s.rank is not None),
                               time=now))

    def finished(self, elapsed: float) -> str:
        lines = [f"npu-launch: job {self._plan.job_id} finished: {len(self._tails)} rank(s) "
                 f"exited 0 in {elapsed:.1f} s; logs in {self._plan.log_dir}"]
        lines += [f"npu-launch: not counted as a failure: the scheduler on {e.spec.host} "
                  f"{Failure.from_exit(e).how()} after every rank's script ended cleanly "
                  f"(MindSpore's scheduler does so once a node left the cluster without "
                  f"finalising; {e.spec.log_path})" for e in self._scheduler_after_scripts]
        return "\n".join(lines)

    def finish(self) -> None:
        """Node 0 says every node's ranks are done: the scheduler is no longer needed."""
        self._finish.set()
        self._wake.set()

    @property
    def _host(self) -> str:
        return self._specs[0].host if self._specs else "?"

    def _report_exits(self, exits: list[Exit], stopped: bool = False) -> None:
        """``stopped``: the exits of ``close``, which signals every process still running;
        those the loop polled happened before npu-launch signalled any rank."""
        for exit_ in exits:
            if exit_.spec.rank is not None:
                self._fold(Event.exited(exit_.spec.rank, exit_.spec.host, exit_.returncode,
                                        exit_.time, stopped))

    def _announce_ranks_done(self) -> None:
        if not self._ranks_done_sent:
            self._ranks_done_sent = True
            self._reporter.ranks_done(self._node_rank)

    def _scheduler_done(self, group: ProcessGroup) -> bool:
        """Whether the job is over for this node once its ranks are done. With other nodes,
        their ranks may still need the scheduler: it exits by itself once every rank has left
        the cluster, or node 0 says every node is done (``finish``)."""
        if self._plan.nnodes == 1 or self._finish.is_set():
            return True
        return not any(spec.role is Role.SCHEDULER for spec in group.running())

    def _startup_deadline(self, started: float) -> Optional[float]:
        if self._plan.mode is StartMode.SINGLE or self._plan.foreground:
            return None  # nobody sits at a pdb prompt against a clock
        timeout = self._plan.timeouts.startup
        return started + timeout if timeout > 0 else None

    def _look_for_hookless(self, group: ProcessGroup) -> None:
        """A rank that named no framework found running MindSpore counts as having said it
        imports MindSpore (``hookless``): the scheduler starts."""
        silent = {s.rank: group.pids[s.label] for s in group.running()
                  if s.rank is not None and not self._records[s.rank].frameworks
                  and s.rank not in self._warm}
        for rank, python in hookless.with_mindspore(silent).items():
            self._hookless.add(rank)
            self._fold(hookless.said_for(rank, self._by_rank[rank].host, python, time.time()))
            self._start_scheduler()

    def _failed(self, exit_: Exit) -> bool:
        """Whether an exit fails the job: not 0, and not a death in the exit handlers of a rank
        whose script had ended cleanly (``RankRecord.teardown_crash``: its record has the exit
        already; node 0's monitor says so in a line of its own)."""
        if exit_.ok or self._after_every_script(exit_):
            return False
        record = self._records.get(exit_.spec.rank) if exit_.spec.rank is not None else None
        return record is None or record.teardown_crash() is None

    def _after_every_script(self, exit_: Exit) -> bool:
        """Whether ``exit_`` is the scheduler's, once the script of every rank of the job (all
        of them here) had ended well: MindSpore's scheduler fails when a node left the cluster
        without finalising, even after the work is done, and kills the ranks still in their
        exit handlers (``RankRecord.teardown_crash``): whichever goes first, the job is done."""
        return exit_.spec.role is Role.SCHEDULER and len(self._records) == self._plan.world_size \
            and all(r.ended_well for r in self._records.values())

    def _stuck_ranks(self, group: ProcessGroup) -> list[ProcessSpec]:
        return sorted((s for s in group.running() if s.rank is not None
                       and not self._records[s.rank].initialised and s.rank not in self._hookless),
                      key=lambda s: s.rank or 0)  # every spec here has a rank

    def _late(self, group: ProcessGroup) -> bool:
        """Whether a rank here is late to initialise communication: it imported MindSpore
        (whose dynamic cluster waits for every worker), or another rank here already began
        to initialise (MindSpore's ``init()`` or torch's ``init_process_group``). Ranks that
        use neither (plain Python, torch without communication) have no start-up to time."""
        stuck = {s.rank for s in self._stuck_ranks(group)}
        began = self._ranks_where(lambda r: r.calling_init or r.initialised)
        mindspore = self._ranks_where(lambda r: "mindspore" in r.frameworks)
        return bool(stuck) and bool(began | (stuck & mindspore))

    def _ranks_where(self, fact: Callable[[RankRecord], bool]) -> set[int]:
        return {rank for rank, r in self._records.items() if fact(r)}

    def _read_events(self) -> None:
        for tail in self._tails.values():
            for event in tail.read():
                if event.kind == contract.EVENT_EXITED:  # only the supervisor knows an exit
                    self._reporter.event(event)
                    continue
                self._fold(event)
                if event.kind == contract.EVENT_FRAMEWORK and event.name == "mindspore" \
                        and not self._warm_scheduler:
                    self._start_scheduler()
                elif self._warm_scheduler and self._scheduler is not None \
                        and all(r.calling_init for r in self._records.values()):
                    self._start_scheduler()  # see ``_warm_scheduler``

    def _fold(self, event: Event) -> None:
        """Fold one of this node's rank events into its record, then pass it on."""
        record = self._records.get(event.rank)
        if record is not None:
            record.observe(event, time.time())
        self._reporter.event(event)


def run_local(plan: LaunchPlan, base_env: Mapping[str, str], node_rank: int, console: Console,
              console_filter: ConsoleFilter, reporter: Reporter,
              on_stop: Optional[StopHook] = None,
              on_fault: Optional[FaultHook] = None, spares: Optional[Spares] = None) -> JobResult:
    """Run this node's share of ``plan`` here until it ends; ``on_stop``, ``on_fault``: see
    ``Watch``; ``spares``: see ``LocalRanks``."""
    ranks = LocalRanks(plan, base_env, node_rank, console, console_filter, reporter, spares)
    return Watch(plan, ranks, ranks.group(), reporter.tick, on_stop=on_stop,
                 on_fault=on_fault, exits_overdue=reporter.exits_overdue).run()


def _remove_stale(spec: ProcessSpec) -> None:
    """Reports of an earlier attempt of this job (a restart) must not end this one."""
    for path in (spec.events_path, spec.error_path, spec.stack_path):
        if path:
            remove(path)


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


def print_message(result: JobResult, stream: TextIO) -> None:
    """The job's closing block. It quotes what ranks wrote (their exception, their log's last
    lines, their stacks): a terminal's control codes in them are shown, not obeyed, or a rank's
    ``ESC[2J`` would wipe the block that names it."""
    if result.message:
        stream.write(printable(result.message) + "\n")
        stream.flush()


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab written as an escape."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 (but tab and newline), DEL and C1: ESC starts a terminal's escape sequences, and C1's
CSI (U+009B) does on some terminals on its own."""
