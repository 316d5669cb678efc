"""Resume across hosts that share no storage: the main job, 2 hosts x 1 rank, rank 1 killed
mid-epoch 2 with ``--max-restarts 1``, having first deleted its host's checkpoints (a replaced
host has none).

Each host keeps its own rank's checkpoints on its own disk (``<log dir>/checkpoints`` of the main
job), so no host's directory ever holds a whole step: the launcher's ledger on node 0, fed every
rank's checkpoint events, says which steps are complete. When rank 1 dies, node 0 asks rank 0 on
the other host for its last words through that host's agent (``launcher.run.last_words``); the
restart resumes both ranks from that step, and the wiped host's agent fetches rank 0's file from
node 0 before its rank starts. The result must equal the same job run straight through on one
host with 2 ranks. (A resume from the periodic checkpoints of two private disks, with no last
words, is ``test_collect_private.py``'s, with plain ranks.)
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import RANK_SCRIPTS, REPO

from .jobs import assert_no_job_processes, job_dir, run_on_node0, write_hostfile

pytestmark = [pytest.mark.multinode, pytest.mark.mindspore]
MAIN = str(REPO / "scripts" / "train_digits.py")
FAULTS = str(RANK_SCRIPTS / "digits_faults.py")
EPOCHS = "2"
"""Epoch 1 ends in a periodic checkpoint, rank 1 dies in the middle of epoch 2."""


def _params(cluster, host: str, folder: Path, rank: int) -> dict:
    """``--save-params`` output of ``rank``, read on the host it ran on."""
    local = Path(tempfile.mkdtemp(prefix="params-"))
    assert cluster.fetch(host, folder, local), f"no {folder} on {host}"
    with np.load(local / f"rank{rank}.npz") as saved:
        return {k: saved[k] for k in saved.files}


@pytest.fixture(scope="module")
def straight(ssh_cluster, tmp_path_factory) -> tuple[Path, int]:
    """The job run straight through on the first host, 2 ranks: (its params folder there, the
    steps of one epoch)."""
    work = tmp_path_factory.mktemp("straight")
    job_dir(ssh_cluster, work, scripts=())
    result = run_on_node0(ssh_cluster, ["--device", "cpu", "--cards", "2", "--console", "none",
                                        "--log-dir", str(work / "logs"), MAIN, "--epochs", EPOCHS,
                                        "--save-params", str(work / "params")], cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(ssh_cluster.read_text(ssh_cluster.names[0], work / "logs" / "summary.json"))
    return work / "params", summary["ranks"][0]["steps"] // int(EPOCHS)


def test_a_killed_rank_resumes_from_the_other_hosts_last_words_on_private_disks(
        ssh_cluster, straight, tmp_path_factory) -> None:
    straight_params, per_epoch = straight
    work = tmp_path_factory.mktemp("wiped")
    hostfile = write_hostfile(work, ssh_cluster, slots=1)
    job_dir(ssh_cluster, work, scripts=())
    job = "resume-wiped"
    kill_at = per_epoch + per_epoch // 2  # mid-epoch 2, after epoch 1's checkpoint
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), "--ssh-option", f"-F {ssh_cluster.ssh_config_path}",
        "--device", "cpu", "--console", "none", "--job-id", job, "--max-restarts", "1",
        "--log-dir", str(work / "logs"), FAULTS, "--kill-at-step", str(kill_at),
        "--wipe-checkpoints", "--epochs", EPOCHS, "--ckpt-every", "1", "--keep-last", "1",
        "--save-params", str(work / "params")], cwd=work, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"restart 1 of 1 after: job {job} failed: rank 1" in result.stderr
    # Rank 0's last completed step: the step rank 1 died after, or the one before when rank 1
    # was gone before its share of that step's all-reduce reached rank 0.
    saved = [step for step in (kill_at - 1, kill_at) if
             f"npu-launch: last words: rank 0 saved step {step} for every rank" in result.stderr]
    assert len(saved) == 1, result.stderr[-4000:]
    step = saved[0]
    a, b = ssh_cluster.names
    node0 = lambda path: ssh_cluster.read_text(a, work / "logs" / path)  # noqa: E731

    # Node 0's ledger knew epoch 1's step complete though no host held both files (the files
    # themselves were pruned once later steps completed: keep-last-1).
    assert json.loads(node0(f"checkpoint_ledger/step_{per_epoch}/files.json")) == {
        "0": {"host": a, "path": str(work / "logs" / "checkpoints" / f"step_{per_epoch}" / "rank_0.ckpt")},
        "1": {"host": b, "path": str(work / "logs" / "checkpoints" / f"step_{per_epoch}" / "rank_1.ckpt")}}
    for rank in (0, 1):
        log = node0(f"rank_{rank}.log") or ""  # node 0's streamed copy of every rank's log
        assert f"resumed from step {step});" in log, \
            f"rank {rank} did not resume from step {step}: {log[-2000:]}"
    agent_b = node0(f"agents/{b}.log") or ""
    assert "resume: rank 1: " in agent_b, agent_b[-2000:]

    summary = json.loads(node0("summary.json"))
    assert {per_epoch, step} <= set(summary["complete_steps"])
    sent = summary["checkpoints_sent"]
    assert sent["files"] == 1 and sent["bytes"] > 0, sent

    # Keep-last-1 on every host, though no host ever held a whole step: each rank pruned its own.
    for host in (a, b):
        left = ssh_cluster.run_on(host, ["ls", str(work / "logs" / "checkpoints")], check=True)
        assert left.stdout.split() == [f"step_{int(EPOCHS) * per_epoch}"], (host, left.stdout)

    for rank, host in ((0, a), (1, b)):
        want = _params(ssh_cluster, a, straight_params, rank)
        got = _params(ssh_cluster, host, work / "params", rank)
        assert set(want) == set(got)
        worst = max(float(np.max(np.abs(want[k] - got[k]))) for k in want)
        assert worst <= 1e-5, f"rank {rank}: resumed parameters differ by {worst}"
    assert_no_job_processes(ssh_cluster, job)
