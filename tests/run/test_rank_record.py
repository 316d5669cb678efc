"""One rank's record, folded once from its events (``launcher.ranks.RankRecord``), and what each
reader sees of it: the monitor's rank states, the hang check, the phases, node 0's attempt and
each node's stall watch. In this process, on hand-fed events and a hand-moved clock."""
from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, cast

from launcher.attempt import Attempt, lingering
from launcher.config.devices import DeviceKind
from launcher.config.launch_config import ConsoleFilter
from launcher.hangs.hang_limits import Limits
from launcher.hangs.stack_samples import StallWatch
from launcher.hangs.stalls import HangCheck
from launcher.launch import _started_up
from launcher.observe.job_state import JobState
from launcher.observe.monitor import JobMonitor
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec, Role, StartMode, Timeouts
from launcher.ranks import RankRecord
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.output import Console
from launcher.run.process import Exit
from launcher.run.restarts import Policy
from launcher.run.supervisor import LocalRanks
from parallel.contract import METRICS_FILE, Event

HOSTS = {0: "node-a", 1: "node-b"}


class Clock:
    """The monitor's clock, moved by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def event(kind: str, rank: int, at: float, **fields) -> Event:
    parsed = Event.parse({"event": kind, "rank": rank, "host": HOSTS.get(rank, "?"),
                          "time": at, **fields})
    assert parsed is not None
    return parsed


def life(rank: int, hang_at: Optional[float] = None) -> list[Event]:
    """A rank's events, each stamped with the second it arrives (the rank's clock and node 0's
    agree here): up at 10, ``init()`` 11-12, first step at 15, steps of a fit to 20; with
    ``hang_at``, it then enters its next step and never leaves it."""
    events = [event("started", rank, 10.0, process_start=9.5, main_thread="0x7f00"),
              event("framework", rank, 10.2, name="mindspore"),
              event("init-started", rank, 11.0), event("initialised", rank, 12.0),
              event("initialised", rank, 12.1),  # parallel.init()'s, after the rank hook's
              event("first-step", rank, 15.0),
              event("step", rank, 16.0, step=1, saves_on_stop=True, log_every=1),
              event("progress", rank, 17.0, count=4, busy=False, loads=0),
              event("step", rank, 18.0, step=2), event("step", rank, 20.0, step=3)]
    if hang_at is not None:
        events.append(event("progress", rank, hang_at, count=4, busy=True, loads=0))
    return events


def plan_of(ranks: int) -> LaunchPlan:
    """What ``Attempt.all_of`` reads of a plan: its ranks' numbers."""
    return cast(LaunchPlan, SimpleNamespace(ranks=[SimpleNamespace(rank=r) for r in range(ranks)]))


def fed(tmp_path: Path, clock: Clock, events: list[Event]) -> tuple[JobMonitor, Attempt]:
    monitor = JobMonitor(str(tmp_path), "j", HOSTS, io.StringIO(), False, clock=clock)
    attempt = Attempt(monitor)
    for e in events:
        clock.now = e.time or clock.now
        attempt.event(e)
    return monitor, attempt


def test_the_events_fold_into_one_record_with_every_fact(tmp_path: Path) -> None:
    clock = Clock()
    record = RankRecord()
    for e in life(0)[:6]:
        record.observe(e, e.time)
    assert (record.called, record.in_grace) == (True, True), "a first call is no training step"
    for e in life(0)[6:]:
        record.observe(e, e.time)
    assert (record.main_thread, record.frameworks, record.calling_init, record.initialised) == \
        ("0x7f00", frozenset({"mindspore"}), True, True)
    assert (record.step, record.saves_on_stop, record.count, record.in_grace) == (3, True, 4, False)
    assert (record.since, record.last_progress) == (20.0, 20.0)
    assert record.initialised_time == 12.0, "the second initialised repeats the first"
    assert (record.intervals, record.longest) == (3, 2.0), \
        "from the first training step on: the compile and the first call not"
    record.observe(event("exited", 0, 21.0, returncode=0), 21.0)
    assert record.phases() == {"process": 0.5, "imports": 1.0, "init": 1.0, "first_step": 3.0,
                               "training": 5.0, "exit": 1.0}
    monitor, _ = fed(tmp_path / "m", clock, [*life(0), event("exited", 0, 21.0, returncode=0)])
    seen = {s.rank: s.progress for s in monitor.rank_states()}
    assert seen[0] == record, "the monitor's record is the same fold"


