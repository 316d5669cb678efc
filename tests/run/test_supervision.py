"""Supervision of real rank processes: success, failure, kill -9, hang before init, signals.

The ranks are plain Python (``rank_scripts/plain_job.py``: ms_job.py's flags, the contract's
events written by the script, peers met over MASTER_PORT), so these jobs start no MindSpore
process at all. A one-rank MindSpore cluster in the foreground is ``ranks/test_train_digits.py``'s
(its switch to PyNative after ``init()``); a hang whose victim waits inside MindSpore is
``ranks/test_hangs.py``'s.

Every test ends by asserting that no process of the job is left (found by the job id in the
environment, plus every pid seen while the job ran). Time bounds here are not benchmarks: each
misbehaving job would otherwise run for an hour, so finishing at all proves the mechanism.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest
from helpers import (
    RANK_SCRIPTS,
    TESTS,
    alive,
    assert_no_job_processes,
    checksums,
    guardian_pids,
    initialised,
    job_pids,
    run_launcher,
    start_job,
    wait_for,
    worker_pid,
)

JOB = str(RANK_SCRIPTS / "plain_job.py")


def _launch(tmp: Path, job_id: str, *script_args: str, extra: tuple = (),
            script: str = JOB) -> subprocess.Popen:
    return start_job(tmp / "logs", job_id, script, *script_args, options=extra)


def _root_cause(tmp: Path) -> dict:
    return json.loads((tmp / "logs" / "summary.json").read_text())["root_cause"]


def test_two_ranks_train_to_identical_parameters(weird_tmp: Path) -> None:
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "ok-job", "--log-dir",
                          str(weird_tmp / "logs"), JOB, "--steps", "4")
    assert result.returncode == 0, result.stderr
    sums = checksums(result.stdout)
    host = socket.gethostname()
    assert set(sums) == {f"[{host}:0]", f"[{host}:1]"}, result.stdout
    assert len(set(sums.values())) == 1, f"ranks disagree: {sums}"
    assert "finished: 2 rank(s) exited 0" in result.stderr
    assert _root_cause(weird_tmp) is None
    logs = weird_tmp / "logs"
    assert not (logs / "scheduler.log").exists(), "no rank imported MindSpore: no scheduler"
    assert (logs / "rank_0.log").exists()
    assert "rank 1 of 2 up, RANK_ID=1" in (logs / "rank_1.log").read_text()
    assert_no_job_processes("ok-job")


def test_failing_rank_is_the_root_cause(weird_tmp: Path) -> None:
    proc = _launch(weird_tmp, "fail-job", "--fail-rank", "1", "--sleep-after-init", "3600",
                   "--linger-after-raise", "3600")  # ended by its report, not by its exit
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "failed: rank 1 on" in err and "raised ValueError" in err
    assert "ValueError: boom on rank 1" in err
    assert "last lines of" in err and "rank_1.log" in err
    assert "    | ValueError: boom on rank 1" in err, "the traceback reached the log first"
    cause = _root_cause(weird_tmp)
    assert {k: cause[k] for k in ("outcome", "process", "rank", "host", "exception", "error")} == {
        "outcome": "failed", "process": "rank", "rank": 1, "host": socket.gethostname(),
        "exception": "ValueError", "error": "boom on rank 1"}
    assert isinstance(cause["pid"], int) and isinstance(cause["time"], float)
    assert_no_job_processes("fail-job")


def test_a_rank_that_ignores_sigterm_is_killed_by_the_teardown(weird_tmp: Path) -> None:
    """Rank 1 fails; rank 0 ignores SIGTERM: the launcher's teardown must SIGKILL it after
    --kill-timeout, and see it exit so, before the launcher itself exits (the parent-death
    signal would kill it later anyway: the exit recorded in metrics.jsonl tells them apart)."""
    proc = _launch(weird_tmp, "stubborn", "--fail-rank", "1", "--sleep-after-init", "3600",
                   "--linger-after-raise", "3600", "--ignore-sigterm", "0",
                   extra=("--kill-timeout", "1"))
    wait_for(lambda: job_pids("stubborn"), "the job's processes")
    seen = tuple(job_pids("stubborn"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "raised ValueError" in err, err[-3000:]
    exits = [json.loads(line) for line in (weird_tmp / "logs" / "metrics.jsonl").read_text().splitlines()
             if '"exited"' in line]
    assert {(e["rank"], e["returncode"]) for e in exits if e["rank"] == 0} == {(0, -signal.SIGKILL)}
    assert_no_job_processes("stubborn", seen)


def test_kill_9_of_a_rank_ends_the_job(weird_tmp: Path) -> None:
    proc = _launch(weird_tmp, "kill-job", "--sleep-after-init", "3600")
    wait_for(lambda: initialised(weird_tmp / "logs", range(2)), "both ranks initialised")
    seen = tuple(job_pids("kill-job"))
    victim = worker_pid("kill-job", 1)
    psutil.Process(victim).kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "rank 1 on" in err and f"(pid {victim}) killed by SIGKILL" in err
    cause = _root_cause(weird_tmp)
    assert (cause["rank"], cause["pid"], cause["returncode"], cause["exception"]) == (
        1, victim, -signal.SIGKILL, None)
    assert_no_job_processes("kill-job", seen)


def test_a_rank_killed_by_its_own_fault_shows_where_in_the_failure_block(weird_tmp: Path) -> None:
    """A native fault leaves no error report: the rank hook's faulthandler prints the Python line
    the rank died on into its log, and the failure block's log tail shows it."""
    proc = _launch(weird_tmp, "segv-job", "--segfault-rank", "1", "--sleep-after-init", "3600")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGSEGV, err
    assert "rank 1 on" in err and "killed by SIGSEGV" in err, err
    assert "    | Fatal Python error: Segmentation fault" in err, err
    assert f'    |   File "{JOB}", line ' in err and " in <module>" in err, err
    assert_no_job_processes("segv-job")


