"""The hang check's judgement, on rank states built from events (``launcher.hangs.stalls``): a
rank is judged only once every rank is frozen (no progress and, with a learnt limit, no sign of
life from its supervisor's readings), ranks busy alone are told, graph compilation has the
grace; and the rank hook's progress counters (``parallel.hook.progress``), in this process."""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Optional

import pytest

from launcher.hangs.hang_limits import LEARN_AFTER, Learnt, Limits
from launcher.hangs.stack_samples import StackSample
from launcher.hangs.stalls import (
    Busy,
    HangCheck,
    busy_alone,
    describe_stall,
    judge,
    stalled_before,
)
from launcher.ranks.record import RankRecord
from parallel import contract
from parallel.contract import Event
from parallel.hook import progress

LIMITS = Limits(timeout=10.0, grace=100.0)
IN_MINDSPORE = ("/py/site-packages/mindspore/graph/api.py:2432 in _exec_pip",
                "/job/train.py:40 in <module>")
IN_DATA = ("/py/site-packages/mindspore/dataset/engine/iterators.py:150 in __next__",
           "/job/train.py:38 in <module>")
IN_SLEEP = ("/job/train.py:35 in hang_here", "/job/train.py:39 in <module>")
STILL = "no CPU, no I/O, no child process for"
"""How a hang message ends for a rank outside a framework call: what its supervisor read."""


@dataclasses.dataclass
class State:
    rank: int
    host: str = "h"
    step: Optional[int] = None
    progress: RankRecord = dataclasses.field(default_factory=RankRecord)
    finished: bool = False
    exited: bool = False

    @property
    def done(self) -> bool:
        return self.finished or self.exited or self.progress.script_ended


def see(state: State, kind: str, at: float, **fields) -> None:
    event = Event.parse({"event": kind, "rank": state.rank, **fields})
    assert event is not None
    state.progress.observe(event, at)


def stepping(ranks: int, until: float, count: int = 5) -> list[State]:
    """Ranks initialised at 0 that made ``count`` progress by ``until``, now idle."""
    states = [State(r, host=f"host{r}") for r in range(ranks)]
    for s in states:
        see(s, contract.EVENT_INITIALISED, 0.0)
        see(s, contract.EVENT_PROGRESS, until, count=count, busy=False, loads=0)
    return states


def test_grace_lasts_until_a_training_step_and_again_after_a_load() -> None:
    p = RankRecord()
    p.observe(Event(contract.EVENT_INITIALISED, 0), 1.0)
    assert (p.since, p.in_grace, LIMITS.of(p)) == (1.0, True, 100.0)
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=0, busy=True, loads=0), 5.0)
    assert (p.since, p.in_grace, p.busy) == (1.0, True, True), "entering a call is no progress"
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=1, busy=True, loads=0), 6.0)
    assert (p.since, p.in_grace) == (6.0, True), "a first batch, fetched before the compile"
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=2, busy=False, loads=0), 6.5)
    assert (p.since, p.in_grace, LIMITS.of(p), p.intervals) == (6.5, False, 10.0, 0), \
        "no Cell call at all (batches around a @jit function): a count 2 higher ends it"
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=3, busy=False, loads=1), 7.0)
    assert (p.since, p.in_grace) == (7.0, True)
    p.observe(Event(contract.EVENT_STEP, 0, step=4), 8.0)
    assert (p.since, p.in_grace) == (8.0, False), "a trainer step ends it"

    q = RankRecord()
    q.observe(Event(contract.EVENT_INITIALISED, 0), 1.0)
    q.observe(Event(contract.EVENT_FIRST_STEP, 0), 9.0)
    assert (q.since, q.in_grace, q.called, q.intervals) == (9.0, True, True, 0), \
        "a first call is no training step: a warm-up collective, an evaluation cell"
    q.observe(Event(contract.EVENT_PROGRESS, 0, count=5, busy=False, loads=0, trained=0), 9.5)
    assert (q.since, q.in_grace, LIMITS.of(q)) == (9.5, True, 100.0), \
        "a Cell was called: a count 2 higher no longer ends it, only a training step"
    q.observe(Event(contract.EVENT_PROGRESS, 0, count=6, busy=False, loads=0, trained=1), 300.0)
    assert (q.since, q.in_grace, q.intervals) == (300.0, False, 0), \
        "the first training step ends it; the compile before it teaches the limit nothing"
    q.observe(Event(contract.EVENT_PROGRESS, 0, count=7, busy=False, loads=1, trained=1), 301.0)
    q.observe(Event(contract.EVENT_PROGRESS, 0, count=9, busy=False, loads=1, trained=1), 302.0)
    assert (q.since, q.in_grace, q.grace_trained) == (302.0, True, 1), \
        "a checkpoint load: the grace again, until the next training step"
    q.observe(Event(contract.EVENT_PROGRESS, 0, count=10, busy=False, loads=1, trained=2), 303.0)
    assert (q.since, q.in_grace, q.intervals) == (303.0, False, 0)


def test_a_rank_in_grace_is_named_only_once_every_rank_is_frozen() -> None:
    """Rank 0 steps while rank 1 still compiles (no training step yet), then waits for it
    inside its next step. While rank 1 is within its grace nobody is named, though rank 0 is
    frozen past the 10 s limit; once rank 1 is past its grace too, rank 1 is the one."""
    now = [55.0]
    states = [State(r, host=f"host{r}") for r in range(2)]
    for s in states:
        see(s, contract.EVENT_INITIALISED, 1.0)
    see(states[0], contract.EVENT_FIRST_STEP, 40.0)
    see(states[0], contract.EVENT_PROGRESS, 50.0, count=7, busy=False, loads=0, trained=1)
    see(states[0], contract.EVENT_PROGRESS, 50.1, count=7, busy=True, loads=0, trained=1)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    assert check() is None, "rank 1 still compiles, say"
    now[0] = 70.0
    assert LIMITS.frozen(states[0].progress, now[0]) and not LIMITS.frozen(states[1].progress, now[0])
    assert check() is None, "rank 0 waits for the rank in its grace"
    now[0] = 101.5
    assert check() is None, "every rank frozen: the stacks are awaited"
    now[0] = 103.6
    stall = check()
    assert stall is not None and (stall.rank, stall.host, stall.waiting) == (1, "host1", (0,))
    assert stall.how == "it is not inside a step"
    assert stall.limit == "--hang-grace 100: compiling" and stall.silent_for == pytest.approx(53.6)


