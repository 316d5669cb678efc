"""Restarts across hosts that share no storage: one budget for the whole job, and a bad host left
out with ``--min-nodes``.

The budget, init failures and --min-nodes refusals run plain-Python ranks (``plain_job.py``:
restarts are the launcher's); the host left out runs the main job, whose resume on fewer ranks
is MindSpore's.

* Budget: rank 0 (first host) fails in attempt 0, rank 1 (second host) in attempt 1; with
  ``--max-restarts 2`` the job finishes in attempt 2, having used both restarts of one budget,
  each attempt in summary.json with its cause on its host.
* ``--min-nodes``: the main job (scripts/train_digits.py) on 2 hosts x 2 ranks, global batch 64
  as the main job's test has it (2 x 32; here 4 x 16), for 2 epochs. The second host's ranks
  fail mid-epoch 2 in every attempt, a bad server: attempt 0 fails, attempt 1 resumes from rank
  0's last words (past epoch 1's checkpoint) and fails again, and attempt 2 runs without that
  host, 2 ranks of batch 32 on the first, resumed from the same step, to the main job's accuracy
  bound.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS

from .jobs import assert_no_job_processes, job_dir, run_on_node0, write_hostfile

pytestmark = [pytest.mark.multinode, pytest.mark.mindspore]
FAULTS = str(RANK_SCRIPTS / "digits_faults.py")
JOB = "plain_job.py"
RESULT = re.compile(r"rank (\d): held-out accuracy ([\d.]+) after (\d+) steps .*checksum ([\d.]+)")


def _ssh(cluster) -> list[str]:
    return ["--ssh-option", f"-F {cluster.ssh_config_path}", "--device", "cpu",
            "--console", "none"]


def test_failures_on_two_hosts_use_one_job_wide_budget(ssh_cluster, tmp_path_factory) -> None:
    work = tmp_path_factory.mktemp("budget")
    hostfile = write_hostfile(work, ssh_cluster, slots=1)
    job_dir(ssh_cluster, work, scripts=(JOB,))
    a, b = ssh_cluster.names
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), *_ssh(ssh_cluster), "--job-id", "budget",
        "--max-restarts", "2", "--restart-backoff", "0.2", "--log-dir", str(work / "logs"),
        JOB, "--fail-at-attempt", "0:0", "--fail-at-attempt", "1:1"], cwd=work)
    # The plain victim raises the instant its peer leaves, as gloo or HCCL may: node 0 still
    # names the culprit, having waited for both nodes' reports (node_agents.SETTLE).
    assert result.returncode == 0, result.stderr[-4000:]
    assert "restart 1 of 2 in 0.2 s after: job budget failed: rank 0" in result.stderr
    assert "restart 2 of 2 in 0.4 s after: job budget failed: rank 1" in result.stderr
    summary = json.loads(ssh_cluster.read_text(a, work / "logs" / "summary.json"))
    attempts = summary["attempts"]
    assert [x["outcome"] for x in attempts] == ["failed", "failed", "succeeded"]
    assert [(x["cause"] or {}).get("host") for x in attempts] == [a, b, None]
    assert [x["waited_s"] for x in attempts] == [0, 0.2, 0.4]
    assert all(x["nodes"] == 2 and x["world_size"] == 2 for x in attempts)
    # A node's agent never restarts its ranks on its own: every attempt is node 0's.
    for host in (a, b):
        log = ssh_cluster.read_text(a, work / "logs" / "agents" / f"{host}.log") or ""
        assert "restart" not in log.lower(), log[-2000:]
    assert_no_job_processes(ssh_cluster, "budget")


def test_a_host_that_fails_twice_is_left_out_and_the_job_finishes_on_the_rest(
        ssh_cluster, tmp_path_factory) -> None:
    work = tmp_path_factory.mktemp("min-nodes")
    hostfile = write_hostfile(work, ssh_cluster, slots=2)
    job_dir(ssh_cluster, work, scripts=())
    a, b = ssh_cluster.names
    per_epoch = 1437 // 64  # train_digits: 1437 training samples, global batch 64
    epochs = 2  # the fewest with a failure after epoch 1's checkpoint, in the middle of an epoch
    fail_at = per_epoch + per_epoch // 2
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), *_ssh(ssh_cluster), "--cards", "2", "--job-id", "shrink",
        "--max-restarts", "3", "--restart-backoff", "0.1", "--min-nodes", "1",
        "--log-dir", str(work / "logs"), FAULTS, "--fail-on-host", b,
        "--fail-at-step", str(fail_at), "--batch", "16", "--epochs", str(epochs),
        "--ckpt-every", "1"],
        cwd=work, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    assert (f"leaving {b} out: its ranks caused the last 2 failures; 1 host(s) and 2 rank(s) go "
            "on (--min-nodes 1)") in result.stderr
    summary = json.loads(ssh_cluster.read_text(a, work / "logs" / "summary.json"))
    attempts = summary["attempts"]
    assert [x["outcome"] for x in attempts] == ["failed", "failed", "succeeded"], \
        json.dumps(attempts, indent=1) + result.stderr[-6000:]
    assert [(x["cause"] or {}).get("host") for x in attempts[:2]] == [b, b]
    assert [(x["cause"]["exception"], x["cause"]["rank"] in (2, 3)) for x in attempts[:2]] == [
        ("RuntimeError", True)] * 2, json.dumps(attempts[:2]) + result.stderr[-5000:]
    assert f"{b} is a bad host: failing at step {fail_at}" in attempts[0]["cause"]["error"]
    # Each failure leaves rank 0's last words (host a): its last completed step, the step the
    # bad host failed after or the one before.
    first, last = (x["resumed_from"] for x in attempts[1:])
    assert attempts[0]["resumed_from"] is None and first in (fail_at - 1, fail_at), attempts
    assert last in (first, first + 1), attempts
    assert [(x["nodes"], x["world_size"], x["left_out"]) for x in attempts] == [
        (2, 4, []), (2, 4, []), (1, 2, [b])]
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]

    # The 2 ranks left read the same global batches as the 4 did: same steps per epoch, and
    # the main job's bound (tests/ranks/test_train_digits.py: 0.95; this job reaches 0.975 in
    # its 2 epochs, 0.99 in 4).
    logs = {rank: ssh_cluster.read_text(a, work / "logs" / f"rank_{rank}.log") or ""
            for rank in (0, 1)}
    results = {int(m[1]): (float(m[2]), int(m[3]), m[4])
               for log in logs.values() for m in RESULT.finditer(log)}
    assert set(results) == {0, 1}, logs[0][-3000:]
    assert all(accuracy >= 0.95 for accuracy, _, _ in results.values()), results
    assert {steps for _, steps, _ in results.values()} == {epochs * per_epoch}
    assert results[0][2] == results[1][2], "data-parallel replicas must end equal"
    for log in logs.values():
        assert f"resumed from step {last});" in log, log[-2000:]
    data = [json.loads(line) for line in
            (ssh_cluster.read_text(a, work / "logs" / "metrics.jsonl") or "").splitlines()]
    batches = {(r["rank"], r["batch_size"], r["planned_world"]) for r in data
               if r.get("event") == "data"}
    assert {(0, 32, 4), (1, 32, 4)} <= batches and (0, 16, None) in batches, batches
    assert_no_job_processes(ssh_cluster, "shrink")


def test_a_host_whose_ranks_fail_inside_init_is_left_out(ssh_cluster, tmp_path_factory) -> None:
    """A failure inside ``init()`` (a broken card or network) is restarted with ``--min-nodes``,
    though not every rank initialised; the host it keeps happening on is left out. The rank on
    the bad host fails the instant it calls ``init()``, often before the other host's rank
    said it called it: the culprit's own events decide."""
    work = tmp_path_factory.mktemp("init-fails")
    hostfile = write_hostfile(work, ssh_cluster, slots=1)
    job_dir(ssh_cluster, work, scripts=(JOB,))
    a, b = ssh_cluster.names
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), *_ssh(ssh_cluster), "--job-id", "init-fails",
        "--max-restarts", "2", "--restart-backoff", "0", "--min-nodes", "1",
        "--log-dir", str(work / "logs"), JOB, "--fail-init-on-host", b], cwd=work)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads(ssh_cluster.read_text(a, work / "logs" / "summary.json"))
    attempts = summary["attempts"]
    assert [(x["outcome"], (x["cause"] or {}).get("host"), x["nodes"]) for x in attempts] == [
        ("failed", b, 2), ("failed", b, 2), ("succeeded", None, 1)], attempts
    assert f"init failed on host {b}" in attempts[0]["cause"]["error"]
    assert f"leaving {b} out" in result.stderr
    assert_no_job_processes(ssh_cluster, "init-fails")

    # Without --min-nodes the same failure is a start-up error: not restarted, and one line
    # says why.
    again = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), *_ssh(ssh_cluster), "--job-id", "init-fails-2",
        "--max-restarts", "2", "--log-dir", str(work / "logs2"), JOB,
        "--fail-init-on-host", b], cwd=work)
    assert again.returncode == 1 and "restart 1" not in again.stderr, again.stderr[-3000:]
    assert ("npu-launch: not restarted: rank 1 failed before every rank had initialised "
            "communication") in again.stderr, again.stderr[-3000:]
    assert_no_job_processes(ssh_cluster, "init-fails-2")


