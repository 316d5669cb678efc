"""The one watch loop (``launcher.run.watch.Watch``), in-process, with a fake source and group.

What every job relies on, whatever runs it: the source is started once, checked until it says
how the job ends, told before the processes are closed and after; the group is closed in a
``finally`` with ``--kill-timeout`` even when the source fails; a stop request ends the job as
interrupted with 128+signal; a stall from the tick ends it as a hang (124); ranks overdue in
their exit handlers end it as a success, closing the group stops them.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

import pytest

from launcher.config.devices import DeviceKind
from launcher.hangs.stalls import HANG_EXIT_CODE, Stall
from launcher.plan.launch_plan import LaunchPlan, StartMode, Timeouts
from launcher.run.failures import JobResult, Outcome
from launcher.run.process import Exit
from launcher.run.watch import HeldStopSignals, Watch


def _plan() -> LaunchPlan:
    return LaunchPlan(job_id="watched", log_dir="/nowhere", mode=StartMode.DYNAMIC_CLUSTER,
                      device=DeviceKind.CPU, master_addr="127.0.0.1", master_port=1, world_size=1,
                      nnodes=1, scheduler=None, ranks=(), workdir="/", foreground=False,
                      timeouts=Timeouts(kill=7.5))


class FakeGroup:
    """A process group that only records what the loop asked of it."""

    def __init__(self) -> None:
        self.closed_with: list[float] = []

    def poll(self) -> list[Exit]:
        return []

    def close(self, grace: float) -> list[Exit]:
        self.closed_with.append(grace)
        return []


class FakeSource:
    """Ends the job with ``outcome`` after ``checks`` checks; records the calls in order."""

    everything = "every fake process"

    def __init__(self, outcome: Optional[Outcome], checks: int = 3,
                 fail_before_close: bool = False) -> None:
        self.outcome, self.checks, self.fail_before_close = outcome, checks, fail_before_close
        self.calls: list[str] = []
        self.wake: Optional[threading.Event] = None

    def start(self, group: FakeGroup, wake: threading.Event) -> None:
        self.calls.append("start")
        self.wake = wake

    def check(self, group: FakeGroup, exits: list[Exit]) -> Optional[Outcome]:
        self.calls.append("check")
        self.checks -= 1
        return self.outcome if self.checks <= 0 else None

    def before_close(self, group: FakeGroup, outcome: Outcome) -> None:
        self.calls.append(f"before_close {outcome.value}")
        if self.fail_before_close:
            raise RuntimeError("the source broke")

    def after_close(self, exits: list[Exit]) -> None:
        self.calls.append("after_close")

    def conclude(self, outcome: Outcome) -> JobResult:
        self.calls.append("conclude")
        return JobResult(outcome, 3, "rank 0 failed", 0.0)

    def finished(self, elapsed: float) -> str:
        return "all done"


def _watch(source: FakeSource, tick=lambda: None) -> tuple[Watch, FakeGroup]:
    group = FakeGroup()
    return Watch(_plan(), source, group, tick, interval=0.001), group  # type: ignore[arg-type]


def test_a_job_runs_start_checks_close_in_order() -> None:
    source = FakeSource(Outcome.SUCCEEDED, checks=3)
    watch, group = _watch(source)
    result = watch.run()
    assert (result.outcome, result.exit_code, result.message) == (Outcome.SUCCEEDED, 0, "all done")
    assert source.calls == ["start", "check", "check", "check", "before_close succeeded",
                            "after_close"]
    assert group.closed_with == [7.5], "closed once, with --kill-timeout"


def test_a_failure_is_concluded_by_its_source() -> None:
    source = FakeSource(Outcome.FAILED, checks=1)
    result = _watch(source)[0].run()
    assert (result.outcome, result.exit_code, result.message) == (Outcome.FAILED, 3, "rank 0 failed")
    assert source.calls[-2:] == ["after_close", "conclude"]


def test_the_group_is_closed_even_when_the_source_fails() -> None:
    source = FakeSource(Outcome.FAILED, checks=1, fail_before_close=True)
    watch, group = _watch(source)
    with pytest.raises(RuntimeError, match="the source broke"):
        watch.run()
    assert group.closed_with == [7.5]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_request_interrupts_with_128_plus_the_signal(sig: signal.Signals) -> None:
    source = FakeSource(None)
    watch, group = _watch(source)
    threading.Timer(0.05, watch.request_stop, args=(sig,)).start()
    result = watch.run()
    assert (result.outcome, result.exit_code) == (Outcome.INTERRUPTED, 128 + sig)
    assert result.message == f"npu-launch: job watched stopped by {sig.name}: every fake process ended"
    assert result.cause is not None and result.cause.signal == sig.name
    assert group.closed_with == [7.5]


def test_a_real_signal_to_the_launcher_is_a_stop_request() -> None:
    source = FakeSource(None)
    watch, _ = _watch(source)
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.05, signal.raise_signal, args=(signal.SIGTERM,)).start()
    result = watch.run()
    assert result.exit_code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before, "the handlers are put back"


def test_a_stop_signal_held_before_the_loop_began_stops_it_at_once() -> None:
    """The restart loop holds stop signals while no watch loop runs (``HeldStopSignals``), the
    next attempt's preparation included: the watch loop that starts next takes one that came,
    and its job ends as interrupted at its first check; after it the hold is back."""
    source = FakeSource(Outcome.SUCCEEDED, checks=50)  # not taken: it would succeed
    watch, _ = _watch(source)
    with HeldStopSignals() as held:
        signal.raise_signal(signal.SIGTERM)  # as the next attempt is made ready
        result = watch.run()
        assert (result.outcome, result.exit_code) == (Outcome.INTERRUPTED, 128 + signal.SIGTERM)
        assert source.calls[:2] == ["start", "before_close interrupted"], "at the first look"
        assert held.take() is None, "taken by the loop"
        signal.raise_signal(signal.SIGHUP)
        assert held.take() == signal.SIGHUP, "held again once the loop ended"


_SIGNALLED_HOLDING_THE_WAKE_LOCK = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from test_watch import FakeSource, _watch

class Signalled(FakeSource):
    def check(self, group, exits):
        with self.wake._cond:  # what the event's own wait and clear hold
            os.kill(os.getpid(), signal.SIGTERM)
            [n for n in range(3)]  # the handler runs here, between two bytecodes
        return super().check(group, exits)

print(_watch(Signalled(None))[0].run().exit_code)
"""