def test_stacks_name_the_rank_outside_mindspore() -> None:
    states = stepping(3, until=5.0)
    samples = {0: StackSample(0, IN_MINDSPORE), 1: StackSample(1, IN_SLEEP),
               2: StackSample(2, IN_MINDSPORE)}
    stall = judge(states, samples, 20.0, LIMITS)
    assert (stall.rank, stall.host, stall.waiting, stall.how) == (
        1, "host1", (0, 2), "its stack is outside MindSpore")
    assert stall.stacks[0] == (1, IN_SLEEP) and stall.silent_for == 15.0


def test_a_rank_stuck_in_its_data_pipeline_is_the_straggler() -> None:
    states = stepping(2, until=5.0)
    stall = judge(states, {0: StackSample(0, IN_MINDSPORE), 1: StackSample(1, IN_DATA)}, 20.0,
                  LIMITS)
    assert (stall.rank, stall.waiting) == (1, (0,))


def test_without_stacks_the_rank_not_inside_a_step_is_named_then_the_one_behind() -> None:
    states = stepping(3, until=5.0)
    for s in (states[0], states[2]):
        see(s, contract.EVENT_PROGRESS, 5.0, count=5, busy=True, loads=0)
    stall = judge(states, {}, 20.0, LIMITS)
    assert (stall.rank, stall.waiting, stall.how) == (1, (0, 2), "it is not inside a step")
    states = stepping(3, until=5.0)
    see(states[2], contract.EVENT_PROGRESS, 5.0, count=9, busy=False, loads=0)
    see(states[0], contract.EVENT_PROGRESS, 5.0, count=9, busy=False, loads=0)
    stall = judge(states, {}, 20.0, LIMITS)
    assert (stall.rank, stall.waiting, stall.how) == (1, (0, 2), "its count is behind")


def test_hang_check_waits_for_every_nodes_stacks_then_judges() -> None:
    now = [16.0]
    states = stepping(2, until=5.0)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    assert check() is None, "every rank silent: the stacks are awaited"
    now[0] = 16.3
    check.sample(StackSample(0, IN_MINDSPORE))
    assert check() is None
    now[0] = 16.4
    check.sample(StackSample(1, IN_SLEEP))
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting) == (1, (0,))
    assert check.first == stall


def test_hang_check_judges_without_stacks_after_a_while() -> None:
    now = [16.0]
    states = stepping(2, until=5.0)
    see(states[0], contract.EVENT_PROGRESS, 5.0, count=5, busy=True, loads=0)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    assert check() is None
    now[0] = 18.0
    stall = check()
    assert stall is not None and stall.rank == 1


def test_ranks_that_all_wait_outside_mindspore_are_left_alone() -> None:
    now = [16.0]
    states = stepping(2, until=5.0)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    check()
    check.sample(StackSample(0, IN_SLEEP))
    check.sample(StackSample(1, IN_SLEEP))
    now[0] = 16.1
    assert check() is None, "an evaluation in numpy, a long save: nobody waits on anybody"
    now[0] = 200.0
    check.sample(StackSample(0, IN_MINDSPORE))
    check.sample(StackSample(1, IN_MINDSPORE))
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting) == (None, (0, 1))


def test_a_rank_whose_script_ended_while_the_others_wait_in_a_step_is_the_cause() -> None:
    """Rank 1 ran out of batches and ended its script after step 5 (it waits in its exit
    handlers, or is gone); rank 0 waits inside step 6's all-reduce for its share. Nobody hangs
    in the usual sense: the block names the rank that left, not "every rank waits"."""
    now = [16.0]
    states = stepping(2, until=5.0)
    states[1].step = 5
    see(states[1], contract.EVENT_EXITING, 5.1, clean=True)
    see(states[0], contract.EVENT_PROGRESS, 5.2, count=5, busy=True, loads=0)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    assert check() is None, "awaiting rank 0's stack"
    check.sample(StackSample(0, IN_MINDSPORE))
    now[0] = 16.1
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting, stall.left) == (1, (0,), True)
    head = describe_stall(stall, "j").splitlines()[0]
    assert head == ("npu-launch: job j stopped: rank(s) 0 wait in MindSpore with no progress "
                    "for 11 s (--hang-timeout 10), but rank 1 on host1 ended its script after step 5: "
                    "it left the job's collectives early (fewer batches than its peers?)"), head


def test_a_rank_that_ends_its_script_is_progress_for_the_ranks_finishing_the_same_steps() -> None:
    """Rank 0 waited inside a step for 6 s on rank 1, which was busy alone (alive, read by its
    supervisor); rank 1 then ran the last steps and ended its script at 15.0. Rank 0 ran them as
    well, but its progress is not told yet (at most twice a second, later under load): it is no
    rank left behind until a limit after rank 1's end; then it is."""
    now = [15.2]
    states = stepping(2, until=9.0)
    see(states[0], contract.EVENT_PROGRESS, 9.1, count=5, busy=True, loads=0)
    see(states[1], contract.EVENT_PROGRESS, 14.9, count=9, busy=False, loads=0)
    see(states[1], contract.EVENT_EXITING, 15.0, clean=True)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    check.sample(StackSample(0, IN_MINDSPORE))
    assert check() is None
    now[0] = 24.9
    check.sample(StackSample(0, IN_MINDSPORE))
    assert check() is None, "judged 9.9 s after rank 1 ended, with a limit of 10 s"
    now[0] = 25.5
    check.sample(StackSample(0, IN_MINDSPORE))
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting, stall.left) == (1, (0,), True)


