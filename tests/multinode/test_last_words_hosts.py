"""Last words across hosts that share no storage (issue 24 part 1 for jobs of node agents):
2 hosts x 1 rank, the trainer's side of the protocol played by ``last_words_plain.py`` (no
MindSpore). Rank 1 fails after step 3 on the second host; its agent stops it and reports. Node 0
cannot see the first host's log directory through the files a one-host job uses, so it sends
the request down the agents' stdin; the first host's agent asks rank 0 (blocked, as a replica in
the all-reduce is) and relays its answer. The restart resumes both ranks from step 3: the
second host, which never held rank 0's file, gets node 0's copy before its rank starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from .jobs import assert_no_job_processes, job_dir, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode


def test_a_rank_lost_on_one_host_leaves_the_other_hosts_replica_last_step(
        ssh_cluster, weird_tmp: Path) -> None:
    a, b = ssh_cluster.names
    job, logs = "mn-words", weird_tmp / "logs"
    hostfile = write_hostfile(weird_tmp, ssh_cluster, slots=1)
    job_dir(ssh_cluster, weird_tmp, scripts=("last_words_plain.py",))
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), "--ssh-option", f"-F {ssh_cluster.ssh_config_path}",
        "--device", "cpu", "--console", "none", "--job-id", job, "--max-restarts", "1",
        "--restart-backoff", "0", "--log-dir", str(logs),
        str(weird_tmp / "last_words_plain.py"), "--at", "3", "--fail-after", "1"], cwd=weird_tmp, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    said = [line for line in result.stderr.splitlines() if "last words" in line]
    assert len(said) == 1 and said[0].startswith(
        "npu-launch: last words: rank 0 saved step 3 for every rank before the job was "
        "stopped ("), result.stderr[-4000:]
    saved = logs / "checkpoints" / "step_3" / "rank_0.ckpt"
    assert ssh_cluster.read_text(a, saved) == "rank 0's state after step 3\n"
    for rank in (0, 1):  # node 0's streamed copy of each rank's log
        log = ssh_cluster.read_text(a, logs / f"rank_{rank}.log") or ""
        assert log.strip().splitlines()[-1] == \
            f"rank {rank} resumes from step 3 with ['rank_0.ckpt', 'rank_0.ckpt']", log[-2000:]
    assert ssh_cluster.read_text(b, saved) == "rank 0's state after step 3\n", \
        "the second host was given node 0's replica"
    assert_no_job_processes(ssh_cluster, job)