def test_life_is_the_last_progress_or_outside_a_call_the_last_reading_that_it_moved(
        tmp_path: Path) -> None:
    """A supervisor's ``alive`` readings of a quiet rank fold into the same record: outside a
    framework call they are its last sign of life (``life``), with what moved and how much it
    wrote since its last progress; inside one only progress counts. The monitor folds them
    for the hang check alone: they are no rank's last event, and metrics.jsonl keeps none."""
    record = RankRecord()
    assert record.life is None
    for e in life(0):
        record.observe(e, e.time)
    record.observe(event("alive", 0, 22.0, how="io", bytes_written=300, bytes_read=7), 22.0)
    record.observe(event("alive", 0, 23.0, how="cpu,io", bytes_written=200), 23.0)
    assert (record.since, record.alive_at, record.life) == (20.0, 23.0, 23.0)
    assert (record.alive_how, record.quiet_written) == ("cpu,io", 500)
    record.observe(event("alive", 0, 24.0), 24.0)
    assert (record.alive_how, record.quiet_written, record.life) == ("cpu,io", 500, 24.0)
    record.observe(event("progress", 0, 25.0, count=4, busy=True, loads=0), 25.0)
    assert record.life == 20.0, "inside a call only progress tells"
    record.observe(event("alive", 0, 26.0, how="cpu"), 26.0)
    assert record.life == 20.0
    record.observe(event("progress", 0, 27.0, count=5, busy=False, loads=0), 27.0)
    assert (record.life, record.alive_how, record.quiet_written) == (27.0, "", 0), \
        "progress: its next quiet spell starts afresh"
    assert (record.intervals, record.longest) == (4, 7.0), "a spell busy alone is learnt too"

    clock = Clock()
    monitor, _ = fed(tmp_path, clock, [*life(0), event("alive", 0, 22.0, how="children",
                                                       bytes_written=0, bytes_read=0)])
    state = monitor.rank_states()[0]
    assert (state.progress.life, state.progress.alive_how, state.last_event) == (
        22.0, "children", "step")
    monitor.close("succeeded", 0)
    assert "alive" not in (tmp_path / METRICS_FILE).read_text()


def test_with_min_nodes_a_failure_inside_init_is_restarted_by_the_culprits_own_events(
        tmp_path: Path) -> None:
    """Rank 1 (another host) fails inside ``init()`` before rank 0's ``init-started`` reached
    node 0: the failure may be its host's, so it is restarted with ``--min-nodes``; a rank that
    failed before calling ``init()`` is not, nor is anything without ``--min-nodes``."""
    _, attempt = fed(tmp_path, Clock(), life(1)[:3])
    failed = JobResult(Outcome.FAILED, 1, "rank 1 failed", 11.5,
                       Cause(Outcome.FAILED, "rank", rank=1, host="node-b", time=11.5))
    shrinking, fixed = Policy(max_restarts=2, min_nodes=1), Policy(max_restarts=2)
    assert _started_up(attempt, plan_of(2), shrinking, failed)
    assert not _started_up(attempt, plan_of(2), fixed, failed)
    _, early = fed(tmp_path / "early", Clock(), life(1)[:2])
    assert not _started_up(early, plan_of(2), shrinking, failed), "failed in its imports"
    unnamed = JobResult(Outcome.FAILED, 1, "an agent failed", 11.5, None)
    assert not _started_up(attempt, plan_of(2), shrinking, unnamed), "rank 0 never called it"