def test_the_stalled_rank_not_its_timed_out_peer_is_the_cause() -> None:
    states = stepping(2, until=5.0)
    see(states[0], contract.EVENT_PROGRESS, 5.2, count=5, busy=True, loads=0)
    stall = stalled_before(states, failed=0, at=35.0)
    assert stall is not None and (stall.rank, stall.host, stall.waiting) == (1, "host1", (0,))
    assert stalled_before(states, failed=1, at=35.0) is None, "rank 0 was waiting, not stalled"
    assert stalled_before(states, failed=0, at=6.0) is None, "failed at once: its own error"
    states[1].finished = True
    assert stalled_before(states, failed=0, at=35.0) is None


def test_a_rank_that_raised_between_steps_is_not_the_victim_of_its_peers_in_a_step() -> None:
    """A bad host's rank raises after its step 33 and takes seconds to tear down; its peers wait
    inside step 34's all-reduce with a lower count: they are not the stall."""
    states = stepping(2, until=5.0, count=66)
    see(states[0], contract.EVENT_PROGRESS, 5.3, count=67, busy=False, loads=0)
    see(states[1], contract.EVENT_PROGRESS, 5.1, count=66, busy=True, loads=0)
    assert stalled_before(states, failed=0, at=9.0) is None
    see(states[1], contract.EVENT_PROGRESS, 5.2, count=66, busy=False, loads=0)
    assert stalled_before(states, failed=0, at=9.0) is not None, "behind, outside a step"


# The rank hook's counters ----------------------------------------------------------------------

class Cell:
    calls = 0
    training: Optional[bool] = None
    """As MindSpore's ``Cell.training`` (``set_train()``): what makes a call a training step."""

    def __call__(self, inner: Optional["Cell"] = None, fail: bool = False):
        Cell.calls += 1
        if inner is not None:
            inner()
        if fail:
            raise ValueError("inside the cell")
        return "result"


@pytest.fixture()
def counted(monkeypatch, tmp_path):
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(contract.EVENTS_FILE, str(events))
    monkeypatch.setattr(progress, "_state", progress._Counters())
    monkeypatch.setattr(progress, "INTERVAL", 0.05)
    original = Cell.__call__
    Cell.__call__ = progress.counting_call(original)  # type: ignore[method-assign]
    yield events
    Cell.__call__ = original  # type: ignore[method-assign]


def test_only_the_main_threads_top_level_calls_count(counted) -> None:
    outer, inner = Cell(), Cell()
    assert outer(inner) == "result"
    with pytest.raises(ValueError, match="inside the cell"):
        outer(fail=True)
    assert progress.snapshot()[:3] == (1, True, 0) and Cell.calls == 3, \
        "a call that raised is not progress, and the rank is told as inside it"
    assert outer() == "result" and progress.snapshot()[:3] == (2, False, 0)
    worker = threading.Thread(target=outer)
    worker.start()
    worker.join()
    assert progress.snapshot()[0] == 2, "another thread's call is not a step"


def test_progress_events_are_bounded_and_report_the_last_state(counted) -> None:
    cell = Cell()
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        cell()
    time.sleep(0.2)
    records = [line for line in counted.read_text().splitlines() if '"progress"' in line]
    assert 2 <= len(records) <= 0.7 / progress.INTERVAL + 1
    last = Event.parse(json.loads(records[-1]))
    assert last is not None and last.count == progress.snapshot()[0] and last.busy is False


def test_training_calls_and_graph_compilations_are_counted_and_told(counted) -> None:
    """``trained`` counts the main thread's top-level calls of a Cell in training mode (what
    ends the grace); ``compiling`` is whether its main thread is inside a compile now. Both
    reach the launcher in the progress events."""
    training, evaluating = Cell(), Cell()
    training.training, evaluating.training = True, False
    evaluating()
    count, _, _, _, _, trained, _ = progress.snapshot()
    assert (count, trained) == (1, 0), "a call not in training mode is no training step"
    training()
    assert progress.snapshot() == (2, False, 0, "", 0, 1, False)

    class TrainOneStepCell(Cell):
        """As MindSpore's: the script often never calls ``set_train()`` on it."""

    class Adam(type("Optimizer", (Cell,), {})):
        """A functional loop's optimizer call: it updates the weights."""
    TrainOneStepCell()()
    Adam()()
    assert progress.snapshot()[5] == 3, "a train cell or an optimizer steps without set_train()"
    seen = []

    def cached() -> str:  # a compile that finds its graph: MindSpore returns before this
        seen.append(progress.snapshot()[6])
        return "phase"

    def compile_graph(fail: bool = False) -> str:
        begins()
        seen.append(progress.snapshot()[6])
        time.sleep(0.15)
        if fail:
            raise RuntimeError("bad graph")
        return "phase"
    begins = progress.compile_begins(lambda: None)
    assert progress.compiling(cached)() == "phase" and seen == [False], "no graph compiled"
    compile_ = progress.compiling(compile_graph)
    assert compile_() == "phase" and seen == [False, True] and progress.snapshot()[6] is False
    begins()
    assert progress.snapshot()[6] is False, "outside a compile call, nothing begins"
    with pytest.raises(RuntimeError, match="bad graph"):
        compile_(fail=True)
    assert progress.snapshot()[6] is False, "a compile that raised is over"
    progress.compiling(lambda: compile_())()
    assert seen[-1] is True and progress.snapshot()[6] is False, "nested compiles are one"
    worker = threading.Thread(target=compile_)
    worker.start()
    worker.join()
    assert seen[-1] is False, "another thread's compile is not the main thread's"
    time.sleep(0.2)
    told = [e for line in counted.read_text().splitlines()
            if (e := Event.parse(json.loads(line))) is not None and e.kind == contract.EVENT_PROGRESS]
    assert any(e.compiling and e.trained == 3 for e in told), told
    assert (told[-1].compiling, told[-1].trained, told[-1].count) == (False, 3, 4)


