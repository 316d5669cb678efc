"""A Slurm batch job that Slurm requeues (``scontrol requeue``, as preemption with
``PreemptMode=REQUEUE`` does) runs its script again under the same ``SLURM_JOB_ID``; the same
command, with no ``--log-dir``, continues in the same log directory: ``summary.json`` keeps the
first run's attempt and adds the second's (``launcher/plan/job_id.py``)."""
from __future__ import annotations

import json
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from .jobs import assert_no_job_processes, job_dir

pytestmark = [pytest.mark.multinode]

COMMAND = ("--launcher slurm --cards 1 --device cpu --kill-timeout 3 plain_job.py "
           "--steps 3 --sleep-after-init 120 --sleep-in-first-run-only")


def _squeue(cluster, job: str) -> str:
    out = cluster.run_on(cluster.names[0], ["squeue", "-h", "-j", job, "-o", "%T %r"]).stdout
    return out.strip()


def _ls(cluster, host: str, path: Path) -> list[str]:
    out = cluster.run_on(host, ["ls", "-A", str(path)])
    return out.stdout.split() if out.returncode == 0 else []


def _wait(what: str, predicate, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_requeued_batch_job_continues_in_its_own_log_directory(slurm_cluster, weird_tmp: Path) -> None:
    a = slurm_cluster.names[0]
    script = weird_tmp / "job.sh"
    script.write_text("#!/bin/bash\n"
                      f"exec {shlex.quote(sys.executable)} -m launcher.cli {COMMAND}\n")
    job_dir(slurm_cluster, weird_tmp, scripts=("plain_job.py",))
    submitted = slurm_cluster.run_on(a, ["sbatch", "--parsable", "--requeue", "-N2",
                                         "--job-name=npl-test", "--output=batch-%j.out",
                                         str(script)], cwd=weird_tmp)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    logs = weird_tmp / "npu_launch_logs"

    def log_dir() -> Path | None:
        found = [p for p in _ls(slurm_cluster, a, logs) if p.startswith(f"slurm-{job}-")]
        return logs / found[0] if found else None

    def both_up() -> bool:
        d = log_dir()
        out = slurm_cluster.read_text(a, weird_tmp / f"batch-{job}.out") or ""
        return d is not None and out.count(" up, RANK_ID=") == 2

    _wait("both ranks initialised in the first run", both_up)
    first = log_dir()
    requeued = slurm_cluster.run_on(a, ["scontrol", "requeue", job])
    assert requeued.returncode == 0, requeued.stderr
    # Slurm holds a requeued job back for a while (its begin time, about two minutes here);
    # an administrator's "start it now" skips that wait and nothing else.
    _wait("the job to be pending again", lambda: _squeue(slurm_cluster, job).startswith("PENDING"))
    now = slurm_cluster.run_on(a, ["scontrol", "update", f"JobId={job}", "StartTime=now"])
    assert now.returncode == 0, now.stderr
    _wait("the requeued run to end", lambda: _squeue(slurm_cluster, job) == "")
    summary = json.loads(slurm_cluster.read_text(a, first / "summary.json") or "{}")
    assert [x.get("launch") for x in summary.get("attempts", [])] == [0, 1], summary.get("attempts")
    assert [x["outcome"] for x in summary["attempts"]] == ["interrupted", "succeeded"], summary["attempts"]
    assert re.fullmatch(rf"slurm-{job}-[0-9a-f]{{8}}", first.name)
    assert _ls(slurm_cluster, a, logs) == [first.name]
    assert_no_job_processes(slurm_cluster, first.name)