def test_a_signal_while_the_loop_holds_its_wake_events_lock_still_stops_the_job() -> None:
    """In CI a launcher was still up 120 s after its SIGTERM, its ranks alive: the handler ran
    on the loop's thread while that thread held the wake event's lock (inside the event's wait
    or clear), set the event, and waited for the lock forever. Here the signal comes exactly
    then, in a child process: a loop that hangs must not hang the tests."""
    child = subprocess.run([sys.executable, "-c", _SIGNALLED_HOLDING_THE_WAKE_LOCK,
                            str(Path(__file__).parent)], capture_output=True, text=True,
                           timeout=60)
    assert child.stdout.split() == [str(128 + signal.SIGTERM)], child.stderr


def test_a_stall_from_the_tick_ends_the_job_as_a_hang() -> None:
    stall = Stall(rank=1, host="h", last_step=4, silent_for=9.0, timeout=5.0, waiting=(0,),
                  framework="MindSpore")
    ticks = iter([None, None, stall])
    source = FakeSource(None)
    result = _watch(source, tick=lambda: next(ticks))[0].run()
    assert (result.outcome, result.exit_code) == (Outcome.STALLED, HANG_EXIT_CODE)
    assert "rank 1 on h hangs: no progress for 9 s while rank(s) 0 wait in MindSpore" \
        in result.message
    assert source.calls[-1] == "after_close" and "before_close stalled" in source.calls


def test_ranks_overdue_in_their_exit_handlers_end_the_job_as_a_success() -> None:
    overdue = iter([False, False, True])
    source = FakeSource(Outcome.FAILED, checks=50)  # a loop that ignores the overdue fails
    group = FakeGroup()
    watch = Watch(_plan(), source, group, exits_overdue=lambda: next(overdue),  # type: ignore[arg-type]
                  interval=0.001)
    result = watch.run()
    assert (result.outcome, result.exit_code, result.message) == (Outcome.SUCCEEDED, 0, "all done")
    assert source.calls.count("check") == 3 and "before_close succeeded" in source.calls
    assert group.closed_with == [7.5], "closing the group stops the ranks still there"