def test_the_main_threads_frames_are_read_whatever_the_path_holds(tmp_path) -> None:
    from launcher.hangs.stack_samples import _main_frames
    dump = ('Thread 0x00007f00000000aa (most recent call first):\n'
            '  File "/py/threading.py", line 331 in wait\n\n'
            'Current thread 0x00007f00000000bb (most recent call first):\n'
            '  File "/tmp/dir with \'single\' and "double" quotes/train.py", line 53 in hang_here\n'
            '  File "/tmp/x.py", line 9 in <module>\n')
    expected = ("/tmp/dir with 'single' and \"double\" quotes/train.py:53 in hang_here",
                "/tmp/x.py:9 in <module>")
    assert _main_frames(dump, "0x7f00000000bb") == expected, "ids are zero-padded in the dump"
    assert _main_frames(dump, "") == expected, "else the thread that took the signal"
    assert _main_frames(dump, "0x7f00000000aa") == ("/py/threading.py:331 in wait",)


def test_ranks_that_stop_a_hair_apart_are_judged_together() -> None:
    """Synchronous ranks blocked together: rank 0's last step arrived 0.3 s before rank 1's.
    Nobody is named while rank 1 is within its limit; once both are frozen, the stacks tell
    who hangs, and the silence is counted from the later one. Rank 1 going on for 6 s after
    rank 0 stopped is no hang either while it steps: rank 0 is named by its count once rank 1
    waits too."""
    now = [15.2]
    states = stepping(2, until=5.0)
    see(states[1], contract.EVENT_PROGRESS, 5.3, count=6, busy=False, loads=0)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    assert LIMITS.frozen(states[0].progress, now[0]) and check() is None, "rank 1 stepped 9.9 s ago"
    now[0] = 15.8
    assert check() is None, "both frozen: the stacks are awaited"
    check.sample(StackSample(0, IN_MINDSPORE))
    check.sample(StackSample(1, IN_SLEEP))
    now[0] = 15.9
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting) == (1, (0,))
    assert stall.silent_for == pytest.approx(10.6)

    states = stepping(2, until=5.0)
    see(states[1], contract.EVENT_PROGRESS, 11.0, count=9, busy=False, loads=0)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    now[0] = 15.2
    assert check() is None, "rank 1 goes on: rank 0 may wait for it"
    now[0] = 21.1
    assert check() is None, "both frozen: the stacks are awaited"
    now[0] = 23.2  # they never came
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting) == (0, (1,))
    assert stall.how == "its count is behind"


# Limits learnt from the job --------------------------------------------------------------------

LEARNING = Limits(timeout=None, grace=100.0)


def steps_every(states: list[State], start: float, interval: float, count: int,
                ranks: Optional[tuple[int, ...]] = None) -> float:
    """Every rank of ``ranks`` (all) makes progress ``count`` times, ``interval`` apart, from
    ``start`` on; returns when the last came."""
    at = start
    for n in range(count):
        at = start + n * interval
        for s in states:
            if ranks is None or s.rank in ranks:
                see(s, contract.EVENT_PROGRESS, at, count=s.progress.count + 1, busy=False,
                    loads=0)
    return at


def test_the_limit_is_learnt_from_the_longest_quiet_interval_with_a_floor() -> None:
    states = stepping(2, until=1.0, count=1)
    assert Limits(None, 100.0).learning(Learnt.of(s.progress for s in states)).quiet == 600.0, \
        "nothing learnt yet: the default"
    steps_every(states, 1.5, 0.5, 6)
    see(states[0], contract.EVENT_PROGRESS, 5.9, count=99, busy=False, loads=0)  # 1.9 s quiet
    learnt = LEARNING.learning(Learnt.of(s.progress for s in states))
    assert (learnt.learnt.longest, learnt.quiet) == (pytest.approx(1.9), 10.0), "the floor"
    assert learnt.why == "limit 10 s learnt: 5 x 1.9 s longest interval, floor 10 s"
    see(states[0], contract.EVENT_PROGRESS, 8.9, count=100, busy=False, loads=0)  # 3 s quiet
    learnt = learnt.learning(Learnt.of(s.progress for s in states))
    assert learnt.quiet == pytest.approx(15.0)
    assert Limits(30.0, 100.0).learning(learnt.learnt).why == "--hang-timeout 30", \
        "--hang-timeout fixes the limit"
    assert not Limits(0.0, 100.0).on and Limits(None, 1.0).on


def test_one_interval_after_the_grace_is_enough_and_the_floor_can_be_given() -> None:
    states = stepping(1, until=1.0, count=1)
    assert LEARN_AFTER == 1
    assert LEARNING.why == "limit 600 s, the default: no interval seen to learn from"
    steps_every(states, 1.5, 0.5, 1)  # the first step after the grace: no interval yet
    assert LEARNING.learning(Learnt.of([states[0].progress])).quiet == 600.0
    steps_every(states, 2.0, 0.5, 1)
    learnt = Learnt.of([states[0].progress])
    assert (learnt.intervals, learnt.longest) == (1, 0.5)
    assert LEARNING.learning(learnt).quiet == 10.0, "the floor, LEARN_FLOOR"
    floored = Limits(None, 100.0, floor=2.0).learning(learnt)
    assert floored.quiet == 2.5 and floored.why == (
        "limit 2.5 s learnt: 5 x 0.5 s longest interval, floor 2 s")
    assert Limits(None, 100.0, floor=2.0).learning(Learnt(0.1, 1)).quiet == 2.0
    assert Limits(7.0, 100.0, floor=2.0).learning(learnt).quiet == 7.0, "--hang-timeout wins"


