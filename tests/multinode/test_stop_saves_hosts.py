"""A stop signal to a multi-node job whose ranks save on request (the shared trainer's
contract, played by ``plain_job.py --saves-on-stop``): node 0 picks the step every rank saves,
and every host's agent writes it into that host's own log directory (private disks here), so
the ranks on every host save the same step and exit (``attempt.StopRequest``,
``launcher.cluster.agent.AgentStop``)."""
from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from helpers import wait_for

from .jobs import assert_no_job_processes, job_dir, launch_on, write_hostfile

pytestmark = pytest.mark.multinode
_SAVED = re.compile(r"\[([^:\]]+):(\d+)\] rank \d+ saves step (\d+)")


def _steps(cluster, host: str, log_dir: Path) -> dict[int, int]:
    text = cluster.read_text(host, log_dir / "metrics.jsonl") or ""
    steps: dict[int, int] = {}
    for record in map(json.loads, text.splitlines()):
        if record.get("event") == "step":
            steps[record["rank"]] = record["step"]
    return steps


def test_sigterm_on_node_0_makes_every_host_save_the_same_step(ssh_cluster, weird_tmp: Path) -> None:
    a, b = ssh_cluster.names
    job, log_dir = "mn-save", weird_tmp / "mn-save"
    write_hostfile(weird_tmp, ssh_cluster, slots=1)
    job_dir(ssh_cluster, weird_tmp, scripts=("plain_job.py",))
    proc = launch_on(ssh_cluster, a, [
        "--hostfile", str(weird_tmp / "hosts"), "--ssh-option", f"-F {ssh_cluster.ssh_config_path}",
        "--device", "cpu", "--job-id", job, "--log-dir", str(log_dir), "--kill-timeout", "30",
        str(weird_tmp / "plain_job.py"), "--steps", "100000", "--saves-on-stop",
        "--step-time", "0.1"], cwd=weird_tmp)
    wait_for(lambda: min(_steps(ssh_cluster, a, log_dir).values(), default=0) >= 5
                and len(_steps(ssh_cluster, a, log_dir)) == 2 or proc.poll() is not None,
                "both ranks past step 5", 180, every=0.5)
    proc.send_signal(signal.SIGTERM)  # inside node 0, to the launcher itself
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    saved = _SAVED.findall(out)
    assert sorted((host, int(rank)) for host, rank, _ in saved) == [(a, 0), (b, 1)], out[-3000:]
    (step,) = {int(k) for *_, k in saved}
    assert f"every rank saves step {step} and stops" in err
    assert_no_job_processes(ssh_cluster, job)
