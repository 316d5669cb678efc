"""The hang check's judgement, on rank states built from events (``launcher.hangs.stalls``), and the
rank hook's progress counters (``parallel.progress``), in this process."""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Optional

import pytest

from launcher.hangs.hang_limits import Learnt, Limits
from launcher.hangs.stack_samples import StackSample
from launcher.hangs.stalls import HangCheck, describe_stall, find_stall, judge, stalled_before  # noqa
from launcher.ranks.record import RankRecord
from parallel import contract, progress
from parallel.contract import Event

LIMITS = Limits(timeout=10.0, grace=100.0)
IN_MINDSPORE = ("/py/site-packages/mindspore/graph/api.py:2432 in _exec_pip",
                "/job/train.py:40 in <module>")
IN_DATA = ("/py/site-packages/mindspore/dataset/engine/iterators.py:150 in __next__",
           "/job/train.py:38 in <module>")
IN_SLEEP = ("/job/train.py:35 in hang_here", "/job/train.py:39 in <module>")


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


def test_grace_lasts_until_the_first_progress_and_again_after_a_load() -> None:
    p = RankRecord()
    p.observe(Event(contract.EVENT_INITIALISED, 0), 1.0)
    assert (p.since, p.in_grace, LIMITS.of(p)) == (1.0, True, 100.0)
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=0, busy=True, loads=0), 5.0)
    assert (p.since, p.in_grace, p.busy) == (1.0, True, True), "entering a call is no progress"
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=1, busy=True, loads=0), 6.0)
    assert (p.since, p.in_grace) == (6.0, True), "a first batch, fetched before the compile"
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=2, busy=False, loads=0), 6.5)
    assert (p.since, p.in_grace, LIMITS.of(p), p.intervals) == (6.5, False, 10.0, 0)
    p.observe(Event(contract.EVENT_PROGRESS, 0, count=3, busy=False, loads=1), 7.0)
    assert (p.since, p.in_grace) == (7.0, True)
    p.observe(Event(contract.EVENT_STEP, 0, step=4), 8.0)
    assert (p.since, p.stepped_at, p.in_grace) == (8.0, 8.0, False)
    q = RankRecord()
    q.observe(Event(contract.EVENT_INITIALISED, 0), 1.0)
    q.observe(Event(contract.EVENT_FIRST_STEP, 0), 9.0)
    assert (q.since, q.in_grace, q.intervals) == (9.0, False, 0), "the end of the compile"


def test_a_rank_in_grace_is_not_flagged_while_others_advance() -> None:
    states = stepping(2, until=0.0, count=0)
    see(states[0], contract.EVENT_PROGRESS, 50.0, count=7, busy=False, loads=0)
    assert find_stall(states, 55.0, LIMITS) is None, "rank 1 still compiles, say"
    see(states[0], contract.EVENT_PROGRESS, 100.0, count=9, busy=False, loads=0)
    stall = find_stall(states, 101.0, LIMITS)
    assert stall is not None and (stall.rank, stall.host) == (1, "host1")


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


def test_ranks_that_stop_a_hair_apart_are_not_one_falling_behind() -> None:
    """Synchronous ranks blocked together: rank 0's last step arrived 0.3 s before rank 1's.
    Once rank 0 is past the timeout, rank 1 stepped 'within it', but only just after rank 0
    went quiet: that is everyone stopping (judged with the stacks), not rank 0 falling behind."""
    states = stepping(2, until=5.0)
    see(states[1], contract.EVENT_PROGRESS, 5.3, count=6, busy=False, loads=0)
    assert find_stall(states, 15.2, LIMITS) is None
    see(states[1], contract.EVENT_PROGRESS, 11.0, count=9, busy=False, loads=0)
    stall = find_stall(states, 15.2, LIMITS)
    assert stall is not None and stall.rank == 0, "rank 1 went on for 6 s after rank 0 stopped"


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
    assert stall is not None and (stall.rank, stall.how) == (1, "it is not inside a step")
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
    assert find_stall(states, now[0], check.limits) is None, "eval batches are not steps"
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


def test_the_rank_that_waited_on_a_save_is_silent_only_from_when_it_ended() -> None:
    """Rank 0 saves for 15 s while rank 1 waits inside its next step, past the 10 s limit. Rank
    0 steps on first, as it will by up to the hook's half second: no hang. Rank 1 is named only
    when it stays silent for the limit after the save ended, and for all of its silence."""
    states = stepping(2, until=1.0, count=1)
    last = steps_every(states, 1.2, 0.2, 20)
    see(states[1], contract.EVENT_PROGRESS, last + 0.1, count=states[1].progress.count,
        busy=True, loads=0)
    see(states[0], contract.EVENT_PROGRESS, last, count=states[0].progress.count,
        busy=False, loads=0, section="save", sections=0)
    see(states[0], contract.EVENT_PROGRESS, last + 15.0, count=states[0].progress.count + 1,
        busy=False, loads=0, section="", sections=1)
    assert states[0].progress.section_ended == last + 15.0
    assert find_stall(states, last + 15.4, LIMITS) is None
    for n in range(1, 21):  # rank 0 goes on, rank 1 never does
        see(states[0], contract.EVENT_PROGRESS, last + 15.0 + n / 2,
            count=states[0].progress.count + 1, busy=False, loads=0, section="", sections=1)
    assert find_stall(states, last + 24.9, LIMITS) is None, "9.9 s since the save ended"
    stall = find_stall(states, last + 25.1, LIMITS)
    assert stall is not None and stall.rank == 1 and stall.silent_for == pytest.approx(25.1)


def test_a_save_or_an_evaluation_is_a_section_of_its_own_kind(counted) -> None:
    seen = []

    def save(path: str) -> str:
        seen.append(progress.snapshot()[3:])
        if path == "bad":
            raise OSError("disk full")
        return path
    wrapped = progress.in_section(contract.SECTION_SAVE, save)
    assert wrapped("a") == "a"
    with pytest.raises(OSError, match="disk full"):
        wrapped("bad")
    assert seen == [("save", 0), ("save", 1)] and progress.snapshot()[3:] == ("", 2)
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
    """torch and plain loops send no ``step`` events: the message says how far the rank got."""
    states = stepping(2, until=5.0, count=7)
    for t in range(6, 40):
        see(states[0], contract.EVENT_PROGRESS, float(t), count=7 + t, busy=False, loads=0)
    stall = find_stall(states, 39.0, LIMITS)
    assert stall is not None and (stall.rank, stall.last_step, stall.count) == (1, None, 7)
    assert "rank 1 on host1 stalled after 7 counted calls: no progress for" in \
        describe_stall(stall, "j")
