"""summary.json's records (``launcher.observe.summary_records``) write and read themselves: what
the monitor writes reads back as the same values, and a summary.json an older npu-launch wrote
still reads."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Optional

from launcher.observe.job_files import ReportOptions, read_job
from launcher.observe.monitor import JobMonitor, earlier_attempts
from launcher.observe.read_values import Fields, Notes
from launcher.observe.summary_records import AttemptEntry, CheckpointRecord, FilesMoved
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.restarts import AttemptRecord
from parallel.contract import SUMMARY_FILE, Event

STALLED = Cause(Outcome.STALLED, "rank", 1, "node b", 4242, None, ranks=(0, 2), time=17.5,
                consequence=Cause(Outcome.FAILED, "rank", 0, "node a", 4241, 1, "RuntimeError",
                                  "Kernel error", time=18.25))


def attempt_record(cause: Optional[Cause] = STALLED) -> AttemptRecord:
    result = JobResult(Outcome.STALLED, 124, "stalled", 19.0, cause)
    return AttemptRecord.of(2, 10.0, result, 40, ["node a", "node b"], 8, 1.5, ["node c"])


def test_an_attempt_entry_writes_what_its_record_writes_and_reads_it_back() -> None:
    record = attempt_record()
    entry = AttemptEntry.of(record, launch=3)
    written = entry.to_json()
    assert written == {**record.to_json(), "launch": 3}
    assert AttemptEntry.from_json(json.loads(json.dumps(written))) == entry
    assert entry.cause == STALLED and entry.left_out == ("node c",) and entry.duration_s == 9.0
    assert entry.who == " (rank 1 on node b)"


def test_an_attempt_without_a_cause_or_by_an_agent_says_whose_it_was() -> None:
    assert AttemptEntry.of(attempt_record(None), 0).who == ""
    agent = Cause(Outcome.FAILED, "agent", None, "node c", returncode=255)
    assert AttemptEntry.of(attempt_record(agent), 0).who == " (agent on node c)"


def test_a_checkpoint_record_reads_back_as_written() -> None:
    record = CheckpointRecord(3, 120, "node a", "/ckpt dir/rank_3/step_120.ckpt", 1764650000.5,
                              complete=True)
    doc = json.loads(json.dumps(record.to_json()))
    notes = Notes()
    assert CheckpointRecord.parse(Fields(doc, SUMMARY_FILE, "checkpoints[0].", notes)) == record
    assert notes.lines() == []


def test_files_moved_count_up_and_write_as_the_summary_had_them() -> None:
    moved = FilesMoved().plus(100, 0.5).plus(28, 0.25)
    assert moved.to_json() == {"files": 2, "bytes": 128, "seconds": 0.75}


def test_the_monitors_summary_reads_back_through_the_report(weird_tmp: Path) -> None:
    monitor = JobMonitor(str(weird_tmp), "job-1", {0: "node a", 1: "node b"}, io.StringIO(), False,
                         clock=lambda: 1764650000.0)
    for rank, host in ((0, "node a"), (1, "node b")):
        monitor.on_event(Event.parse({"event": "checkpoint", "rank": rank, "host": host, "step": 5,
                                      "path": f"/c/rank_{rank}.ckpt", "time": 1764650001.0 + rank}))
    monitor.on_transfer(10, 0.5)
    monitor.attempt_ended(attempt_record())
    summary = monitor.close("stalled", 124)
    assert summary["checkpoints_sent"] == {"files": 1, "bytes": 10, "seconds": 0.5}
    assert summary["attempts"] == [{**attempt_record().to_json(), "launch": 0}]
    job = read_job(ReportOptions.build(str(weird_tmp), None, True))
    assert job.summary.checkpoints == (
        CheckpointRecord(0, 5, "node a", "/c/rank_0.ckpt", 1764650001.0),
        CheckpointRecord(1, 5, "node b", "/c/rank_1.ckpt", 1764650002.0))
    assert (job.summary.checkpoint_files, job.summary.checkpoint_steps) == (2, (5,))
    assert [AttemptEntry.from_json(a) for a in summary["attempts"]] == earlier_attempts(str(weird_tmp))


def test_an_older_summary_json_still_reads(weird_tmp: Path) -> None:
    """Attempts as npu-launch wrote them before ``waited_s``, ``left_out`` and ``launch``; one
    whose cause is not a cause, one that is not an object: the next launch keeps what it can
    read, of its type, and numbers itself after them."""
    old = {"attempt": 0, "started_at": 5, "ended_at": 9.5, "duration_s": 4.5, "outcome": "failed",
           "exit_code": 1, "cause": {"outcome": "failed", "process": "rank", "rank": 0,
                                     "host": "vm1"}, "resumed_from": None, "nodes": 1,
           "world_size": 2}
    odd = {"attempt": "1", "outcome": "failed", "cause": "rank 0", "launch": True, "left_out": "vm2"}
    (weird_tmp / SUMMARY_FILE).write_text(json.dumps({"job_id": "old", "attempts": [old, odd, 7]}))
    read = earlier_attempts(str(weird_tmp))
    assert read[0].to_json() == {**old, "cause": Cause(Outcome.FAILED, "rank", 0, "vm1").to_json(),
                                 "waited_s": None, "left_out": [], "launch": 0}
    assert read[0].who == " (rank 0 on vm1)"
    assert (read[1].attempt, read[1].cause, read[1].launch, read[1].left_out) == (None, None, 0, ())
    assert len(read) == 2
    monitor = JobMonitor(str(weird_tmp), "job-1", {0: "vm1"}, io.StringIO(), False, clock=lambda: 20.0)
    monitor.attempt_ended(attempt_record())
    attempts = monitor.close("stalled", 124)["attempts"]
    assert [a["launch"] for a in attempts] == [0, 0, 1]
    assert attempts[0]["started_at"] == 5 and type(attempts[0]["started_at"]) is int