def test_every_reader_reads_the_same_record(tmp_path: Path) -> None:
    clock = Clock()
    monitor, attempt = fed(tmp_path, clock, [*life(0), *life(1)[:3]])
    states = {s.rank: s for s in monitor.rank_states()}
    assert (states[0].progress.initialised, states[1].progress.initialised) == (True, False)
    assert not attempt.all_of(plan_of(2)) and attempt.all_called_init(plan_of(2))
    attempt.event(event("initialised", 1, 20.5))
    assert attempt.all_of(plan_of(2))
    attempt.step_times = [(100.0, 1), (101.0, 3)]  # the pace is the attempt's: 2 steps a second
    assert attempt.stop_step([0]) == 3 + 1 + 2 + 1, "rank 0's last step, from its record"
    assert attempt.stop_step([0, 1]) is None, "rank 1 never said it saves on a stop"
    failed = JobResult(Outcome.FAILED, 1, "rank 0 failed", 21.0,
                       Cause(Outcome.FAILED, "rank", rank=0, host="node-a", time=21.0))
    assert attempt.failure_point(failed).where == ("step", 3)
    clock.now = 40.0
    check = HangCheck(monitor.rank_states, Limits(10.0, 100.0), clock)
    assert check() is None, "rank 1 is in its grace, rank 0 alone cannot fall behind"
    attempt.event(event("exited", 0, 41.0, returncode=0))
    assert attempt.exited == {0} and monitor.record(0) is not None
    assert (monitor.record(0) or RankRecord()).exit_code == 0


def test_a_restart_begins_a_new_record_and_keeps_the_summary(tmp_path: Path) -> None:
    clock = Clock()
    monitor, attempt = fed(tmp_path, clock, [*life(0), event("exited", 0, 21.0, returncode=1)])
    assert attempt.exited == {0}
    again = Attempt(monitor)
    assert again.exited == set() and not again.all_of(plan_of(1))
    state = monitor.rank_states()[0]
    assert state.progress == RankRecord() and (state.step, state.exited) == (3, False)


def test_the_stall_watch_reads_the_supervisors_records() -> None:
    records = {0: RankRecord(), 1: RankRecord()}
    watch = StallWatch(Limits(10.0, 100.0), records)
    for rank, record in records.items():
        for e in life(rank):
            record.observe(e, e.time)
    assert not watch.due([0, 1], 25.0), "silent for 5 s of a 10 s limit"
    assert watch.due([0, 1], 31.0)


def test_the_phases_and_the_hang_check_agree_on_a_rank_that_hangs_inside_a_step(
        tmp_path: Path) -> None:
    """Before one fold, a rank that entered its next step at 20.4 and hung there had two last
    progresses: the phases' marks took the call's entry (training 5.4 s, then an 79.6 s exit),
    the hang check its last step (silent since 20.0). Entering a call is no progress: both say
    20.0 now."""
    clock = Clock()
    monitor, _ = fed(tmp_path, clock, [*life(0, hang_at=20.4),
                                       event("exited", 0, 100.0, returncode=-9)])
    record = monitor.rank_states()[0].progress
    assert record.since == record.last_progress == 20.0
    assert (record.phases()["training"], record.phases()["exit"]) == (5.0, 80.0)


def test_metrics_jsonl_read_back_gives_the_same_phases(tmp_path: Path) -> None:
    """metrics.jsonl keeps no progress events: the monitor writes the last progress into the
    ``exited`` record, and the report's fold of the file finds the same phases."""
    clock = Clock()
    monitor, _ = fed(tmp_path, clock, [*life(0), event("progress", 0, 22.0, count=9, busy=False,
                                                       loads=0),
                                       event("exited", 0, 23.0, returncode=0)])
    live = monitor.rank_states()[0].progress.phases()
    monitor.close("succeeded", 0)
    rebuilt = JobState(HOSTS)
    for line in (tmp_path / METRICS_FILE).read_text().splitlines():
        e = Event.parse(json.loads(line))
        if e is not None and e.rank is not None:
            rebuilt.apply(e, e.time or 0.0)
    assert live["training"] == 7.0 and rebuilt.ranks[0].progress.phases() == live