@pytest.mark.parametrize("exit_code", [None, 3])
def test_a_crash_after_a_clean_end_counts_as_finished_and_says_so(weird_tmp: Path,
                                                                  exit_code) -> None:
    """Rank 1 faults in the interpreter's teardown, after its exit handlers, as MindSpore's own
    exit handler sometimes does: after a clean end the job succeeds and one line names the
    rank and the signal; after ``sys.exit(3)`` the crash is the failure it always was."""
    job = f"teardown-{exit_code}"
    proc = _launch(weird_tmp, job, "--segfault-at-exit", "1",
                   *(("--exit-code", str(exit_code)) if exit_code is not None else ()))
    out, err = proc.communicate(timeout=120)
    assert len(set(checksums(out).values())) == 1, out
    log = (weird_tmp / "logs" / "rank_1.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
    if exit_code is None:
        assert proc.returncode == 0, err
        assert (f"npu-launch: counted as exited 0: rank 1 on {socket.gethostname()} (SIGSEGV): "
                "died in its exit handlers after its script ended cleanly") in err, err
        assert _root_cause(weird_tmp) is None
    else:
        assert proc.returncode == 128 + signal.SIGSEGV, err
        assert "rank 1 on" in err and "killed by SIGSEGV" in err and "counted as" not in err, err
    assert_no_job_processes(job)


@pytest.mark.parametrize("exit_code", [None, 3])
def test_a_sigterm_npu_launch_did_not_send_after_a_clean_end_counts_as_finished(
        weird_tmp: Path, exit_code) -> None:
    """Rank 1 leaves first; rank 0, in its exit handlers, is then killed by SIGTERM, as
    MindSpore's cluster kills a rank once a peer left it first (its scheduler reports the peer
    timed out, or is gone: "Kill this process with SIGTERM."). Before, the job failed, exit 143,
    though every script had ended cleanly; now it succeeds with one line that says so. After
    ``sys.exit(3)`` the SIGTERM is the failure it always was."""
    job = f"sigterm-at-exit-{exit_code}"
    proc = _launch(weird_tmp, job, "--sigterm-at-exit", "0",
                   *(("--exit-code", str(exit_code)) if exit_code is not None else ()))
    out, err = proc.communicate(timeout=120)
    assert len(set(checksums(out).values())) == 1, out
    if exit_code is None:
        assert proc.returncode == 0, err
        assert (f"npu-launch: counted as exited 0: rank 0 on {socket.gethostname()} (SIGTERM): "
                "killed in its exit handlers after its script ended cleanly, by a signal "
                "npu-launch did not send") in err, err
        assert _root_cause(weird_tmp) is None
    else:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "rank 0 on" in err and "killed by SIGTERM" in err and "counted as" not in err, err
    assert_no_job_processes(job)


def test_a_rank_stuck_in_its_exit_handlers_after_every_script_ended_is_stopped_as_done(
        weird_tmp: Path) -> None:
    """Training done, checkpoints saved, and a rank that never leaves its exit handlers (as
    MindSpore's finalisation can, waiting on a cluster that is gone): before, the job held its
    cards until someone killed it; now ``--exit-timeout`` after every rank's script ended
    cleanly npu-launch stops it, and the job succeeds with one line that says so."""
    job = "linger"
    proc = _launch(weird_tmp, job, "--linger-at-exit", "1", extra=("--exit-timeout", "1"))
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # only when the guard ran out: the guardian then ends the ranks
    assert proc.returncode == 0, err
    assert len(set(checksums(out).values())) == 1, out
    assert (f"npu-launch: counted as exited 0: rank 1 on {socket.gethostname()}: still in its "
            "exit handlers 1 s after every rank's script ended cleanly, stopped "
            "(--exit-timeout 1; 0 waits without a limit)") in err, err
    summary = json.loads((weird_tmp / "logs" / "summary.json").read_text())
    assert (summary["outcome"], summary["root_cause"]) == ("succeeded", None)
    assert_no_job_processes(job)


def test_the_processes_a_rank_starts_run_unhooked_and_are_not_the_rank(weird_tmp: Path) -> None:
    """A rank's Python subprocess, its spawn pool (and the pool's resource tracker) run: before,
    the rank hook in them took the rank for their parent, found it was not npu-launch, and
    killed them at start (exit 137; the pool hung). A forked child's uncaught exception is not
    reported as the rank's, and none of them sends the rank's events."""
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "1", "--job-id", "children", "--log-dir",
                          str(logs), str(RANK_SCRIPTS / "children.py"), timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "subprocess exit 0: subprocess ran" in result.stdout
    assert "spawn pool [2, 4, 6]" in result.stdout
    assert "forked child exit 1" in result.stdout
    records = [json.loads(line) for line in (logs / "events" / "rank_0.jsonl").read_text().splitlines()]
    assert len({r["pid"] for r in records}) == 1, {r["pid"] for r in records}
    assert [r["event"] for r in records if r["event"] in ("started", "exiting")] == ["started", "exiting"]
    assert not (logs / "errors" / "rank_0.json").exists()
    assert_no_job_processes("children")


def test_rank_hung_before_init_is_named(weird_tmp: Path) -> None:
    proc = _launch(weird_tmp, "hang-job", "--hang-before-init", "1",
                   extra=("--startup-timeout", "8"))
    wait_for(lambda: job_pids("hang-job"), "the job's processes")
    seen = tuple(job_pids("hang-job"))
    out, err = proc.communicate(timeout=200)
    assert proc.returncode == 1, err
    assert "rank 1 on" in err and "never reached init()" in err, err
    assert "rank 0 on" in err and "waiting in init()" in err, err
    where = err.split("rank 1 is at (most recent call first):")[1]
    assert "plain_job.py" in where.splitlines()[1], "where the rank that never reached init() is"
    cause = _root_cause(weird_tmp)
    assert (cause["outcome"], cause["ranks"]) == ("startup-timeout", [0, 1])
    assert_no_job_processes("hang-job", seen)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                        (signal.SIGHUP, 129)])