def test_an_interval_with_a_compilation_teaches_nothing_a_spell_busy_alone_does() -> None:
    """The limit is a step's pace: a compilation (a new input shape) inside a step is no such
    interval. A spell busy alone is learnt (its peers learn the wait anyway, and a loop whose
    every interval holds a second of Python must still learn its pace)."""
    states = stepping(1, until=1.0, count=1)
    p = states[0].progress
    steps_every(states, 1.5, 0.5, 3)
    assert (p.intervals, p.longest) == (2, 0.5)
    see(states[0], contract.EVENT_PROGRESS, 3.0, count=p.count, busy=True, loads=0, compiling=True)
    see(states[0], contract.EVENT_PROGRESS, 33.0, count=p.count, busy=True, loads=0)
    see(states[0], contract.EVENT_PROGRESS, 33.5, count=p.count + 1, busy=False, loads=0)
    assert (p.intervals, p.longest) == (2, 0.5), "30 s compiling"
    see(states[0], contract.EVENT_PROGRESS, 34.0, count=p.count + 1, busy=False, loads=0)
    assert (p.intervals, p.longest) == (3, 0.5), "the next step is learnt again"
    for t in range(35, 75):
        alive(states[0], float(t), how="cpu")
    see(states[0], contract.EVENT_PROGRESS, 75.0, count=p.count + 1, busy=False, loads=0)
    assert (p.intervals, p.longest) == (4, 41.0), "41 s busy alone"
    assert LEARNING.learning(Learnt.of([p])).quiet == 205.0


def test_a_hang_is_named_by_the_learnt_limit_which_the_message_names() -> None:
    """Sub-second steps, then rank 1 stops outside a step while rank 0 waits inside one: named
    once the learnt limit (the floor here) passed, not after the 600 s default."""
    now = [0.0]
    states = stepping(2, until=1.0, count=1)
    check = HangCheck(lambda: states, LEARNING, clock=lambda: now[0])
    last = steps_every(states, 1.2, 0.2, 40)
    see(states[0], contract.EVENT_PROGRESS, last + 0.1, count=50, busy=True, loads=0)
    now[0] = last + 9.0
    assert check() is None and check.limits.quiet == 10.0
    now[0] = last + 10.6
    check()
    now[0] = last + 12.7  # the stacks never came: judged without them
    stall = check()
    assert stall is not None and (stall.rank, stall.how) == (1, f"it is not inside a step, {STILL} 13 s")
    assert stall.limit == "limit 10 s learnt: 5 x 0.2 s longest interval, floor 10 s"
    assert "(limit 10 s learnt: 5 x 0.2 s longest interval, floor 10 s)" in \
        describe_stall(stall, "j")


def test_what_was_learnt_is_kept_across_restarts() -> None:
    now = [0.0]
    states = stepping(2, until=1.0, count=1)
    check = HangCheck(lambda: states, LEARNING, clock=lambda: now[0])
    steps_every(states, 2.0, 3.0, 5)
    now[0] = 14.0
    check()
    check.begin_attempt()
    states[:] = stepping(2, until=20.0, count=1)  # the restarted ranks: nothing shown yet
    now[0] = 21.0
    assert check() is None and check.limits.quiet == pytest.approx(15.0)


def test_a_rank_saving_or_evaluating_alone_is_no_hang() -> None:
    """Rank 0 saves for 40 s (the first save: the grace), then evaluates with progress inside;
    rank 1 waits inside its next step all along. Neither is named; a later save that takes
    far longer than the saves seen before is."""
    now = [0.0]
    states = stepping(2, until=1.0, count=1)
    check = HangCheck(lambda: states, LEARNING, clock=lambda: now[0])
    last = steps_every(states, 1.2, 0.2, 20)
    see(states[1], contract.EVENT_PROGRESS, last + 0.1, count=states[1].progress.count,
        busy=True, loads=0)
    see(states[0], contract.EVENT_PROGRESS, last, count=states[0].progress.count,
        busy=False, loads=0, section="save", sections=0)
    for t in range(5, 45, 2):
        now[0] = last + t
        check.sample(StackSample(0, IN_SLEEP))
        check.sample(StackSample(1, IN_MINDSPORE))
        assert check() is None, f"a first save of {t} s"
    see(states[0], contract.EVENT_PROGRESS, last + 45, count=states[0].progress.count,
        busy=False, loads=0, section="eval", sections=1)
    for t in range(46, 90, 2):  # an evaluation: batches go on, rank 1 still waits
        see(states[0], contract.EVENT_PROGRESS, last + t, count=states[0].progress.count + 1,
            busy=False, loads=0, section="eval", sections=1)
        now[0] = last + t + 1
        assert check() is None, f"evaluating for {t - 45} s"
    assert check.limits.frozen(states[1].progress, now[0]) and not check.limits.frozen(states[0].progress, now[0])
    assert busy_alone(states, now[0], check.limits) == [], "its batches are progress: not alone"
    end = last + 90
    see(states[0], contract.EVENT_PROGRESS, end, count=states[0].progress.count,
        busy=False, loads=0, section="save", sections=2)
    assert dict(states[0].progress.section_longest) == {"save": 45.0, "eval": 45.0}
    now[0] = end + 200.0  # 5 x 45 s since the save began: within its limit
    check()
    assert check.limits.of(states[0].progress) == 225.0 and check() is None
    now[0] = end + 230.0
    check.sample(StackSample(0, IN_SLEEP))
    check.sample(StackSample(1, IN_MINDSPORE))
    stall = check()
    assert stall is not None and stall.rank == 0
    assert stall.limit == "limit 225 s inside a save"


def test_the_rank_that_waited_on_a_save_is_judged_only_once_every_rank_is_frozen() -> None:
    """Rank 0 saves for 15 s while rank 1 waits inside its next step, past the 10 s limit: no
    hang. Rank 0 then steps on for 10 s and rank 1 never does: no hang while rank 0 steps (it
    may be rank 1 that waits). Once rank 0 waits inside a step too, both are frozen after the
    limit, and rank 1, behind, is named; the silence is every rank's, from rank 0's last step."""
    now = [0.0]
    states = stepping(2, until=1.0, count=1)
    last = steps_every(states, 1.2, 0.2, 20)
    see(states[1], contract.EVENT_PROGRESS, last + 0.1, count=states[1].progress.count,
        busy=True, loads=0)
    see(states[0], contract.EVENT_PROGRESS, last, count=states[0].progress.count,
        busy=False, loads=0, section="save", sections=0)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    now[0] = last + 14.9
    assert LIMITS.frozen(states[1].progress, now[0]) and check() is None, "a first save: the grace"
    see(states[0], contract.EVENT_PROGRESS, last + 15.0, count=states[0].progress.count + 1,
        busy=False, loads=0, section="", sections=1)
    for n in range(1, 21):  # rank 0 goes on, rank 1 never does
        see(states[0], contract.EVENT_PROGRESS, last + 15.0 + n / 2,
            count=states[0].progress.count + 1, busy=False, loads=0, section="", sections=1)
        now[0] = last + 15.1 + n / 2
        assert check() is None, f"rank 0 steps on ({n / 2:g} s)"
    see(states[0], contract.EVENT_PROGRESS, last + 25.1, count=states[0].progress.count,
        busy=True, loads=0, section="", sections=1)
    now[0] = last + 34.9
    assert check() is None, "rank 0 stepped 9.9 s ago"
    now[0] = last + 35.5
    assert check() is None, "both frozen: the stacks are awaited"
    check.sample(StackSample(0, IN_MINDSPORE))
    check.sample(StackSample(1, IN_MINDSPORE))
    now[0] = last + 35.6
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting, stall.how) == (1, (0,), "its count is behind")
    assert stall.silent_for == pytest.approx(10.6), "from rank 0's last step"