class Recorder:
    """A node's ``Reporter`` that keeps what the supervisor passed on."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.done: list[int] = []

    def event(self, event: Event) -> None:
        self.events.append(event)

    def ranks_done(self, node_rank: int) -> None:
        self.done.append(node_rank)

    def tick(self) -> None:
        return None


class Running:
    """A process group whose ``running`` ranks are given by hand (nothing is started)."""

    def __init__(self, specs: list[ProcessSpec]) -> None:
        self.specs = specs
        self.pids = {s.label: 1000 + (s.rank or 0) for s in specs}

    def running(self) -> list[ProcessSpec]:
        return list(self.specs)


def _local_ranks(tmp_path: Path) -> tuple[LocalRanks, list[ProcessSpec], Recorder]:
    specs = [ProcessSpec(Role.RANK, r, "h", 0, r, None, str(tmp_path / f"rank_{r}.log"), {},
                         ("python",), events_path=str(tmp_path / f"events {r}.jsonl"),
                         error_path=str(tmp_path / f"error {r}.json")) for r in (0, 1)]
    plan = LaunchPlan(job_id="j", log_dir=str(tmp_path), mode=StartMode.DYNAMIC_CLUSTER,
                      device=DeviceKind.CPU, master_addr="127.0.0.1", master_port=1, world_size=2,
                      nnodes=1, scheduler=None, ranks=tuple(specs), workdir="/",
                      foreground=False, timeouts=Timeouts(startup=5.0))
    reporter = Recorder()
    ranks = LocalRanks(plan, {}, 0, Console(io.BytesIO()), ConsoleFilter(), reporter)
    return ranks, specs, reporter


def test_the_schedulers_end_after_every_script_ended_well_is_no_failure(tmp_path: Path) -> None:
    """MindSpore's scheduler exits 1 once a node left the cluster without finalising, and kills
    the ranks still in their exit handlers with SIGTERM: whichever the supervisor sees first,
    once every rank's script ended well the job succeeded and one line says so; while a
    script runs, the scheduler's end is a failure."""
    scheduler = ProcessSpec(Role.SCHEDULER, None, "h", 0, None, None,
                            str(tmp_path / "scheduler.log"), {}, ("python",))
    (tmp_path / "running").mkdir()
    (tmp_path / "ended").mkdir()
    running, specs, _ = _local_ranks(tmp_path / "running")
    _write(specs[0].events_path, {"event": "exiting", "rank": 0, "clean": True, "time": 1.0})
    assert running.check(Running(specs), [Exit(scheduler, 999, 1, 2.0)]) is Outcome.FAILED, \
        "rank 1's script runs"
    ranks, specs, _ = _local_ranks(tmp_path / "ended")
    _write(specs[0].events_path, {"event": "exiting", "rank": 0, "clean": True, "time": 1.0})
    assert ranks.check(Running(specs[:1]), [Exit(specs[1], 1001, 0, 2.0)]) is None
    assert ranks.check(Running(specs[:1]), [Exit(scheduler, 999, 1, 3.0)]) is None
    assert ranks.check(Running([]), [Exit(specs[0], 1000, -15, 4.0)]) is Outcome.SUCCEEDED
    assert ranks.finished(5.0).splitlines()[1] == (
        "npu-launch: not counted as a failure: the scheduler on h exited with code 1 after every "
        "rank's script ended cleanly (MindSpore's scheduler does so once a node left the cluster "
        f"without finalising; {scheduler.log_path})")


def _write(path: str, *records: dict) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_the_supervisor_reads_its_ranks_records(tmp_path: Path) -> None:
    """This node's records decide the start-up timeout (a rank that began ``init()`` makes the
    others late) and the end (only the supervisor's own exits count: an ``exited`` line a rank
    writes itself is passed on, not believed)."""
    ranks, specs, reporter = _local_ranks(tmp_path)
    group = Running(specs)
    assert ranks.check(group, []) is None
    assert not ranks._late(group), "no rank began init() nor imported MindSpore: nothing to time"
    _write(specs[0].events_path, {"event": "started", "rank": 0, "time": 1.0},
           {"event": "init-started", "rank": 0, "time": 2.0},
           {"event": "initialised", "rank": 0, "time": 3.0},
           {"event": "exited", "rank": 0, "returncode": 0, "time": 4.0})
    _write(specs[1].events_path, {"event": "exited", "rank": 1, "returncode": 0, "time": 4.0})
    assert ranks.check(group, []) is None, "every rank wrote 'exited', none has"
    assert ranks._late(group) and [s.rank for s in ranks._stuck_ranks(group)] == [1]
    assert [e.kind for e in reporter.events] == ["started", "init-started", "initialised", "exited",
                                                 "exited"]
    exits = [Exit(spec, 1000 + r, 0, 5.0) for r, spec in enumerate(specs)]
    assert ranks.check(Running([]), exits) is Outcome.SUCCEEDED
    assert reporter.done == [0] and [e.kind for e in reporter.events[-2:]] == ["exited"] * 2