def test_signal_to_launcher_stops_everything(weird_tmp: Path, sig, code) -> None:
    job = f"sig-job-{sig.name}"
    proc = _launch(weird_tmp, job, "--sleep-after-init", "3600")
    wait_for(lambda: initialised(weird_tmp / "logs", range(2)), "both ranks initialised")
    seen = tuple(job_pids(job))
    assert len(seen) >= 2, "two ranks should be running (no scheduler: no MindSpore)"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert f"stopped by {sig.name}" in err
    assert (_root_cause(weird_tmp)["outcome"], _root_cause(weird_tmp)["signal"]) == (
        "interrupted", sig.name)
    assert_no_job_processes(job, seen)


def test_launcher_killed_by_sigkill_takes_ranks_along(weird_tmp: Path) -> None:
    """The ranks die with the launcher (their parent-death signal), and so does what they
    started: rank 1's ``sleep`` is ended by the launch's guardian, which then exits. Before the
    guardian, the ``sleep`` ran on after the job."""
    proc = _launch(weird_tmp, "orphan-job", "--sleep-after-init", "3600", "--child", "1")
    try:
        wait_for(lambda: initialised(weird_tmp / "logs", range(2)), "both ranks initialised")
        wait_for(lambda: len(job_pids("orphan-job")) == 3, "the ranks and rank 1's own process")
        guardians = guardian_pids("orphan-job")
        assert len(guardians) == 1, "one guardian for the one node"
        seen = (*job_pids("orphan-job"), *guardians)
    finally:
        proc.kill()
    proc.communicate(timeout=60)
    gone = lambda: not job_pids("orphan-job") and not any(alive(p) for p in seen)  # noqa: E731
    wait_for(gone, "ranks to follow their dead launcher", 60)
    assert_no_job_processes("orphan-job", seen)