def test_a_save_or_an_evaluation_is_a_section_of_its_own_kind(counted) -> None:
    seen = []

    def save(path: str) -> str:
        seen.append(progress.snapshot()[3:5])
        if path == "bad":
            raise OSError("disk full")
        return path
    wrapped = progress.in_section(contract.SECTION_SAVE, save)
    assert wrapped("a") == "a"
    with pytest.raises(OSError, match="disk full"):
        wrapped("bad")
    assert seen == [("save", 0), ("save", 1)] and progress.snapshot()[3:5] == ("", 2)
    evaluate = progress.in_section(contract.SECTION_EVAL, lambda: wrapped("inner"))
    evaluate()
    assert seen[-1] == ("eval", 2), "a save inside an evaluation is part of it"
    worker = threading.Thread(target=wrapped, args=("b",))
    worker.start()
    worker.join()
    assert seen[-1] == ("", 3), "another thread's save is not the main thread's section"


def test_what_was_learnt_is_kept_for_the_same_command_run_again(tmp_path) -> None:
    learnt = Learnt(0.52, 7, (("save", 3.0),))
    learnt.save(str(tmp_path), ["train.py", "--epochs", "3"])
    assert Learnt.load(str(tmp_path), ["train.py", "--epochs", "3"]) == learnt
    assert Learnt.load(str(tmp_path), ["other.py"]) == Learnt(), "another job's pace"
    (tmp_path / "hang_limits.json").write_text('{"command": [], "longest": NaN, '
                                               '"intervals": 3, "sections": {}}')
    assert Learnt.load(str(tmp_path), []) == Learnt()
    assert Learnt.load(str(tmp_path / "missing"), []) == Learnt()


def test_a_rank_without_step_events_is_told_by_its_count() -> None:
    """torch and plain loops send no ``step`` events: rank 1 stays at count 7 while rank 0
    counts on (no hang: it may be rank 0 that is busy), then waits inside a call. Once both
    are frozen, rank 1 is named, outside a call, and the stall says how far it got."""
    now = [0.0]
    states = stepping(2, until=5.0, count=7)
    check = HangCheck(lambda: states, LIMITS, clock=lambda: now[0])
    for t in range(6, 40):
        see(states[0], contract.EVENT_PROGRESS, float(t), count=7 + t, busy=False, loads=0)
        now[0] = t + 0.1
        assert check() is None
    see(states[0], contract.EVENT_PROGRESS, 39.5, count=46, busy=True, loads=0)
    now[0] = 49.1
    assert check() is None, "both frozen: the stacks are awaited"
    now[0] = 51.2
    stall = check()
    assert stall is not None and (stall.rank, stall.last_step, stall.count) == (1, None, 7)
    assert ("rank 1 on host1 hangs: no progress for 12 s (--hang-timeout 10) while rank(s) 0 "
            "wait (it is not inside a step)") in describe_stall(stall, "j")


# Frozen, or busy alone -------------------------------------------------------------------------

LEARNT = Limits(timeout=None, grace=100.0, learnt=Learnt(1.0, 1))
"""A limit of 10 s learnt from the job: a rank is judged by its last sign of life, not its last
progress alone (``--hang-timeout`` judges progress)."""


def alive(state: State, at: float, how: str = "cpu,io", written: int = 10_000_000) -> None:
    """Its supervisor read ``state``'s rank move at ``at`` (``liveness.LifeWatch``)."""
    see(state, contract.EVENT_ALIVE, at, how=how, bytes_written=written, bytes_read=0)


def test_a_rank_busy_alone_is_no_hang_until_it_freezes() -> None:
    """Rank 0 writes a checkpoint its own way, outside any framework call, for 60 s: no
    progress, but its supervisor reads it move every second; rank 1 waits inside its next step
    all along. No hang, whatever its length: each check tells who is busy alone and what it
    does. Once rank 0's readings stop, it is frozen after the limit and named, with what its
    supervisor read."""
    now = [0.0]
    states = stepping(2, until=5.0)
    see(states[1], contract.EVENT_PROGRESS, 5.2, count=5, busy=True, loads=0)
    told: list[list[Busy]] = []
    check = HangCheck(lambda: states, LEARNT, clock=lambda: now[0], on_busy=told.append)
    for t in range(6, 66):
        alive(states[0], float(t))
        now[0] = t + 0.25
        assert check() is None, f"busy alone for {now[0] - 5:g} s"
    assert told[8] == [], "rank 1 waited 9.25 s: within the limit, nobody waits on anybody yet"
    assert told[9] == [Busy(0, "host0", 10.25, "writing", 100_000_000, (1,))]
    assert told[-1] == [Busy(0, "host0", 60.25, "writing", 600_000_000, (1,))]
    assert told[-1][0].text() == "rank 0 busy alone for 60 s (writing, 600 MB), rank 1 wait"
    assert states[0].progress.life == 65.0 and states[0].progress.since == 5.0
    now[0] = 74.9
    assert check() is None and [b.rank for b in told[-1]] == [0], "read alive 9.9 s ago"
    now[0] = 75.5
    assert check() is None and told[-1] == [], "both frozen: the stacks are awaited"
    check.sample(StackSample(0, ("/job/save.py:12 in write_chunk", "/job/train.py:60 in <module>")))
    check.sample(StackSample(1, IN_MINDSPORE))
    now[0] = 75.6
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting) == (0, (1,))
    assert stall.how == f"its stack is outside MindSpore, {STILL} 11 s"
    assert stall.silent_for == pytest.approx(10.6), "from rank 0's last sign of life"
    assert stall.limit == "limit 10 s learnt: 5 x 1 s longest interval, floor 10 s"
    assert describe_stall(stall, "j").splitlines()[0] == (
        "npu-launch: job j stopped: rank 0 on host0 hangs: no progress for 11 s (limit 10 s "
        "learnt: 5 x 1 s longest interval, floor 10 s) while rank(s) 1 wait in MindSpore (its "
        f"stack is outside MindSpore, {STILL} 11 s); it stopped after 5 counted calls")


