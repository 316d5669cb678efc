"""No launch touches a process it did not start, and two launches never share a log directory.

Two CI pipelines that both pass ``--job-id nightly`` are the case: the job id is a name, not an
identity. Teardown sweeps by a secret drawn for each launch, and a second launch into the log
directory of a live job is refused before it starts anything.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import RANK_SCRIPTS, alive, initialised, job_pids, npu_launch_argv, run_launcher, start_job, wait_for

JOB = str(RANK_SCRIPTS / "plain_job.py")  # plain-Python ranks: no MindSpore process


def _decoy(job_id: str) -> subprocess.Popen:
    """Another job's process as the old sweep saw one: same job id, same node rank."""
    env = {**os.environ, "NPU_LAUNCH_JOB_ID": job_id, "NPU_LAUNCH_NODE_RANK": "0"}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env,
                            start_new_session=True)


def _launch(logs: Path, job_id: str, *script_args: str) -> subprocess.Popen:
    return start_job(logs, job_id, JOB, *script_args)


def test_a_failing_job_leaves_another_jobs_process_with_the_same_id_alone(weird_tmp: Path) -> None:
    decoy = _decoy("nightly")
    try:
        result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "nightly",
                              "--log-dir", str(weird_tmp / "logs"), JOB, "--fail-rank", "1",
                              "--sleep-after-init", "3600")
        assert result.returncode == 1, result.stderr[-3000:]
        assert "failed: rank 1 on" in result.stderr
        assert alive(decoy.pid), "the teardown killed a process that another launch started"
        assert job_pids("nightly") == [decoy.pid], "the job's own processes are all gone"
    finally:
        decoy.kill()
        decoy.wait()


def test_a_second_launch_into_a_live_jobs_log_dir_is_refused(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    first = _launch(logs, "nightly", "--sleep-after-init", "3600")
    try:
        wait_for(lambda: initialised(logs, range(2)), "the first job's ranks initialised")
        before = sorted(p.name for p in logs.iterdir())
        running = job_pids("nightly")
        second = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "nightly",
                              "--log-dir", str(logs), JOB)
        assert second.returncode == 2, second.stderr
        [line] = second.stderr.strip().splitlines()
        assert f"log directory {logs} is in use by a live job (npu-launch pid {first.pid})" in line
        assert sorted(p.name for p in logs.iterdir()) == before, "the refused launch wrote nothing"
        assert all(alive(pid) for pid in running), "the refused launch stopped the live job"
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 143
    wait_for(lambda: not job_pids("nightly"), "the first job's processes gone", 60)
    again = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "nightly",
                         "--log-dir", str(logs), JOB, "--steps", "1")
    assert again.returncode == 0, "once the job is gone its log directory can be used again"


def test_a_users_pythonpath_keeps_the_rank_hook(weird_tmp: Path) -> None:
    """``--env PYTHONPATH=...`` used to replace the boot directory: no rank hook, so no
    parent-death signal, and a ``kill -9`` of the launcher left the ranks running."""
    logs, lib = weird_tmp / "logs", weird_tmp / "user lib"
    lib.mkdir()
    argv = npu_launch_argv("--device", "cpu", "--cards", "2", "--job-id", "user-path",
                           "--log-dir", str(logs), "--env", f"PYTHONPATH={lib}", JOB,
                           "--sleep-after-init", "3600")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            wait_for(lambda: initialised(logs, range(2)), "both ranks initialised")
            seen = job_pids("user-path")
            rank_env = json.loads((logs / "plan.json").read_text())["ranks"][0]["env"]
        finally:
            proc.kill()
            proc.communicate(timeout=60)
        assert rank_env["PYTHONPATH"].split(os.pathsep)[-1] == str(lib)
        assert rank_env["PYTHONPATH"].split(os.pathsep)[0].endswith(os.path.join("parallel", "_boot"))
        wait_for(lambda: not any(alive(p) for p in seen), "ranks to follow their dead launcher", 60)
    finally:
        for pid in job_pids("user-path"):  # only when the test failed: nothing else is left
            os.kill(pid, signal.SIGKILL)
