"""Restarts counted per job (``launcher.run.restarts``): the budget, the backoff between attempts, a
hang restarted like a failure, a stop signal while waiting, each attempt in summary.json; and
the pure parts of leaving a host out (``--min-nodes``: which host, the checkpoint reshaped for
fewer ranks, the global batch kept). Leaving a real host out is tested on two private hosts in
``tests/multinode/test_restarts_hosts.py``."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import (
    RANK_SCRIPTS,
    assert_no_job_processes,
    assert_one_line_error,
    npu_launch_argv,
    run_launcher,
    wait_for,
)

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.checkpoints.resume import ResumePoint
from launcher.observe.job_files import ReportOptions
from launcher.observe.report import run_report
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.restarts import Policy, blamed_host, host_to_leave_out, shrink_problem
from launcher.run.watch import HeldStopSignals
from parallel import contract
from parallel.checkpoints.manifest import DataPosition, Manifest, RankFile
from parallel.contract import Event

JOB = str(RANK_SCRIPTS / "plain_job.py")  # plain-Python ranks: no MindSpore process
CPU = ("--device", "cpu", "--cards", "2")


def _attempts(logs: Path) -> list[dict]:
    return json.loads((logs / "summary.json").read_text())["attempts"]


def test_restarts_back_off_and_each_attempt_is_in_the_summary(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--max-restarts", "2", "--restart-backoff", "0.5", "--job-id",
                          "backoff", "--log-dir", str(logs), JOB, "--fail-at-attempt", "0:1",
                          "--fail-at-attempt", "1:0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restart 1 of 2 in 0.5 s after: job backoff failed: rank 1" in result.stderr
    assert "restart 2 of 2 in 1 s after: job backoff failed: rank 0" in result.stderr
    attempts = _attempts(logs)
    assert [(a["attempt"], a["outcome"], a["exit_code"]) for a in attempts] == [
        (0, "failed", 1), (1, "failed", 1), (2, "succeeded", 0)]
    assert [(a["cause"] or {}).get("rank") for a in attempts] == [1, 0, None]
    assert [(a["cause"] or {}).get("exception") for a in attempts] == [
        "RuntimeError", "RuntimeError", None]
    assert [a["waited_s"] for a in attempts] == [0, 0.5, 1.0]
    note = re.search(r"npu-launch: 3 attempts \(2 restart\(s\) of 2\): failed \(rank 1 on .+\) "
                     r"after [\d.]+ s; failed \(rank 0 on .+\) after [\d.]+ s; succeeded after",
                     result.stderr)
    assert note, result.stderr[-2000:]
    for before, after in zip(attempts, attempts[1:]):
        assert after["started_at"] - before["ended_at"] >= after["waited_s"], (before, after)
    assert all(a["duration_s"] > 0 and a["nodes"] == 1 and a["world_size"] == 2
               and a["resumed_from"] is None and a["left_out"] == [] for a in attempts)
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [r["attempt"] for r in records if r.get("event") == "attempt"] == [0, 1, 2]
    report = run_launcher("report", "--no-plot", str(logs))
    assert report.returncode == 0, report.stderr
    assert "attempts:  launch  attempt  outcome" in report.stdout and "rank 1 on " in report.stdout
    assert_no_job_processes("backoff")


def test_the_budget_is_spent_and_the_last_failure_ends_the_job(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--max-restarts", "1", "--restart-backoff", "0", "--job-id",
                          "spent", "--log-dir", str(logs), JOB, "--fail-at-attempt", "0:0",
                          "--fail-at-attempt", "1:1")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "restart 1 of 1 after: job spent failed: rank 0" in result.stderr
    assert "restart 2" not in result.stderr
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["root_cause"]["rank"] == 1
    assert [a["outcome"] for a in summary["attempts"]] == ["failed", "failed"]
    assert_no_job_processes("spent")


def test_a_hang_is_restarted_like_a_failure(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--max-restarts", "1", "--restart-backoff", "0", "--hang-timeout",
                          "4", "--job-id", "hang-restart", "--log-dir", str(logs), JOB,
                          "--steps", "4", "--hang-rank", "1", "--hang-at-step", "2",
                          "--hang-in-attempt", "0", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restart 1 of 1 after: job hang-restart stopped: rank 1 on " in result.stderr, \
        result.stderr
    # The silence shown is the check's (4 s or a little more on a busy machine); the limit is 4.
    assert re.search(r" hangs: no progress for \d+ s \(--hang-timeout 4\)", result.stderr), \
        result.stderr
    attempts = _attempts(logs)
    assert [(a["outcome"], a["exit_code"]) for a in attempts] == [("stalled", 124),
                                                                  ("succeeded", 0)]
    assert attempts[0]["cause"]["rank"] == 1
    assert_no_job_processes("hang-restart")


def test_a_stop_signal_while_waiting_to_restart_ends_the_job_at_once(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    proc = subprocess.Popen(npu_launch_argv(*CPU, "--max-restarts", "1", "--restart-backoff",
                                            "600", "--job-id", "waiting", "--log-dir", str(logs),
                                            JOB, "--fail-at-attempt", "0:0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (logs / "metrics.jsonl").exists() and '"event": "attempt"' in
                 (logs / "metrics.jsonl").read_text(), "the first attempt to end", timeout=300)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "restart 1 of 1 in 600 s after: job waiting failed: rank 0" in err
    assert "job waiting stopped by SIGTERM while waiting to restart (nothing was running)" in err
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["outcome"] == "interrupted" and len(summary["attempts"]) == 1
    assert_no_job_processes("waiting")


@pytest.mark.parametrize("args, needles", [
    (("--restart-backoff", "2"), ["--restart-backoff is about restarts", "--max-restarts N"]),
    (("--max-restarts", "1", "--restart-backoff", "9", "--restart-backoff-max", "3"),
     ["--restart-backoff-max 3 is shorter than --restart-backoff 9"]),
    (("--max-restarts", "1", "--restart-backoff", "-1"), ["--restart-backoff -1.0: expected"]),
    (("--max-restarts", "1", "--restart-backoff-max", "inf"), ["--restart-backoff-max inf"]),
    (("--max-restarts", "1", "--min-nodes", "0"), ["--min-nodes 0: expected 1-1024"]),
    (("--max-restarts", "1", "--min-nodes", "1"),
     ["--min-nodes leaves a failing host out of a multi-node job; this job runs on this host"]),
])
def test_bad_restart_options_are_one_line_errors(weird_tmp: Path, args, needles) -> None:
    result = run_launcher("--device", "cpu", "--dry-run", *args, JOB, cwd=weird_tmp)
    assert_one_line_error(result, *needles)


# The policy, pure ------------------------------------------------------------------------------

def test_the_backoff_doubles_up_to_its_cap() -> None:
    policy = Policy(max_restarts=10, backoff=0.5, backoff_max=3.0)
    assert [policy.wait_before(k) for k in range(0, 7)] == [0, 0.5, 1, 2, 3, 3, 3]
    assert Policy(5, 0.0, 60.0).wait_before(3) == 0
    assert Policy(1000, 1.0, 60.0).wait_before(1000) == 60.0, "no overflow far out"


def test_by_default_the_first_restart_comes_at_once_and_the_backoff_begins_with_the_second() -> None:
    policy = Policy(max_restarts=10, backoff=1.0, backoff_max=4.0, first_at_once=True)
    assert [policy.wait_before(k) for k in range(0, 7)] == [0, 0, 1, 2, 4, 4, 4]


def _failed(host) -> JobResult:
    return JobResult(Outcome.FAILED, 1, "failed", 0.0, Cause(Outcome.FAILED, "rank", 0, host))


def test_a_host_is_left_out_after_two_failures_in_a_row_while_enough_remain() -> None:
    hosts = ("a", "b", "c")
    blamed = [blamed_host(_failed(h)) for h in ("b", "c", "c")]
    assert blamed == ["b", "c", "c"]
    assert host_to_leave_out(blamed, hosts, min_nodes=2) == "c"
    assert host_to_leave_out(blamed, hosts, min_nodes=3) is None, "3 must remain"
    assert host_to_leave_out(blamed, hosts, min_nodes=None) is None, "without --min-nodes"
    assert host_to_leave_out(blamed[:2], hosts, min_nodes=1) is None, "b, then c: no one twice"
    assert host_to_leave_out(["c"], hosts, min_nodes=1) is None, "once is not enough"
    assert host_to_leave_out(["x", "x"], hosts, min_nodes=1) is None, "not a host of the job"
    assert host_to_leave_out([None, None], hosts, min_nodes=1) is None
    interrupted = JobResult(Outcome.INTERRUPTED, 130, "", 0.0, Cause(Outcome.INTERRUPTED))
    assert blamed_host(interrupted) is None


def test_the_global_batch_must_split_over_the_ranks_left() -> None:
    assert shrink_problem(4, 2, 64) is None
    assert shrink_problem(4, 3, 48) is None
    assert shrink_problem(4, 3, 64) == ("the global batch of 64 (over 4 ranks) does not split "
                                        "over 3 ranks")
    assert shrink_problem(4, 3, None) is None, "a script's own reader: its own business"
    assert shrink_problem(2, 0, 64) == "no rank would remain"


def _checkpoint(rank: int, step: int, host: str, folder: Path) -> Event:
    path = folder / host / f"step_{step}" / f"rank_{rank}.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"params")
    return Event.parse({"event": contract.EVENT_CHECKPOINT, "rank": rank, "host": host,
                        "step": step, "path": str(path), "name": path.name, "size": 6,
                        "sha256": hashlib.sha256(b"params").hexdigest(),
                        "position": {"epoch": 1, "batch_in_epoch": 0, "global_step": step}})


def test_a_complete_step_is_reshaped_for_fewer_ranks_and_the_ledger_forgets_the_redone(
        tmp_path: Path) -> None:
    ledger = CheckpointLedger(str(tmp_path / "logs"), 4, data_parallel=True)
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    for rank, host in hosts.items():
        ledger.record(_checkpoint(rank, 22, host, tmp_path))
    for rank in (0, 2):  # step 30 never completed: b failed first
        ledger.record(_checkpoint(rank, 30, hosts[rank], tmp_path))
    point = ledger.resume_point()
    assert point is not None and point.step == 22
    smaller = point.for_world(2)
    manifest = Manifest.from_json(smaller.manifest)
    assert (manifest.world_size, [f.rank for f in manifest.files]) == (2, [0, 1])
    assert set(smaller.paths) == set(smaller.replicas) == {0, 1}
    assert ResumePoint.from_dict(json.loads(json.dumps(smaller.__dict__))).step == 22

    ledger.reshape(2, (), resumed=22)
    assert ledger.complete_steps == [22]
    ledger.record(_checkpoint(0, 30, "a", tmp_path))
    assert ledger.complete_steps == [22], "rank 2's old report of step 30 is forgotten"
    made = ledger.record(_checkpoint(1, 30, "a", tmp_path))
    assert made is not None and made.world_size == 2 and ledger.complete_steps == [22, 30]
    assert made.position == DataPosition(1, 0, 30)
    assert [f.rank for f in made.files] == [0, 1] and isinstance(made.files[0], RankFile)


def test_the_report_lists_the_attempts(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # Written before attempts named their launch: the report shows "-" for it.
    attempt = {"attempt": 0, "outcome": "failed", "duration_s": 12.5, "resumed_from": None,
               "nodes": 2, "world_size": 4, "waited_s": 0,
               "cause": {"process": "rank", "rank": 3, "host": "vm2"}}
    summary = {"job_id": "j", "outcome": "succeeded", "exit_code": 0, "ranks": [],
               "attempts": [attempt, {**attempt, "attempt": 1, "outcome": "succeeded",
                                      "resumed_from": 22, "nodes": 1, "world_size": 2,
                                      "waited_s": 1.0, "cause": None},
                            "not an attempt"]}
    (logs / "summary.json").write_text(json.dumps(summary))
    out = io.StringIO()
    run_report(ReportOptions.build(str(logs), None, True), out)
    text = out.getvalue()
    assert 'skipped summary.json:attempts[2]: not an object, got "not an attempt"' in text
    rows = [line.split() for line in text.splitlines()
            if line.startswith("  ") and ("failed" in line or "step 22" in line)]
    assert rows == [["-", "0", "failed", "12.5", "-", "2", "4", "0.0", "rank", "3", "on", "vm2"],
                    ["-", "1", "succeeded", "12.5", "step", "22", "1", "2", "1.0"]], text


def _failed_rank(rank: int, exception: str = "RuntimeError") -> JobResult:
    return JobResult(Outcome.FAILED, 1, f"npu-launch: job j failed: rank {rank}", 0.0,
                     Cause(Outcome.FAILED, "rank", rank, "h", 10, 1, exception, "boom"))


def test_a_restart_cannot_help_only_after_the_same_failure_twice_with_nothing_newer() -> None:
    from launcher.run.restarts import (
        BEFORE_ANY_PROGRESS,
        NO_PROGRESS_EXIT_CODE,
        FailurePoint,
        cannot_help,
        stop_restarting,
    )
    first = FailurePoint.of(_failed_rank(1), ("step", 50), None)
    assert not cannot_help(None, first), "one failure says nothing yet"
    assert cannot_help(first, FailurePoint.of(_failed_rank(1), ("step", 50), None))
    assert not cannot_help(first, FailurePoint.of(_failed_rank(1), ("step", 51), None)), "progress"
    assert not cannot_help(first, FailurePoint.of(_failed_rank(0), ("step", 50), None))
    assert not cannot_help(first, FailurePoint.of(_failed_rank(1, "OSError"), ("step", 50), None))
    unread = JobResult(Outcome.FAILED, 1, "", 0.0, Cause(Outcome.FAILED, "rank", 1, "h", 11, 1))
    assert cannot_help(first, FailurePoint.of(unread, ("step", 50), None)), \
        "its exit seen before its error report: the same failure still"
    assert FailurePoint.of(unread, ("step", 50), None).told(first) == first
    on_report = JobResult(Outcome.FAILED, 1, "", 0.0, Cause(Outcome.FAILED, "rank", 1, "h", 12,
                                                            None, "RuntimeError", "boom"))
    assert cannot_help(FailurePoint.of(on_report, ("step", 50), None), first), \
        "stopped on its error report before it exited (no return code): the same failure still"
    other_code = JobResult(Outcome.FAILED, 2, "", 0.0, Cause(Outcome.FAILED, "rank", 1, "h", 12,
                                                             2, "RuntimeError", "boom"))
    assert not cannot_help(first, FailurePoint.of(other_code, ("step", 50), None)), \
        "another return code"
    assert not cannot_help(first, FailurePoint.of(_failed_rank(1), ("step", 50), 44)), \
        "a newer complete checkpoint: the next attempt starts elsewhere"
    assert not cannot_help(FailurePoint.of(_failed_rank(1), None, None),
                           FailurePoint.of(_failed_rank(1), None, None)), "where unknown: restart"
    before_any = FailurePoint.of(_failed_rank(1), BEFORE_ANY_PROGRESS, None)
    assert cannot_help(before_any, FailurePoint.of(_failed_rank(1), BEFORE_ANY_PROGRESS, None)), \
        "no step and no progress twice, the same cause: the same failure"
    assert not cannot_help(before_any, FailurePoint.of(_failed_rank(1), ("count", 3), None))
    assert not cannot_help(before_any, FailurePoint.of(_failed_rank(1), None, None))
    assert not cannot_help(before_any, FailurePoint.of(_failed_rank(0), BEFORE_ANY_PROGRESS, None))
    assert not cannot_help(before_any, FailurePoint.of(_failed_rank(1), BEFORE_ANY_PROGRESS, 8)), \
        "a complete checkpoint came between: the next attempt starts elsewhere"
    assert stop_restarting(_failed_rank(1), before_any).message.splitlines()[-1] == (
        "npu-launch: not restarting: the last two attempts failed before any step or progress "
        "with the same root cause (rank 1, RuntimeError) and no complete checkpoint: a restart "
        "cannot help (exit 93)")
    stopped = stop_restarting(_failed_rank(1), FailurePoint.of(_failed_rank(1), ("count", 7), 44))
    assert stopped.exit_code == NO_PROGRESS_EXIT_CODE == 93
    assert stopped.message.splitlines()[-1] == (
        "npu-launch: not restarting: the last two attempts failed at progress count 7 with the "
        "same root cause (rank 1, RuntimeError) and no complete checkpoint newer than step 44: "
        "a restart cannot help (exit 93)")


def test_the_same_failure_before_any_step_twice_stops_the_restarts_with_exit_93(
        weird_tmp: Path) -> None:
    """Every rank initialises, then rank 1 raises before any step or progress, every time: the
    second failure stops the job (exit 93) instead of spending the whole budget."""
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--max-restarts", "3", "--restart-backoff", "0", "--job-id",
                          "no-progress", "--log-dir", str(logs), JOB, "--fail-rank", "1")
    assert result.returncode == 93, result.stderr[-3000:]
    assert "restart 1 of 3 after: job no-progress failed: rank 1" in result.stderr
    assert "restart 2 " not in result.stderr
    # The exception is known once a sighting of either failure read the rank's error report.
    assert re.search(r"^npu-launch: not restarting: the last two attempts failed before any step "
                     r"or progress with the same root cause \(rank 1, (ValueError|failed)\) and "
                     r"no complete checkpoint: a restart cannot help \(exit 93\)$", result.stderr,
                     re.MULTILINE), result.stderr[-3000:]
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["exit_code"] == 93
    assert [(a["outcome"], a["exit_code"]) for a in summary["attempts"]] == [("failed", 1)] * 2
    assert_no_job_processes("no-progress")


def test_a_failure_before_communication_is_not_restarted_and_one_line_says_why(
        weird_tmp: Path) -> None:
    """A script that initialises no communication and fails: the budget goes unused, and with
    --max-restarts given one line after the failure says why (none without it)."""
    script = weird_tmp / "fails.py"
    script.write_text('raise RuntimeError("always")\n')
    result = run_launcher(*CPU, "--max-restarts", "3", "--restart-backoff", "0", "--job-id",
                          "unrestarted", "--log-dir", str(weird_tmp / "logs"), str(script))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "restart 1" not in result.stderr
    said = [line for line in result.stderr.splitlines() if "not restart" in line]
    assert len(said) == 1 and re.fullmatch(
        r"npu-launch: not restarted: rank [01] failed before every rank had initialised "
        r"communication \(MindSpore's init\(\) or torch's init_process_group; a failure there "
        r"repeats, and a script that calls neither is never restarted\)", said[0]), result.stderr
    assert result.stderr.index("failed: rank") < result.stderr.index(said[0]), "after the failure"
    summary = json.loads((weird_tmp / "logs" / "summary.json").read_text())
    assert said[0] in summary["message"] and len(summary["attempts"]) == 1
    plain = run_launcher(*CPU, "--job-id", "unrestarted", "--log-dir", str(weird_tmp / "again"),
                         str(script))
    assert plain.returncode == 1 and "not restarted" not in plain.stderr, plain.stderr
    assert_no_job_processes("unrestarted")


def test_the_line_names_the_rule_that_applied() -> None:
    from launcher.run.restarts import not_restarted
    assert not_restarted(_failed_rank(2), 3) == (
        "npu-launch: not restarted: rank 2 failed before it called init() (MindSpore's, or "
        "torch's init_process_group; a failure there repeats on any host)")
    nobody = JobResult(Outcome.FAILED, 1, "", 0.0, Cause(Outcome.FAILED, "agent", None, "h"))
    assert not_restarted(nobody, 3).startswith(
        "npu-launch: not restarted: the job failed before every rank had called init() (")
    hung = JobResult(Outcome.STALLED, 124, "", 0.0, Cause(Outcome.STALLED, "rank", 1, "h"))
    assert not_restarted(hung, None).startswith(
        "npu-launch: not restarted: rank 1 hung before every rank had initialised communication (")


RESUMING = str(RANK_SCRIPTS / "resuming_job.py")


def test_the_same_command_run_again_records_the_step_it_resumed_from(weird_tmp: Path) -> None:
    """The first launch completes step 4 and fails at step 6; the same command run again into
    its log directory resumes from step 4 on its own (no NPU_LAUNCH_RESUME_STEP: it is no
    restart): its attempt says so, and the report tells the two launches apart."""
    logs = weird_tmp / "logs"
    command = ("--device", "cpu", "--cards", "2", "--job-id", "again", "--log-dir", str(logs),
               RESUMING, "--fail-fresh", "1")
    first = run_launcher(*command)
    assert first.returncode == 1, first.stderr[-3000:]
    second = run_launcher(*command)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "rank 1 resumed from step 4" in second.stdout, second.stdout
    assert [(a["launch"], a["attempt"], a["outcome"], a["resumed_from"])
            for a in _attempts(logs)] == [(0, 0, "failed", None), (1, 0, "succeeded", 4)]
    report = run_launcher("report", "--no-plot", str(logs))
    assert report.returncode == 0, report.stderr
    rows = [line.split() for line in report.stdout.splitlines()
            if line.startswith("  ") and ("failed" in line or "succeeded" in line)]
    assert [row[:3] for row in rows] == [["0", "0", "failed"], ["1", "0", "succeeded"]], \
        report.stdout
    assert rows[0][4] == "-" and rows[1][4:6] == ["step", "4"], report.stdout
    assert_no_job_processes("again")


def test_a_stop_signal_between_attempts_is_held_for_the_restart_loop() -> None:
    """From an attempt's end to the backoff no watch loop notes signals: without the hold, a
    SIGTERM there (as the diagnosis runs, or the card re-check waits) killed npu-launch before
    it wrote summary.json (the test above, on a loaded machine)."""
    with HeldStopSignals() as held:
        os.kill(os.getpid(), signal.SIGTERM)
        assert held.take() == signal.SIGTERM and held.take() is None


def test_a_stop_signal_held_and_not_taken_is_delivered_as_it_would_have_been() -> None:
    came: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: came.append(signum))
    try:
        with HeldStopSignals():
            os.kill(os.getpid(), signal.SIGHUP)
            assert came == []
        assert came == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, previous)
