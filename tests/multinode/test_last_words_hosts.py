"""Last words across hosts that share no storage (issue 24 part 1 for jobs of node agents):
2 hosts x 1 rank, the trainer's side of the protocol played by ``last_words_plain.py`` (no
MindSpore). One rank fails after step 3 (its host's agent stops it and reports), or hangs (node
0 judges it from both hosts' progress). Node 0 does not ask through the files a one-host job
uses (the other host's log directory is not its own): it sends the request down the agents'
stdin, and the other host's agent asks its rank (blocked, as a replica in the all-reduce is)
and relays the answer. The restart resumes both ranks from step 3: the host without the saved
file gets a copy before its rank starts, whether node 0's own rank saved it or the other host's
did (node 0 has it sent first)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .jobs import assert_no_job_processes, job_dir, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode


@pytest.mark.parametrize("fails, hangs", [(1, False), (0, False), (1, True)],
                         ids=["rank-1-fails", "node-0s-rank-fails", "rank-1-hangs"])
def test_a_rank_lost_on_one_host_leaves_the_other_hosts_replica_last_step(
        ssh_cluster, weird_tmp: Path, fails: int, hangs: bool) -> None:
    a, b = ssh_cluster.names
    saver = 1 - fails
    job, logs = f"mn-words-{fails}{'-hang' if hangs else ''}", weird_tmp / "logs"
    hang = ("--hang-timeout", "2") if hangs else ()
    hostfile = write_hostfile(weird_tmp, ssh_cluster, slots=1)
    job_dir(ssh_cluster, weird_tmp, scripts=("last_words_plain.py",))
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), "--ssh-option", f"-F {ssh_cluster.ssh_config_path}",
        "--device", "cpu", "--console", "none", "--job-id", job, "--max-restarts", "1",
        "--restart-backoff", "0", "--log-dir", str(logs), *hang,
        str(weird_tmp / "last_words_plain.py"), "--at", "3", "--fails", str(fails),
        "--fail-after", "1", *(["--hangs"] if hangs else [])], cwd=weird_tmp, timeout=180)
    if hangs:  # node 0 judged from both hosts' progress: the request's age is the silence's
        said = re.search("rank 1 on " + re.escape(b) + r" hangs: no progress for (\d+) s",
                         result.stderr)
        assert said and int(said[1]) >= 2, result.stderr[-4000:]
    assert result.returncode == 0, result.stderr[-4000:]
    said = [line for line in result.stderr.splitlines() if "last words" in line]
    assert len(said) == 1 and said[0].startswith(
        f"npu-launch: last words: rank {saver} saved step 3 for every rank before the job was "
        "stopped ("), result.stderr[-4000:]
    saved = logs / "checkpoints" / "step_3" / f"rank_{saver}.ckpt"
    for rank in (0, 1):  # node 0's streamed copy of each rank's log
        log = ssh_cluster.read_text(a, logs / f"rank_{rank}.log") or ""
        assert log.strip().splitlines()[-1] == (f"rank {rank} resumes from step 3 with "
                                                f"['rank_{saver}.ckpt', 'rank_{saver}.ckpt']"), log[-2000:]
    for host in (a, b):  # the saver's own, and a copy for the other host
        assert ssh_cluster.read_text(host, saved) == f"rank {saver}'s state after step 3\n", host
    assert_no_job_processes(ssh_cluster, job)


def test_last_words_that_never_reach_node_0_are_passed_over_in_one_line(
        ssh_cluster, weird_tmp: Path) -> None:
    """Node 0's rank fails; rank 1 on the other host saves step 3 and says so, but its file is
    gone before its agent can send it (``--lose-file``): node 0 never holds it, so the restart
    cannot give it to a host that lacks it, resumes from the start, and says why in one line
    after the one that said the step was saved."""
    a, _ = ssh_cluster.names
    job, logs = "mn-words-lost", weird_tmp / "logs"
    hostfile = write_hostfile(weird_tmp, ssh_cluster, slots=1)
    job_dir(ssh_cluster, weird_tmp, scripts=("last_words_plain.py",))
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), "--ssh-option", f"-F {ssh_cluster.ssh_config_path}",
        "--device", "cpu", "--console", "none", "--job-id", job, "--max-restarts", "1",
        "--restart-backoff", "0", "--log-dir", str(logs), str(weird_tmp / "last_words_plain.py"),
        "--at", "3", "--fails", "0", "--fail-after", "1", "--lose-file"], cwd=weird_tmp,
        timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    said = [line for line in result.stderr.splitlines() if "last words" in line]
    assert [line.split(" (")[0] for line in said] == [
        "npu-launch: last words: rank 1 saved step 3 for every rank before the job was stopped",
        "npu-launch: last words of step 3 did not reach node 0 before the restart: it resumes "
        "from the start"], result.stderr[-4000:]
    for rank in (0, 1):
        log = ssh_cluster.read_text(a, logs / f"rank_{rank}.log") or ""
        assert log.strip().splitlines()[-1] == f"rank {rank} resumes from step none with []", \
            log[-2000:]
    assert_no_job_processes(ssh_cluster, job)