def test_with_a_hang_timeout_only_progress_counts() -> None:
    """``--hang-timeout`` limits progress: the same rank 0, read alive, is frozen 10 s after its
    last progress (a rank spinning without progress is found so), and nobody is busy alone."""
    states = stepping(2, until=5.0)
    see(states[1], contract.EVENT_PROGRESS, 5.2, count=5, busy=True, loads=0)
    for t in range(6, 16):
        alive(states[0], float(t))
    p = states[0].progress
    assert (LEARNT.life(p), LIMITS.life(p)) == (15.0, 5.0)
    assert LIMITS.frozen(p, 15.5) and not LEARNT.frozen(p, 15.5)
    assert busy_alone(states, 15.5, LIMITS) == [] and len(busy_alone(states, 15.5, LEARNT)) == 1
    stall = judge(states, {}, 15.5, LIMITS)
    assert (stall.rank, stall.how, stall.silent_for) == (0, "it is not inside a step", 10.5)


@pytest.mark.parametrize(("how", "written", "doing"), [
    ("cpu,io", 1_000_000, "writing, 1 MB"), ("io", 0, "reading"),
    ("cpu,children", 0, "in a child process"), ("cpu", 0, "computing")])
def test_busy_alone_says_what_the_rank_does(how: str, written: int, doing: str) -> None:
    states = stepping(2, until=5.0)
    see(states[1], contract.EVENT_PROGRESS, 5.2, count=5, busy=True, loads=0)
    alive(states[0], 15.0, how=how, written=written)
    (busy,) = busy_alone(states, 15.6, LEARNT)
    assert busy.text() == f"rank 0 busy alone for 11 s ({doing}), rank 1 wait"
    assert busy.to_json() == {"seconds": 10.6, "doing": doing.split(",")[0], "host": "host0",
                              "bytes_written": written}


def test_a_rank_alive_inside_a_call_is_not_busy_alone() -> None:
    """Inside a framework call only progress counts: a rank waiting in a collective is not
    alive by its CPU (a reading that came as it entered the call is no sign of life)."""
    states = stepping(2, until=5.0)
    for s in states:
        see(s, contract.EVENT_PROGRESS, 5.2, count=5, busy=True, loads=0)
    alive(states[0], 15.0)
    assert states[0].progress.life == 5.0 and LEARNT.frozen(states[0].progress, 15.5)
    assert busy_alone(states, 15.5, LEARNT) == []


# Compilation -----------------------------------------------------------------------------------

def test_a_compilation_mid_run_has_the_grace() -> None:
    """Mid-run, rank 0 compiles a graph inside a call (an evaluation network's first call, a new
    input shape) for 100 s while rank 1 waits inside its next step: past the 10 s limit,
    within the grace. Its end is progress, and its interval teaches the limit nothing."""
    now = [0.0]
    states = stepping(2, until=1.0, count=1)
    last = steps_every(states, 1.2, 0.2, 10)
    p = states[0].progress
    see(states[1], contract.EVENT_PROGRESS, last + 0.1, count=states[1].progress.count,
        busy=True, loads=0)
    see(states[0], contract.EVENT_PROGRESS, last + 0.1, count=p.count, busy=True, loads=0,
        compiling=True)
    assert (p.compiling, p.in_grace, p.since, LEARNT.of(p)) == (True, False, last + 0.1, 100.0), \
        "a compile beginning is progress: its grace starts then"
    assert LEARNT.why_for(p) == "--hang-grace 100: compiling"
    check = HangCheck(lambda: states, LEARNT, clock=lambda: now[0])
    for t in (20.0, 60.0, 100.0):
        now[0] = last + t
        assert check() is None, f"compiling for {t:g} s"
    assert check.limits.frozen(states[1].progress, now[0]) and check.limits.quiet == 10.0
    see(states[0], contract.EVENT_PROGRESS, last + 100.05, count=p.count, busy=True, loads=0,
        compiling=False)
    assert (p.compiling, p.since, LEARNT.of(p)) == (False, last + 100.05, 10.0)
    intervals = p.intervals
    see(states[0], contract.EVENT_PROGRESS, last + 100.2, count=p.count + 1, busy=False, loads=0)
    assert (p.intervals, p.longest) == (intervals, pytest.approx(0.2))
    now[0] = last + 111.0  # rank 0 then hangs outside a step: judged by the step limit again
    check()
    now[0] = last + 113.1
    stall = check()
    assert stall is not None and (stall.rank, stall.waiting) == (0, (1,))
    assert stall.limit == "limit 10 s learnt: 5 x 1 s longest interval, floor 10 s"