def test_min_nodes_refuses_what_cannot_go_on_with_fewer_hosts(ssh_cluster,
                                                               tmp_path_factory) -> None:
    work = tmp_path_factory.mktemp("min-nodes-bad")
    hostfile = write_hostfile(work, ssh_cluster, slots=1)
    job_dir(ssh_cluster, work, scripts=(JOB,))
    common = ["--hostfile", str(hostfile), *_ssh(ssh_cluster), "--max-restarts", "1", "--dry-run"]
    too_many = run_on_node0(ssh_cluster, [*common, "--min-nodes", "3", JOB], cwd=work)
    assert too_many.returncode == 2
    assert too_many.stderr.strip() == "npu-launch: error: --min-nodes 3: the job has 2 host(s)"
    sliced = run_on_node0(ssh_cluster, [*common, "--min-nodes", "1", "--parallel", "semi", "--mp", "2",
                                         JOB],
                          cwd=work)
    assert sliced.returncode == 2, sliced.stderr
    assert sliced.stderr.strip().splitlines() == [
        "npu-launch: error: --min-nodes: the layout (mode semi, mp 2, pp 1) cannot go on with "
        "fewer hosts: its checkpoint slices belong to their ranks; only data parallelism can"]
    assert not (Path(work) / "logs").exists()

