"""JobMonitor: metrics.jsonl, summary.json, stall detection and the status display, fed with
real event records (and, once, with the real rank-side writer in another process)."""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path
from typing import Optional

import pytest
from helpers import REPO, exited, feed, wait_for

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.hangs.hang_limits import Learnt, Limits
from launcher.hangs.stack_samples import StackSample
from launcher.hangs.stalls import Busy, HangCheck, Stall, describe_stall
from launcher.observe.monitor import JobMonitor
from launcher.observe.status_display import table_height
from launcher.run.events import EventTail
from launcher.run.failures import Outcome
from parallel import contract
from parallel.contract import EVENT_EXITED, EVENT_JOB, METRICS_FILE, SUMMARY_FILE, Event

HOSTS = {0: "node-a", 1: "node-a", 2: "node b", 3: "node b"}


class FakeClock:
    """The monitor's injectable clock, moved by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingStream(io.StringIO):
    """A console that counts ``write`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def record(event: str, rank: int, t: float, **fields: object) -> dict:
    return {"event": event, "rank": rank, "host": HOSTS.get(rank, "elsewhere"), "pid": 100 + rank,
            "time": t, **fields}


def checkpoint(rank: int, t: float, n: int, path: str, at_step: Optional[int] = None) -> dict:
    """A rank's checkpoint event as the trainer writes it: the file and the data position it
    saved (``at_step``: where the rank says training stands, the step by default)."""
    position = {"epoch": 0, "batch_in_epoch": 0, "global_step": n if at_step is None else at_step}
    return record("checkpoint", rank, t, step=n, path=path, name=path.rsplit("/", 1)[-1],
                  size=4, sha256="0" * 64, position=position, world_size=len(HOSTS))


def step(rank: int, t: float, n: int, loss: float = 0.5, rate: float = 100.0) -> dict:
    return record("step", rank, t, step=n, epoch=0, loss=loss, samples_per_s=rate,
                  loss_scale=1024.0)


def evaluation(rank: int, t: float, epoch: int, step_: int, accuracy: Optional[float],
               loss: float) -> dict:
    return record(contract.EVENT_EVAL, rank, t, epoch=epoch, step=step_, loss=loss,
                  accuracy=accuracy, samples=360)


def make_monitor(log_dir: Path, clock: FakeClock, stream: Optional[io.StringIO] = None,
                 live: bool = False, ranks: Optional[dict] = None) -> JobMonitor:
    return JobMonitor(str(log_dir), "job-1", HOSTS if ranks is None else ranks,
                      stream if stream is not None else io.StringIO(), live, clock=clock)


def metrics(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / METRICS_FILE).read_text().splitlines()]


# metrics.jsonl and summary.json ---------------------------------------------------------------

def test_metrics_jsonl_holds_every_record_in_arrival_order(weird_tmp: Path) -> None:
    clock = FakeClock()
    monitor = make_monitor(weird_tmp, clock)
    records = [record("started", 0, 1.0, role="MS_WORKER"), record("initialised", 0, 2.0),
               step(0, 3.0, 1), record("custom", 2, 3.5, note="ünïcode"), {"event": "no rank"}]
    for r in records:
        feed(monitor, r)
    exited(monitor, 0, 0, HOSTS)
    monitor.tick()  # flushes; the file stays open for more

    lines = metrics(weird_tmp)
    assert lines[0] == {"event": EVENT_JOB, "job_id": "job-1", "time": 1000.0,
                        "ranks": {str(r): h for r, h in HOSTS.items()}}
    assert lines[1:5] == records[:4]  # the edge drops what names no rank
    assert lines[5] == {"event": EVENT_EXITED, "rank": 0, "host": "node-a", "returncode": 0,
                        "time": 1000.0, "last_progress": 3.0}, "the progress events are not kept"
    feed(monitor, step(0, 4.0, 2))
    monitor.close("succeeded", 0)
    assert metrics(weird_tmp)[-1] == step(0, 4.0, 2)


def test_summary_json_has_per_rank_results_checkpoints_and_times(weird_tmp: Path) -> None:
    clock = FakeClock(1000.0)
    monitor = make_monitor(weird_tmp, clock)
    for rank in HOSTS:
        feed(monitor, record("initialised", rank, 1001.0))
        feed(monitor, step(rank, 1002.0, 10, loss=0.9, rate=50.0 + rank))
    feed(monitor, checkpoint(0, 1003.0, 10, "/ckpt/step_10/rank_0.ckpt"))
    feed(monitor, checkpoint(1, 1003.1, 10, "/ckpt/step_10/rank_1.ckpt"))
    for rank in (0, 1, 2):
        feed(monitor, record("finished", rank, 1004.0 + rank, steps=20, final_loss=0.25,
                                samples_per_s=60.0 + rank))
        exited(monitor, rank, 0, HOSTS)
    exited(monitor, 3, -9, HOSTS)  # rank 3 never finished: its last step stands
    clock.now = 1010.5

    summary = monitor.close(Outcome.FAILED, 137, "rank 3 was killed")

    assert json.loads((weird_tmp / SUMMARY_FILE).read_text()) == summary
    assert [p.name for p in weird_tmp.iterdir() if ".tmp" in p.name] == []
    assert (summary["job_id"], summary["outcome"], summary["exit_code"]) == ("job-1", "failed", 137)
    assert (summary["started_at"], summary["ended_at"], summary["duration_s"]) == (1000.0, 1010.5,
                                                                                   10.5)
    assert summary["message"] == "rank 3 was killed"
    by_rank = {r["rank"]: r for r in summary["ranks"]}
    assert by_rank[1] == {"rank": 1, "host": "node-a", "exit_code": 0, "steps": 20,
                          "final_loss": 0.25, "samples_per_s": 61.0, "exec_mode": None,
                          "eval": None, "evals": [], "last_event": "finished",
                          "last_event_time": 1005.0,
                          "phases": {"process": None, "imports": None, "init": None,
                                     "first_step": 1.0, "training": 3.0, "exit": 0.0}}
    assert by_rank[3] == {"rank": 3, "host": "node b", "exit_code": -9, "steps": 10,
                          "final_loss": 0.9, "samples_per_s": 53.0, "exec_mode": None,
                          "eval": None, "evals": [], "last_event": "step",
                          "last_event_time": 1002.0,
                          "phases": {"process": None, "imports": None, "init": None,
                                     "first_step": 1.0, "training": 0.0, "exit": 0.0}}
    assert summary["global_samples_per_s"] == pytest.approx(60 + 61 + 62 + 53)
    assert summary["last_step"] == 20 and summary["world_size"] == 4
    assert summary["checkpoints"] == [  # ranks 2 and 3 never reported step 10: not complete
        {"rank": 0, "step": 10, "host": "node-a", "path": "/ckpt/step_10/rank_0.ckpt",
         "time": 1003.0, "complete": False},
        {"rank": 1, "step": 10, "host": "node-a", "path": "/ckpt/step_10/rank_1.ckpt",
         "time": 1003.1, "complete": False}]
    assert summary["complete_steps"] == []
    assert summary["stall"] is None


def test_a_step_is_complete_once_every_rank_on_any_host_reported_it(weird_tmp: Path) -> None:
    monitor = make_monitor(weird_tmp, FakeClock())
    for step_ in (5, 10):
        for rank in HOSTS if step_ == 5 else (0, 2):
            feed(monitor, checkpoint(rank, 1.0, step_, f"/c/{step_}/{rank}"))
    assert monitor.checkpoint_note() is None  # step 5 is complete
    summary = monitor.close("succeeded", 0)
    assert summary["complete_steps"] == [5]
    assert [(c["step"], c["host"], c["complete"]) for c in summary["checkpoints"]][-2:] == [
        (10, "node-a", False), (10, "node b", False)]

    none_complete = make_monitor(weird_tmp / "b", FakeClock())
    feed(none_complete, checkpoint(1, 1.0, 7, "/c/7/1"))
    assert none_complete.checkpoint_note() == (
        "npu-launch: checkpoints were written (step 7) but no step by every rank: none is "
        "complete to resume from")


def test_summary_and_ledger_agree_on_which_steps_are_complete(weird_tmp: Path) -> None:
    """One rule for a complete step (``parallel.checkpoints.manifest.complete_files``). Before it, summary.json
    called a step complete once every rank reported it, while node 0's ledger also needs one data
    position: ranks that disagree where training stands (here rank 3 says step 10 holds the
    position of step 9) gave a "complete" step no manifest was ever written for."""
    monitor = make_monitor(weird_tmp, FakeClock())
    ledger = CheckpointLedger(str(weird_tmp / "ledger"), world_size=len(HOSTS), data_parallel=True)
    for rank in HOSTS:
        path = weird_tmp / "ckpt" / f"rank_{rank}.ckpt"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"four")
        told = checkpoint(rank, 1.0, 10, str(path), at_step=9 if rank == 3 else None)
        told["sha256"] = hashlib.sha256(b"four").hexdigest()
        feed(monitor, told)
        event = Event.parse(told)
        assert event is not None
        ledger.record(event)
    assert ledger.complete_steps == []
    assert monitor.close("succeeded", 0)["complete_steps"] == ledger.complete_steps


def test_summary_counts_what_node_0_collected_and_sent_and_what_storage_it_found(
        weird_tmp: Path) -> None:
    monitor = make_monitor(weird_tmp, FakeClock())
    quiet = make_monitor(weird_tmp / "quiet", FakeClock()).close("succeeded", 0)
    assert quiet["checkpoints_collected"] == {"files": 0, "bytes": 0, "seconds": 0.0}
    assert quiet["checkpoint_storage"] is None
    monitor.on_collected(100, 0.25)  # from the payload server's threads, through the ledger
    monitor.on_collected(50, 0.5)
    monitor.on_transfer(100, 1.0)
    monitor.storage_found("private")
    summary = monitor.close("succeeded", 0)
    assert summary["checkpoints_collected"] == {"files": 2, "bytes": 150, "seconds": 0.75}
    assert summary["checkpoints_sent"] == {"files": 1, "bytes": 100, "seconds": 1.0}
    assert summary["checkpoint_storage"] == "private"
    on_disk = json.loads((weird_tmp / SUMMARY_FILE).read_text())
    assert on_disk["checkpoints_collected"]["bytes"] == 150


def test_missing_and_odd_fields_are_tolerated(weird_tmp: Path) -> None:
    monitor = make_monitor(weird_tmp, FakeClock(), ranks={0: "node-a"})
    feed(monitor, {"event": "step", "rank": 0})
    feed(monitor, {"event": "step", "rank": "0", "step": "7", "loss": None,
                      "samples_per_s": "fast"})
    feed(monitor, {"event": "finished", "rank": 0, "final_loss": None})
    feed(monitor, {"event": "step", "rank": "zero", "step": 9})
    feed(monitor, {"event": "custom", "rank": 5, "host": "remote-host", "time": "noon"})
    feed(monitor, {"rank": 6, "host": "no kind", "event": None})  # no event: dropped at the edge

    ranks = {r["rank"]: r for r in monitor.close("succeeded", 0)["ranks"]}
    assert (ranks[0]["steps"], ranks[0]["final_loss"], ranks[0]["samples_per_s"]) == (7, None, None)
    assert ranks[5]["host"] == "remote-host"  # a rank the mapping did not name: a remote one
    assert len(metrics(weird_tmp)) == 5  # the job line and four events: "zero" names no rank


def test_every_evaluation_reaches_the_summary_and_the_last_one_is_the_eval(weird_tmp: Path) -> None:
    monitor = make_monitor(weird_tmp, FakeClock(), ranks={0: "node-a", 1: "node-a"})
    feed(monitor, evaluation(0, 5.0, epoch=1, step_=45, accuracy=0.81, loss=0.6))
    feed(monitor, step(0, 6.0, 50))
    feed(monitor, {**evaluation(0, 9.0, epoch=2, step_=90, accuracy=0.97, loss=0.1),
                      "note": "not part of an evaluation"})
    feed(monitor, {"event": contract.EVENT_EVAL, "rank": 1, "epoch": "x", "loss": "low",
                      "accuracy": None})

    ranks = monitor.close("succeeded", 0)["ranks"]
    first = {"epoch": 1, "step": 45, "loss": 0.6, "accuracy": 0.81, "samples": 360, "time": 5.0}
    last = {"epoch": 2, "step": 90, "loss": 0.1, "accuracy": 0.97, "samples": 360, "time": 9.0}
    assert ranks[0]["eval"] == last and ranks[0]["evals"] == [first, last]
    odd = {"epoch": None, "step": None, "loss": None, "accuracy": None, "samples": None,
           "time": None}
    assert ranks[1]["eval"] == odd and ranks[1]["evals"] == [odd]
    assert [r["event"] for r in metrics(weird_tmp)].count(contract.EVENT_EVAL) == 3


def test_the_last_exec_mode_a_rank_reports_wins(weird_tmp: Path) -> None:
    monitor = make_monitor(weird_tmp, FakeClock())
    for rank in HOSTS:  # the rank hook's and parallel.init()'s initialised events
        feed(monitor, record("initialised", rank, 1.0, exec_mode="graph"))
        feed(monitor, record("initialised", rank, 1.1, exec_mode="graph", world_size=4))
    feed(monitor, {**step(1, 2.0, 5), "exec_mode": "pynative"})  # switched after init()
    feed(monitor, step(1, 3.0, 10))  # later steps do not repeat it
    feed(monitor, record("finished", 2, 4.0, steps=10, exec_mode="pynative"))
    feed(monitor, record("finished", 3, 4.0, steps=10, exec_mode="turbo"))
    feed(monitor, record("initialised", 5, 1.0))  # a script that never said

    modes = {r["rank"]: r["exec_mode"] for r in monitor.close("succeeded", 0)["ranks"]}
    assert modes == {0: "graph", 1: "pynative", 2: "pynative", 3: "graph", 5: None}


def test_close_twice_keeps_the_first_summary(weird_tmp: Path) -> None:
    clock = FakeClock()
    monitor = make_monitor(weird_tmp, clock)
    first = monitor.close("succeeded", 0)
    clock.now += 50
    assert monitor.close("failed", 1) == first
    assert json.loads((weird_tmp / SUMMARY_FILE).read_text())["outcome"] == "succeeded"


# Stalls --------------------------------------------------------------------------------------

def run_steps(monitor: JobMonitor, clock: FakeClock, ranks: tuple[int, ...], start: float,
              end: float, every: float = 1.0,
              behind: Optional[HangCheck] = None) -> Optional[Stall]:
    """Ranks in ``ranks`` step once every ``every`` seconds, the monitor ticking and the stall
    check asked after each round; the first stall it reports, if any."""
    n = 0
    clock.now = start
    while clock.now <= end:
        n += 1
        for rank in ranks:
            feed(monitor, step(rank, clock.now, n))
        monitor.tick()
        stall = behind() if behind is not None else None
        if stall is not None:
            return stall
        clock.now += every
    return None


def initialise(monitor: JobMonitor, clock: FakeClock) -> None:
    for rank in HOSTS:
        feed(monitor, record("initialised", rank, clock.now))


IN_MINDSPORE = ("/py/site-packages/mindspore/graph/api.py:2432 in _exec_pip",
                "/job/train.py:40 in <module>")
IN_SLEEP = ("/job/train.py:35 in hang_here", "/job/train.py:39 in <module>")


def stacks(behind: HangCheck, hung: int, ranks: tuple[int, ...] = tuple(HOSTS)) -> None:
    """Every node's stacks as they arrive once every rank is frozen: ``hung`` outside
    MindSpore, the others waiting inside it."""
    for rank in ranks:
        behind.sample(StackSample(rank, IN_SLEEP if rank == hung else IN_MINDSPORE))


def test_a_silent_rank_is_named_only_once_every_rank_is_frozen(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    monitor = make_monitor(weird_tmp, clock)
    behind = HangCheck(monitor.rank_states, Limits(30, 30), clock)
    initialise(monitor, clock)
    assert run_steps(monitor, clock, (0, 1, 2, 3), 1.0, 12.0, behind=behind) is None
    # rank 2 went quiet after step 12 (at t=12); the others go on: it may be them it waits for.
    assert run_steps(monitor, clock, (0, 1, 3), 13.0, 60.0, behind=behind) is None
    for t in (60.5, 72.0, 89.9):  # then they wait for it
        clock.now = t
        assert behind() is None
    clock.now = 90.5
    assert behind() is None, "every rank frozen: the stacks are awaited"
    stacks(behind, hung=2)
    clock.now = 90.6
    stall = behind()
    assert stall == Stall(rank=2, host="node b", last_step=12, silent_for=pytest.approx(30.6),
                          timeout=30, waiting=(0, 1, 3),
                          stacks=((2, IN_SLEEP), (0, IN_MINDSPORE)),
                          how="its stack is outside MindSpore", framework="MindSpore",
                          limit="--hang-timeout 30")
    assert describe_stall(stall, "job-1").splitlines()[:2] == [
        "npu-launch: job job-1 stopped: rank 2 on node b hangs: no progress for 31 s "
        "(--hang-timeout 30) while rank(s) 0-1, 3 wait in MindSpore (its stack is outside "
        "MindSpore); it stopped at step 12", "  rank 2 is at (most recent call first):"]
    assert monitor.close("stalled", 1, stall=behind.first)["stall"] == {
        "rank": 2, "host": "node b", "last_step": 12, "silent_for": pytest.approx(30.6),
        "timeout": 30.0, "also": (), "waiting": (0, 1, 3),
        "stacks": ((2, IN_SLEEP), (0, IN_MINDSPORE)),
        "how": "its stack is outside MindSpore", "limit": "--hang-timeout 30",
        "framework": "MindSpore", "count": 0, "left": False}


def test_initialised_counts_as_progress_before_the_first_step(weird_tmp: Path) -> None:
    """Rank 3 never steps after ``init()`` while the others do, then wait for it: its
    ``initialised`` is its last progress, so it is judged with them and named."""
    clock = FakeClock(100.0)
    monitor = make_monitor(weird_tmp, clock)
    behind = HangCheck(monitor.rank_states, Limits(20, 20), clock)
    initialise(monitor, clock)
    assert run_steps(monitor, clock, (0, 1, 2), 101.0, 125.0, behind=behind) is None
    clock.now = 145.5
    assert behind() is None, "every rank frozen: the stacks are awaited"
    stacks(behind, hung=3)
    clock.now = 145.6
    stall = behind()
    assert stall == Stall(rank=3, host="node b", last_step=None, silent_for=pytest.approx(20.6),
                          timeout=20, waiting=(0, 1, 2),
                          stacks=((3, IN_SLEEP), (0, IN_MINDSPORE)),
                          how="its stack is outside MindSpore", framework="MindSpore",
                          limit="--hang-timeout 20")
    assert "rank 3 on node b hangs: no progress for 21 s" in describe_stall(stall, "job-1")


def test_no_stall_when_every_rank_is_silent(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    monitor = make_monitor(weird_tmp, clock)
    behind = HangCheck(monitor.rank_states, Limits(30, 30), clock)
    initialise(monitor, clock)
    run_steps(monitor, clock, (0, 1, 2, 3), 1.0, 10.0, behind=behind)
    for t in (45.0, 100.0, 1000.0):  # a long evaluation, say: nobody steps
        clock.now = t
        assert behind() is None


def test_no_stall_before_any_rank_has_stepped(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    monitor = make_monitor(weird_tmp, clock)
    behind = HangCheck(monitor.rank_states, Limits(5, 5), clock)
    feed(monitor, record("initialised", 0, 0.0))
    clock.now = 500.0
    feed(monitor, record("initialised", 1, 500.0))
    assert behind() is None


def test_finished_or_exited_ranks_are_not_stalled(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    monitor = make_monitor(weird_tmp, clock)
    behind = HangCheck(monitor.rank_states, Limits(10, 10), clock)
    initialise(monitor, clock)
    run_steps(monitor, clock, (0, 1, 2, 3), 1.0, 3.0, behind=behind)
    feed(monitor, record("finished", 2, clock.now, steps=3))
    exited(monitor, 3, 0, HOSTS)
    assert run_steps(monitor, clock, (0, 1), 4.0, 40.0, behind=behind) is None


# Status display ------------------------------------------------------------------------------

def test_plain_status_line_at_most_every_ten_seconds(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    out = CountingStream()
    monitor = make_monitor(weird_tmp, clock, stream=out)
    initialise(monitor, clock)
    for _ in range(100):  # 2 s of ticks before any step: nothing to say
        monitor.tick()
        clock.now += 0.02
    assert out.getvalue() == ""

    for rank, rate in zip(HOSTS, (400.0, 390.0, 410.0, 343.0)):
        feed(monitor, step(rank, clock.now, 120, loss=0.31, rate=rate))
    monitor.tick()
    assert out.getvalue() == "npu-launch: step 120 | loss 0.31 (rank 0) | 1543 samples/s | slowest rank 3\n"

    run_steps(monitor, clock, (0, 1, 2, 3), clock.now + 0.5, clock.now + 25.0, every=0.5)
    assert out.getvalue().count("\n") == 3  # at t=2, 12, 22: never closer than 10 s

    for _ in range(1000):  # 20 s of ticks: one line for the steps of t=22.5..27, then quiet
        monitor.tick()
        clock.now += 0.02
    assert out.getvalue().count("\n") == 4 and out.writes == 4


def test_plain_status_line_reports_evaluations_and_a_mode_other_than_graph(
        weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    out = io.StringIO()
    monitor = make_monitor(weird_tmp, clock, stream=out)
    for rank in HOSTS:
        feed(monitor, record("initialised", rank, 0.0, exec_mode="graph"))
        feed(monitor, step(rank, 0.0, 45, loss=0.5, rate=100.0))
    monitor.tick()
    clock.now = 10.0
    for rank in HOSTS:  # the last epoch's evaluation, and no step after it
        feed(monitor, evaluation(rank, 10.0, 2, 90, accuracy=0.96, loss=0.125))
    monitor.tick()
    clock.now = 20.0
    feed(monitor, {**step(2, 20.0, 95, loss=0.5, rate=100.0), "exec_mode": "pynative"})
    feed(monitor, {**step(3, 20.0, 95, loss=0.5, rate=100.0), "exec_mode": "pynative"})
    monitor.tick()

    assert out.getvalue().splitlines() == [
        "npu-launch: step 45 | loss 0.5 (rank 0) | 400 samples/s | slowest rank 0",
        "npu-launch: step 45 | loss 0.5 (rank 0) | 400 samples/s | slowest rank 0 | "
        "held-out acc 0.96 loss 0.125 (epoch 2)",
        "npu-launch: step 45-95 | loss 0.5 (rank 0, step 45) | 400 samples/s | slowest rank 0 | "
        "held-out acc 0.96 loss 0.125 (epoch 2) | graph on ranks 0-1, pynative on ranks 2-3"]


def test_the_status_loss_is_rank_0s_latest_at_whatever_step_the_others_report() -> None:
    """One definition on every line: the latest loss of the lowest rank that reported one, named
    with its step when the ranks are not all at it. Before, the line showed the mean of every
    rank's last loss, each of its own step (ranks of a ``Model.train`` script report on their own
    clocks), changing with whichever rank reported last."""
    from launcher.observe.job_state import JobState, StatusLoss
    from launcher.observe.status_display import status_line
    from parallel.contract import Event

    def apply(into: JobState, fields: dict) -> None:
        event = Event.parse(fields)
        assert event is not None, fields
        into.apply(event, 0.0)

    state = JobState(HOSTS)
    seen = []
    for rank, n, loss in ((0, 10, 2.0), (1, 10, 4.0), (2, 11, 8.0), (1, 12, 0.5), (3, 12, 1.0)):
        apply(state, step(rank, 0.0, n, loss=loss))
        seen.append(status_line(state.ranks.values()))
    assert [line.split(" | ")[:2] for line in seen if line] == [
        ["step 10", "loss 2 (rank 0)"], ["step 10", "loss 2 (rank 0)"],
        ["step 10-11", "loss 2 (rank 0, step 10)"], ["step 10-12", "loss 2 (rank 0, step 10)"],
        ["step 10-12", "loss 2 (rank 0, step 10)"]], "the others' reports change nothing"
    no_loss = {k: v for k, v in step(0, 0.0, 12).items() if k != "loss"}
    apply(state, no_loss)
    assert StatusLoss.of(state.ranks.values()) == StatusLoss(0, 10, 2.0), "its last loss, and step"
    apply(state, step(0, 0.0, 12, loss=0.25))
    assert (status_line(state.ranks.values()) or "").startswith("step 11-12 | loss 0.25 (rank 0, step 12) |")
    pipeline = JobState(HOSTS)  # pp 2: ranks 0-1 are the first stage, whose "loss" is none
    for rank in HOSTS:
        apply(pipeline, record(contract.EVENT_LAYOUT, rank, 0.0, pp=2, pp_stage=rank // 2))
        apply(pipeline, step(rank, 0.0, 5, loss=0.75 if rank >= 2 else 0.0))
    assert (status_line(pipeline.ranks.values()) or "").startswith("step 5 | loss 0.75 (rank 2) |")


def test_live_table_is_redrawn_at_most_once_a_second(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    out = CountingStream()
    monitor = make_monitor(weird_tmp, clock, stream=out, live=True)
    initialise(monitor, clock)
    for i in range(250):  # 5 s of 20 ms ticks, a step event from every rank every tick
        for rank in HOSTS:
            feed(monitor, step(rank, clock.now, i))
        monitor.tick()
        clock.now += 0.02
    assert out.writes == 5  # t = 0, 1, 2, 3, 4 (t=5 is past the last tick)

    draws = out.getvalue()
    height, rows = table_height(len(HOSTS)), 24  # a StringIO has no size: 80x24 is assumed
    assert draws.count("\x1b[1;%dr" % (rows - height)) == 1  # the scroll region, set once
    body = draws.split("\x1b8", 1)[1]
    assert body.startswith("\x1b7") and body.endswith("\x1b8")
    assert f"\x1b[{rows - height + 1};1H" in body and "\n" not in body  # only the bottom rows


def test_live_close_lifts_the_region_and_leaves_the_final_table(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    out = io.StringIO()
    monitor = make_monitor(weird_tmp, clock, stream=out, live=True)
    feed(monitor, step(2, 0.0, 7, loss=1.5, rate=12.0))
    monitor.tick()
    clock.now = 3.0
    monitor.close("succeeded", 0)
    closing = out.getvalue().rsplit("\x1b[r", 1)[1]
    lines = closing.split("\x1b8", 1)[1].splitlines()
    assert lines[0].startswith("npu-launch job job-1  3 s  |  step 7")
    assert lines[1].split() == ["rank", "step", "loss", "samples/s", "eval", "acc", "last",
                                "event", "ago"]
    assert lines[2].split() == ["node-a:0", "-", "-", "-", "-", "-", "-"]
    assert lines[4].split() == ["node", "b:2", "7", "1.5", "12.0", "-", "step", "3", "s"]


def test_live_table_shows_the_mode_and_each_ranks_held_out_accuracy(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    out = io.StringIO()
    monitor = make_monitor(weird_tmp, clock, stream=out, live=True)
    for rank in HOSTS:
        feed(monitor, record("initialised", rank, 0.0, exec_mode="graph"))
        feed(monitor, step(rank, 1.0, 45, loss=0.4, rate=100.0))
        feed(monitor, evaluation(rank, 1.5, 1, 45, accuracy=0.9 + rank / 100, loss=0.3))
    clock.now = 2.0
    monitor.close("succeeded", 0)  # never drawn (no tick): the final table as plain lines

    lines = out.getvalue().splitlines()
    assert lines[0] == ("npu-launch job job-1  2 s  graph mode  |  step 45 | loss 0.4 (rank 0) | "
                        "400 samples/s | slowest rank 0 | held-out acc 0.915 loss 0.3 (epoch 1)")
    assert lines[3].split() == ["node-a:1", "45", "0.4", "100.0", "0.9100", "eval", "2", "s"]
    assert max(len(line) for line in lines[1:]) <= 79  # rows fit an 80-column terminal


def test_live_table_follows_a_real_terminal_and_its_resizes(weird_tmp: Path) -> None:
    master, slave = os.openpty()
    set_size(slave, rows=30, columns=100)
    stream = open(slave, "w", closefd=True)
    clock = FakeClock(0.0)
    try:
        monitor = make_monitor(weird_tmp, clock, stream=stream, live=True, ranks={0: "n", 1: "n"})
        monitor.tick()
        first = read_pty(master)
        set_size(slave, rows=40, columns=100)
        clock.now = 1.0
        monitor.tick()
        second = read_pty(master)
        monitor.close("succeeded", 0)
        closing = read_pty(master)
    finally:
        stream.close()
        os.close(master)
    assert "\x1b[1;26r" in first and "\x1b[27;1H" in first  # 30 rows less a 4-line table
    assert "\x1b[1;36r" in second and "\x1b[37;1H" in second
    assert "\x1b[r" in closing and "npu-launch job job-1" in closing


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux as the terminal")
def test_rank_lines_scroll_above_the_table_in_a_real_terminal(weird_tmp: Path) -> None:
    script = weird_tmp / "show.py"
    script.write_text(textwrap.dedent("""\
        import sys, time
        from launcher.observe.monitor import JobMonitor
        from parallel.contract import Event
        m = JobMonitor(sys.argv[1], "tmux-job", {0: "a", 1: "a"}, sys.stdout, live=True,
                       clock=iter(range(0, 1000, 2)).__next__)
        for i in range(30):
            m.on_event(Event.parse({"event": "step", "rank": i % 2, "step": i, "loss": 1.0,
                                    "time": 0}))
            sys.stdout.buffer.write(b"[a:0] line %d\\n" % i)
            sys.stdout.buffer.flush()
            m.tick()
        print("DONE", flush=True)
        sys.stdin.readline()
        """))
    session = f"npu-launch-test-{os.getpid()}"
    command = f"cd {shquote(REPO)} && {shquote(sys.executable)} {shquote(script)} {shquote(weird_tmp)}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "90", "-y", "20", command],
                   check=True)
    try:
        screen = wait_for(lambda: _pane_with(session, "DONE"), "the script in tmux")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    lines = str(screen).splitlines()
    assert lines[19 - 4 + 1].startswith("npu-launch job tmux-job")  # the table: the last 4 rows
    assert lines[19].split()[:2] == ["a:1", "29"]
    shown = [int(line.split()[-1]) for line in lines if line.startswith("[a:0] line")]
    assert shown == list(range(shown[0], 30)) and len(shown) >= 14  # none overwritten


def _pane_with(session: str, marker: str) -> str:
    out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                         text=True).stdout
    return out if marker in out else ""


def shquote(value: object) -> str:
    return "'" + str(value).replace("'", "'\\''") + "'"


def set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def read_pty(master: int) -> str:
    os.set_blocking(master, False)
    chunks = []
    while True:
        try:
            chunks.append(os.read(master, 65536))
        except BlockingIOError:
            return b"".join(chunks).decode()


# The real writer -------------------------------------------------------------------------------

def test_real_rank_writer_through_event_tail_into_the_monitor(weird_tmp: Path) -> None:
    events_path = weird_tmp / "events" / "rank_3.jsonl"
    events_path.parent.mkdir()
    code = textwrap.dedent("""\
        from parallel import contract
        from parallel import events
        events.emit("started", role="MS_WORKER")
        events.emit("initialised", exec_mode="graph")
        for n in (1, 2, 3):
            events.emit("step", step=n, epoch=0, loss=1.0 / n, samples_per_s=250.0, loss_scale=1.0)
        events.emit(contract.EVENT_EVAL, epoch=1, step=3, loss=0.5, accuracy=0.875, samples=8)
        events.emit("checkpoint", step=3, path="/ckpt/step_3/rank_3.ckpt", name="rank_3.ckpt",
                    size=4, sha256="0" * 64, world_size=4,
                    position={"epoch": 0, "batch_in_epoch": 3, "global_step": 3})
        events.emit("finished", steps=3, final_loss=0.4, samples_per_s=255.5, exec_mode="pynative")
        """)
    env = {**os.environ, "NPU_LAUNCH_EVENTS_FILE": str(events_path), "RANK_ID": "3",
           "RANK_SIZE": "4", "NPU_LAUNCH_HOST": "node b"}
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True)

    monitor = make_monitor(weird_tmp, FakeClock())
    tail = EventTail(str(events_path))
    for event in tail.read():
        monitor.on_event(event)
    exited(monitor, 3, 0, HOSTS)
    summary = monitor.close("succeeded", 0)

    written = [json.loads(line) for line in events_path.read_text().splitlines()]
    assert metrics(weird_tmp)[1:-1] == written
    assert {e["pid"] for e in written} != {os.getpid()} and written[0]["host"] == "node b"
    rank3 = summary["ranks"][3]
    assert (rank3["host"], rank3["steps"], rank3["final_loss"], rank3["samples_per_s"],
            rank3["exit_code"], rank3["last_event"]) == ("node b", 3, 0.4, 255.5, 0, "finished")
    assert rank3["last_event_time"] == written[-1]["time"]
    assert rank3["exec_mode"] == "pynative"
    assert rank3["evals"] == [{"epoch": 1, "step": 3, "loss": 0.5, "accuracy": 0.875, "samples": 8,
                               "time": written[-3]["time"]}]
    assert summary["checkpoints"] == [{"rank": 3, "step": 3, "host": "node b",
                                       "path": "/ckpt/step_3/rank_3.ckpt",
                                       "time": written[-2]["time"], "complete": False}]


def test_live_table_shows_the_ranks_furthest_behind_when_there_are_many(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    out = io.StringIO()
    ranks = {r: f"h{r // 8}" for r in range(12)}
    monitor = make_monitor(weird_tmp, clock, stream=out, live=True, ranks=ranks)
    for rank in ranks:
        feed(monitor, {"event": "step", "rank": rank, "step": 3 if rank in (5, 9) else 8})
    monitor.tick()
    rows = [line.split()[0] for line in out.getvalue().split("\x1b[2K")[3:]]
    assert len(rows) == table_height(12) - 2 == 9
    assert {"h0:5", "h1:9"} <= set(rows[:8]) and rows[8] == "..."
    assert out.getvalue().endswith("... and 4 more ranks (showing the furthest behind)\x1b8")


def test_a_restarted_job_is_judged_afresh(weird_tmp: Path) -> None:
    """After a stall and a restart (--max-restarts), the old stall, the old progress and the
    old stacks do not count: the new attempt is stopped only when its own ranks are frozen,
    and by its own stacks (rank 1 this time)."""
    clock = FakeClock(0.0)
    monitor = make_monitor(weird_tmp, clock)
    behind = HangCheck(monitor.rank_states, Limits(10, 10), clock)
    initialise(monitor, clock)
    run_steps(monitor, clock, (0, 1, 2, 3), 1.0, 5.0, behind=behind)
    clock.now = 15.5
    behind()
    stacks(behind, hung=2)
    clock.now = 15.6
    first = behind()
    assert first is not None and first.rank == 2
    for rank in (0, 1, 2, 3):  # the job stops, every rank exits, the job starts again
        exited(monitor, rank, -15, HOSTS)
    monitor.begin_attempt()
    behind.begin_attempt()
    assert behind() is None
    assert run_steps(monitor, clock, (0, 1, 2, 3), clock.now + 1, clock.now + 20, behind=behind) is None
    assert run_steps(monitor, clock, (0, 2, 3), clock.now + 1, clock.now + 20, behind=behind) is None
    stopped = clock.now - 1.0
    clock.now = stopped + 10.5
    assert behind() is None, "every rank frozen: the new attempt's stacks are awaited"
    clock.now = stopped + 10.6
    assert behind() is None, "the last attempt's stacks are not this one's"
    stacks(behind, hung=1)
    clock.now = stopped + 10.7
    stall = behind()
    assert stall is not None and (stall.rank, stall.waiting) == (1, (0, 2, 3))
    assert behind.first == first, "summary.json keeps the first stall seen"


def test_a_launch_into_an_earlier_jobs_directory_continues_its_history(weird_tmp: Path) -> None:
    """The same command run again (a resume after a stop) keeps summary.json's attempts and
    metrics.jsonl's records of the earlier launch and adds its own after them."""
    from launcher.run.failures import JobResult, Outcome
    from launcher.run.restarts import AttemptRecord
    from parallel.contract import Event
    stopped = JobResult(Outcome.INTERRUPTED, 143, "stopped", 20.0)
    for launch, (result, step) in enumerate(((stopped, 30), (JobResult(Outcome.SUCCEEDED, 0,
                                                                          "", 50.0), 60))):
        clock = FakeClock(10.0 + 40 * launch)
        monitor = make_monitor(weird_tmp, clock)
        monitor.on_event(Event.parse({"event": "step", "rank": 0, "host": "node a",
                                      "step": step, "time": clock.now}))
        monitor.attempt_ended(AttemptRecord.of(0, clock.now, result, 30 if launch else None,
                                               ["node a"], 4, 0.0, ()))
        summary = monitor.close(result.outcome.value, result.exit_code)
    assert [(a["launch"], a["outcome"], a["exit_code"], a["resumed_from"])
            for a in summary["attempts"]] == [(0, "interrupted", 143, None),
                                              (1, "succeeded", 0, 30)]
    saved = json.loads((weird_tmp / "summary.json").read_text())
    assert saved["attempts"] == summary["attempts"] and saved["outcome"] == "succeeded"
    records = metrics(weird_tmp)
    assert [r["event"] for r in records if r["event"] in ("job", "attempt")] == [
        "job", "attempt", "job", "attempt"]
    assert [r["step"] for r in records if r["event"] == "step"] == [30, 60]


# Ranks busy alone ------------------------------------------------------------------------------

def test_a_rank_busy_alone_is_said_and_its_longest_spell_kept_in_the_summary(
        weird_tmp: Path) -> None:
    clock = FakeClock(100.0)
    out = io.StringIO()
    monitor = make_monitor(weird_tmp, clock, stream=out)
    spell = Busy(0, "node-a", 34.0, "writing", 680_000_000, (1, 2, 3))
    monitor.busy_alone([spell])
    assert out.getvalue() == "npu-launch: rank 0 busy alone for 34 s (writing, 680 MB), ranks 1-3 wait\n"
    clock.now = 129.0
    monitor.busy_alone([dataclasses.replace(spell, seconds=63.0, written=900_000_000)])
    assert out.getvalue().count("\n") == 1, "while it lasts, a line every 30 s"
    clock.now = 130.5
    spell = dataclasses.replace(spell, seconds=64.5, written=1_200_000_000)
    monitor.busy_alone([spell])
    assert out.getvalue().splitlines()[-1] == (
        "npu-launch: rank 0 busy alone for 64 s (writing, 1200 MB), ranks 1-3 wait")
    clock.now = 131.0
    monitor.busy_alone([])  # rank 0 stepped on: the spell ended
    monitor.tick()
    assert [r for r in metrics(weird_tmp) if r["event"] == contract.EVENT_BUSY_ALONE] == [
        {"event": "busy-alone", "rank": 0, "host": "node-a", "time": 131.0, "seconds": 64.5,
         "doing": "writing", "bytes_written": 1_200_000_000}]
    clock.now = 200.0
    monitor.busy_alone([Busy(0, "node-a", 12.0, "reading", 0, (1,)),
                        Busy(2, "node b", 20.0, "in a child process", 0, (0, 1, 3))])
    assert out.getvalue().splitlines()[-1] == (
        "npu-launch: rank 0 busy alone for 12 s (reading), rank 1 wait; rank 2 busy alone for "
        "20 s (in a child process), ranks 0-1, 3 wait"), "a new spell is said at once"
    summary = monitor.close("succeeded", 0)  # rank 2's spell ends with the job
    assert summary["busy_alone"] == {
        "0": {"seconds": 64.5, "doing": "writing", "bytes_written": 1_200_000_000, "host": "node-a"},
        "2": {"seconds": 20.0, "doing": "in a child process", "bytes_written": 0, "host": "node b"}}
    assert json.loads((weird_tmp / SUMMARY_FILE).read_text())["busy_alone"] == summary["busy_alone"]
    quiet = make_monitor(weird_tmp / "quiet", FakeClock()).close("succeeded", 0)
    assert quiet["busy_alone"] == {}


def test_the_hang_check_tells_the_monitor_who_is_busy_alone(weird_tmp: Path) -> None:
    """The supervisors' ``alive`` readings of rank 0, quiet outside a call while ranks 1-3 wait
    inside their next step, reach the hang check through the monitor's records: no hang, and
    the console says who is busy alone, then the summary keeps the spell."""
    clock = FakeClock(0.0)
    out = io.StringIO()
    monitor = make_monitor(weird_tmp, clock, stream=out)
    behind = HangCheck(monitor.rank_states, Limits(None, 100.0, Learnt(1.0, 1)), clock,
                       on_busy=monitor.busy_alone)
    initialise(monitor, clock)
    run_steps(monitor, clock, (0, 1, 2, 3), 1.0, 5.0, behind=behind)
    for rank in (1, 2, 3):
        feed(monitor, record("progress", rank, 5.2, count=0, busy=True, loads=0))
    for t in range(6, 40):
        clock.now = float(t)
        feed(monitor, record("alive", 0, clock.now, how="cpu,io", bytes_written=20_000_000,
                             bytes_read=0))
        monitor.tick()
        assert behind() is None, f"rank 0 busy alone for {t - 5} s"
    lines = [line for line in out.getvalue().splitlines() if "busy alone" in line]
    assert lines == ["npu-launch: rank 0 busy alone for 11 s (writing, 220 MB), ranks 1-3 wait"], \
        "said once ranks 1-3 waited past the limit (10 s), then every 30 s"
    run_steps(monitor, clock, (0, 1, 2, 3), 40.0, 41.0, behind=behind)
    summary = monitor.close("succeeded", 0)
    assert summary["busy_alone"] == {"0": {"seconds": 34.0, "doing": "writing",
                                           "bytes_written": 680_000_000, "host": "node-a"}}
    assert summary["stall"] is None
    assert [r["event"] for r in metrics(weird_tmp)].count("alive") == 0


def test_the_live_table_says_who_is_busy_alone(weird_tmp: Path) -> None:
    clock = FakeClock(0.0)
    out = io.StringIO()
    monitor = make_monitor(weird_tmp, clock, stream=out, live=True)
    monitor.busy_alone([Busy(0, "node-a", 34.0, "writing", 680_000_000, (1, 2, 3))])
    assert "busy alone" not in out.getvalue(), "no line under a live table: its first row says it"
    monitor.tick()
    assert "|  rank 0 busy alone for 34 s" in out.getvalue()