def test_warm_up_calls_then_a_long_compile_at_start_is_no_hang() -> None:
    """As mindcv starts: after ``init()`` each rank makes a few top-level calls of cells not in
    training mode (a warm-up all-reduce, an evaluation cell: ``first-step``, the count up,
    ``trained`` 0), then compiles its training network for 15 minutes inside the call. Before,
    the first call ended the grace and the compile had the step limit: a hang named at
    start-up. The grace lasts until the first training step, whether or not the compile is
    told as one (rank 0's is, rank 1's not)."""
    limits = Limits(None, 1800.0, Learnt(1.0, 1))
    now = [0.0]
    states = [State(r, host=f"host{r}") for r in range(2)]
    for s in states:
        see(s, contract.EVENT_INITIALISED, 1.0)
        see(s, contract.EVENT_FIRST_STEP, 2.0)
        for n in range(1, 5):
            see(s, contract.EVENT_PROGRESS, 2.0 + n / 2, count=n, busy=False, loads=0, trained=0)
        see(s, contract.EVENT_PROGRESS, 4.5, count=4, busy=True, loads=0, trained=0,
            compiling=s.rank == 0)
    assert [(s.progress.in_grace, limits.of(s.progress)) for s in states] == [(True, 1800.0)] * 2
    check = HangCheck(lambda: states, limits, clock=lambda: now[0])
    for t in (20.0, 300.0, 900.0):
        now[0] = t
        assert check() is None, f"compiling for {t:g} s"
    for s in states:
        see(s, contract.EVENT_PROGRESS, 905.0, count=5, busy=False, loads=0, trained=1)
    assert [(s.progress.in_grace, s.progress.intervals, limits.of(s.progress))
            for s in states] == [(False, 0, 10.0)] * 2, "the first training step ends it"


def _rank_1_waits_after_steps(waits_at: float) -> tuple[list[float], list[State], HangCheck, float]:
    """Two ranks that stepped every 0.5 s (the limit learnt: the floor's 10 s), then rank 1
    inside its next step from ``waits_at`` seconds after the last: (the check's clock, the
    states, the check, the last step's time)."""
    now = [0.0]
    states = stepping(2, until=1.0, count=1)
    check = HangCheck(lambda: states, LEARNING, clock=lambda: now[0])
    last = steps_every(states, 1.5, 0.5, 4)
    now[0] = last + 0.1
    assert check() is None and check.limits.quiet == 10.0
    see(states[1], contract.EVENT_PROGRESS, last + waits_at, count=states[1].progress.count,
        busy=True, loads=0)
    return now, states, check, last

def test_a_spell_busy_alone_teaches_the_limit_nothing_for_any_rank() -> None:
    """Rank 0 writes alone for 40 s (read alive), rank 1 waits inside its next step: both then
    step on. Neither interval is learnt, at node 0 or on a node (one ``Lessons`` each): the
    limit stays that of the steps, and a later long step (no spell) is learnt as usual."""
    now, states, check, last = _rank_1_waits_after_steps(waits_at=0.2)
    for t in range(2, 41):
        alive(states[0], last + t, how="io", written=20_000_000)
        now[0] = last + t + 0.5
        assert check() is None, f"busy alone for {t} s"
    steps_every(states, last + 41, 0.5, 3)
    now[0] = last + 43
    check()
    assert {s.progress.longest for s in states} >= {41.0}, "the records hold the spell"
    assert check.limits.quiet == 10.0, "but the limit did not learn it"
    steps_every(states, last + 47, 0.5, 1)  # a slow step: 5 s, no spell
    now[0] = last + 47.1
    check()
    assert check.limits.learnt.longest == pytest.approx(5.0) and check.limits.quiet == 25.0


def test_a_spell_a_little_past_the_limit_ending_between_two_looks_is_not_learnt() -> None:
    """Limit 10 s; rank 0 writes alone for 10.3 s, rank 1 waits: at the last look before the
    spell ends (9.8 s into it) rank 1 is not yet past its limit, and at the next both stepped
    on. It is still no step interval: the limit stays 10 s."""
    now, states, check, last = _rank_1_waits_after_steps(waits_at=0.0)
    for t in (2.0, 4.0, 6.0, 8.0, 9.6):
        alive(states[0], last + t, how="io", written=20_000_000)
        now[0] = last + t + 0.2
        assert check() is None
    steps_every(states, last + 10.3, 0.5, 3)
    now[0] = last + 11.5
    check()
    assert max(s.progress.longest for s in states) == pytest.approx(10.3), "the records hold it"
    assert check.limits.quiet == 10.0, "but the limit did not learn it"


def test_after_the_first_training_step_its_run_judges_until_an_interval_is_seen() -> None:
    """No interval yet (a rank froze at step 3, before a progress event ended one): the first
    training step's run judges, the least of any rank's (rank 1 waited in it for rank 0's
    compilation), at least the floor; a sink of 20 s in one call is judged by 5 x its run."""
    states = [State(r, host=f"host{r}") for r in range(2)]
    for s in states:
        see(s, contract.EVENT_INITIALISED, 0.0)
        see(s, contract.EVENT_PROGRESS, 1.0, count=0, busy=True, loads=0, trained=0,
            compiling=s.rank == 0)
    see(states[0], contract.EVENT_PROGRESS, 60.0, count=0, busy=True, loads=0, trained=0)
    for s in states:
        see(s, contract.EVENT_PROGRESS, 60.4, count=1, busy=False, loads=0, trained=1)
    assert [s.progress.first_run for s in states] == [pytest.approx(0.4), pytest.approx(59.4)]
    assert [s.progress.intervals for s in states] == [0, 0]
    limits = LEARNING.learning(Learnt.of(s.progress for s in states))
    assert (limits.quiet, limits.why) == (10.0, "limit 10 s learnt: 5 x 0.4 s first step, floor 10 s")
    sink = RankRecord()
    sink.observe(Event(contract.EVENT_INITIALISED, 0), 0.0)
    sink.observe(Event(contract.EVENT_PROGRESS, 0, count=0, busy=True, loads=0, trained=0,
                       compiling=True), 1.0)
    sink.observe(Event(contract.EVENT_PROGRESS, 0, count=0, busy=True, loads=0, trained=0), 30.0)
    sink.observe(Event(contract.EVENT_PROGRESS, 0, count=1, busy=True, loads=0, trained=1), 50.0)
    assert LEARNING.learning(Learnt.of([sink])).quiet == 100.0, "5 x a 20 s sink"