def test_an_agent_stopped_just_after_its_rank_failed_reports_the_failure(tmp_path: Path) -> None:
    """Node 0 told this node to stop at 11.0 (another node's rank failed, a victim of this one),
    before this node's loop saw rank 0's exit at 10.0; its teardown then killed rank 1. What
    the node reports is rank 0's failure, not the stop; with nothing failed before the stop,
    nothing."""
    ranks, specs, _ = _local_ranks(tmp_path)
    ranks.after_close([Exit(specs[0], 1000, 1, 10.0), Exit(specs[1], 1001, -15, 12.0)])
    assert ranks.failed_before(9.0) is None
    result = ranks.failed_before(11.0)
    assert result is not None and result.outcome is Outcome.FAILED and result.exit_code == 1
    assert result.cause is not None and (result.cause.rank, result.cause.time) == (0, 10.0)


def test_only_a_fault_or_a_sigterm_not_ours_after_a_clean_end_is_a_death_in_the_teardown(
        ) -> None:
    record = RankRecord()

    def crash(code: Optional[int], stopped: bool = False) -> Optional[str]:
        record.observe(Event.exited(0, "h", code, 1.0, stopped))
        return record.teardown_crash()

    assert crash(-11) is None and crash(-15) is None, "no exiting event: the script may not have ended"
    record.observe(Event.parse({"event": "exiting", "rank": 0, "host": "h", "clean": False}))
    assert crash(-11) is None and crash(-15) is None, "an exception or sys.exit(3) came first"
    record.observe(Event.parse({"event": "exiting", "rank": 0, "host": "h", "clean": True}))
    assert [crash(code) for code in (-11, -6, -7, -9, -15, 0, 1, 139, None)] == [
        "SIGSEGV", "SIGABRT", "SIGBUS", None, "SIGTERM", None, None, None, None]
    assert crash(-15, stopped=True) is None, "npu-launch's own teardown sent it"
    assert crash(-11, stopped=True) == "SIGSEGV", "a fault is the rank's own, whenever it comes"


def _ended(clean: Optional[bool], at: float, exit_code: Optional[int] = None) -> RankRecord:
    """A record whose script ended at ``at`` (``exiting``, clean or not; None: no ``exiting``)
    and, with ``exit_code``, whose process then exited."""
    record = RankRecord()
    if clean is not None:
        record.observe(event("exiting", 0, at, clean=clean), at)
    if exit_code is not None:
        record.observe(event("exited", 0, at + 0.5, returncode=exit_code), at + 0.5)
    return record


def test_ranks_are_lingering_only_once_every_script_ended_well_the_limit_ago() -> None:
    ended, gone = _ended(True, 10.0), _ended(True, 12.0, exit_code=0)
    assert lingering({0: ended, 1: gone}, 13.0, 2.0) == (), "the last end was 12: 1 s ago"
    assert lingering({0: ended, 1: gone}, 14.5, 2.0) == (0,), "rank 1 exited: not lingering"
    assert lingering({0: ended, 1: RankRecord()}, 99.0, 2.0) == (), "rank 1's script runs"
    assert lingering({0: ended, 1: _ended(False, 10.0)}, 99.0, 2.0) == (), "a failure's to tell"
    assert lingering({0: ended, 1: None}, 99.0, 2.0) == (), "a rank not seen at all"
    quiet = _ended(None, 10.0, exit_code=0)  # no hook: its exit is its end
    assert lingering({0: ended, 1: quiet}, 99.0, 2.0) == (0,)
    crashed = _ended(None, 10.0, exit_code=-11)
    assert lingering({0: ended, 1: crashed}, 99.0, 2.0) == ()


def test_a_rank_whose_script_ended_is_not_judged_for_a_hang(tmp_path: Path) -> None:
    clock = Clock()
    early = life(1)[:-1] + [event("exiting", 1, 18.5, clean=True)]
    monitor, _ = fed(tmp_path, clock, [*life(0), *early])
    states = {s.rank: s for s in monitor.rank_states()}
    assert states[1].done and not states[0].done