def test_a_stopped_rank_is_woken_to_take_its_sigterm(weird_tmp: Path) -> None:
    """A rank frozen by ``kill -STOP`` sat on its SIGTERM for the whole ``--kill-timeout`` and
    was SIGKILLed; the teardown now sends SIGCONT with the SIGTERM, so it ends by the SIGTERM."""
    script = weird_tmp / "frozen.py"
    script.write_text("import os, signal, time\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    os.kill(os.getpid(), signal.SIGSTOP)\n"
                      "    time.sleep(600)\n"
                      "time.sleep(0.5)\n"
                      "raise RuntimeError('rank 1 fails while rank 0 is stopped')\n")
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--kill-timeout", "300", "--job-id",
                          "frozen", "--log-dir", str(logs), str(script), timeout=240)
    assert result.returncode == 1, result.stderr
    summary = json.loads((logs / "summary.json").read_text())
    assert [(r["rank"], r["exit_code"]) for r in summary["ranks"]] == [
        (0, -signal.SIGTERM), (1, 1)], summary["ranks"]
    assert_no_job_processes("frozen")


@pytest.mark.parametrize("code", [0, 3], ids=["the job succeeds", "rank 1 fails"])
def test_a_daemon_a_rank_left_without_the_token_ends_with_the_job(weird_tmp: Path, code) -> None:
    """A rank's child in a session of its own, with its environment cleared, is out of reach of
    the process groups and the token sweep. npu-launch is the subreaper of what it starts
    (``strays.become_subreaper``): the daemon comes back to it when its rank exits, and the
    teardown ends it, however the job ends."""
    pids = weird_tmp / "pids"
    pids.mkdir()
    job = f"daemons-{code}"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", job, "--log-dir",
                          str(weird_tmp / "logs"), str(TESTS / "plain_scripts" / "daemon_leaver.py"),
                          str(pids), "--exit-code", str(code), timeout=120)
    assert result.returncode == code, result.stderr[-2000:]
    daemons = [int((pids / f"daemon_{rank}").read_text()) for rank in (0, 1)]
    left = [pid for pid in daemons if alive(pid)]
    for pid in left:  # not left for ten minutes by a failing run
        psutil.Process(pid).kill()
    assert not left, f"daemons left running: {left}"
    assert_no_job_processes(job)
