"""npu-launch as the command of an operator's pods, on two test hosts (``launcher/plan/pods.py``).

Each host plays the pods of one Kubernetes node: npu-launch is started on it with the
environment the operator gives its pods (``tests/fixtures/pods/README.md``), never over ssh (an
``ssh`` on PATH that only records being called proves none is run). The operator's rank table is
where MindCluster mounts it, ``/user/serverid/devindex/config/hccl.json``: each host's own file,
bound there inside the host's mount namespace (the hosts' ``/tmp`` is private, the cluster's
work directory shared), which a test thread writes as the operator does, ``initializing`` first,
``completed`` once every pod is up. The ascend-operator's job, whose MindSpore scheduler has a
pod of its own, runs MindSpore ranks and must train to the same parameters as the same job with
``--cards 2`` on one host. The Kubeflow-style pods run plain-Python ranks (``plain_job.py``, no
MindSpore): what is Kubeflow's is the pods' environment and what npu-launch makes of it (a node
per pod, the master's name resolved to its address), and the ranks meet at that address.

The bind mount needs ``/user/serverid/devindex/config`` to exist in the image the hosts share:
the fixture makes the folders it lacks, empty, and removes them afterwards.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import pytest
from helpers import checksums

from .jobs import assert_no_job_processes, job_dir, job_processes, launch_on

pytestmark = pytest.mark.multinode

MOUNTED = Path("/user/serverid/devindex/config")
INITIALIZING = '{"status": "initializing"}'
COMPLETED = ('{"status": "completed", "server_count": "2", "version": "1.0", "server_list": '
             '[]}')


@pytest.fixture(scope="module")
def tables(ssh_cluster) -> Iterator[dict[str, Path]]:
    """Per host, the file the host sees at ``MOUNTED / "hccl.json"`` (the operator's side)."""
    made = [p for p in (*reversed(MOUNTED.parents[:-1]), MOUNTED) if not p.exists()]
    for path in made:
        path.mkdir()
    bound = []
    try:
        files = {}
        for host in ssh_cluster.names:
            source = ssh_cluster.work_subdir("pod-ranktables", host)
            res = ssh_cluster.run_on(host, ["mount", "--bind", str(source), str(MOUNTED)])
            assert res.returncode == 0, res.stderr
            bound.append(host)
            files[host] = source / "hccl.json"
        yield files
    finally:
        for host in bound:
            ssh_cluster.run_on(host, ["umount", str(MOUNTED)])
        for path in reversed(made):
            path.rmdir()


@pytest.fixture
def reference(ms_job_checksum) -> str:
    """The checksum both ranks reach with ``--cards 2`` on one node."""
    return ms_job_checksum(2)


def _pod_env(cluster, **pod: str) -> dict[str, str]:
    """The cluster's environment, the pod's variables, and an ``ssh`` that records its calls."""
    trap = cluster.work_subdir("pod-ssh-trap")
    (trap / "ssh").write_text(f"#!/bin/sh\necho \"$@\" >> '{trap}/called'\nexit 255\n")
    (trap / "ssh").chmod(0o755)
    env = {k: v for k, v in cluster.env.items() if k not in ("MS_ROLE", "MASTER_ADDR", "RANK")}
    return {**env, "PATH": f"{trap}{os.pathsep}{env['PATH']}", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            **pod}


def _no_ssh(cluster) -> None:
    called = cluster.work_subdir("pod-ssh-trap") / "called"
    assert not called.exists(), f"npu-launch ran ssh in a pod: {called.read_text()}"


def _pod(cluster, host: str, tmp: Path, job: str, env: dict[str, str],
         script: str = "ms_job.py"):
    return launch_on(cluster, host, ["--device", "cpu", "--job-id", job, "--log-dir",
                                     str(tmp / job), "--kill-timeout", "3", str(tmp / script),
                                     "--steps", "3"], cwd=tmp, env=env)


def _rank_starts(cluster, host: str, log_dir: Path) -> list[float]:
    """When each rank of the pod's log dir on ``host`` started (its rank hook's clock: the
    kernel's start time, from the boot time in whole seconds, may be a second off)."""
    starts = []
    for rank in (0, 1):
        text = cluster.read_text(host, log_dir / "hosts" / host / "events" / f"rank_{rank}.jsonl")
        for line in (text or "").splitlines():
            event = json.loads(line)
            if event["event"] == "started":
                starts.append(event["time"])
    return starts


@pytest.mark.mindspore
def test_ascend_operator_pods_wait_for_the_table_and_train_like_one_node(
        ssh_cluster, tables, reference, weird_tmp: Path) -> None:
    a, b = ssh_cluster.names
    job_dir(ssh_cluster, weird_tmp)
    for table in tables.values():
        table.write_text(INITIALIZING)
    common = {"MS_SCHED_HOST": ssh_cluster.addresses[0], "MS_SCHED_PORT": "29661",
              "MS_WORKER_NUM": "2", "MS_LOCAL_WORKER": "1", "MS_SERVER_NUM": "0"}
    procs = {
        "pod-sched": _pod(ssh_cluster, a, weird_tmp, "pod-sched", _pod_env(
            ssh_cluster, **common, MS_ROLE="MS_SCHED", MS_NODE_RANK="0", NPU_POD="false")),
        "pod-w0": _pod(ssh_cluster, a, weird_tmp, "pod-w0", _pod_env(
            ssh_cluster, **common, MS_ROLE="MS_WORKER", MS_NODE_RANK="0", NPU_POD="true")),
        "pod-w1": _pod(ssh_cluster, b, weird_tmp, "pod-w1", _pod_env(
            ssh_cluster, **common, MS_ROLE="MS_WORKER", MS_NODE_RANK="1", NPU_POD="true")),
    }
    time.sleep(4)  # the operator has not placed every pod yet
    for job in ("pod-w0", "pod-w1"):
        assert procs[job].poll() is None, procs[job].communicate()[1][-3000:]
        assert not any(job_processes(ssh_cluster, job).values()), f"{job} started ranks early"
    completed = time.time()
    for table in tables.values():
        table.write_text(COMPLETED)
    outs = {job: proc.communicate(timeout=300) for job, proc in procs.items()}
    for job, proc in procs.items():
        assert proc.returncode == 0, (job, outs[job][1][-3000:])
    sums = {**checksums(outs["pod-w0"][0]), **checksums(outs["pod-w1"][0])}
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}, sums
    assert set(sums.values()) == {reference}
    assert "MindSpore's scheduler alone at" in outs["pod-sched"][1]
    assert not checksums(outs["pod-sched"][0]), "the scheduler pod ran a rank"
    for job, host in (("pod-w0", a), ("pod-w1", b)):
        err = outs[job][1]
        assert f"rank table {MOUNTED / 'hccl.json'} completed after" in err, err[-3000:]
        starts = _rank_starts(ssh_cluster, host, weird_tmp / job)
        assert starts and min(starts) >= completed, (job, starts, completed)
    _no_ssh(ssh_cluster)
    for job in procs:
        assert_no_job_processes(ssh_cluster, job)


def test_kubeflow_pods_run_one_node_each_with_the_masters_address(ssh_cluster, tables,
                                                                   weird_tmp: Path) -> None:
    a, b = ssh_cluster.names
    job_dir(ssh_cluster, weird_tmp, scripts=("plain_job.py",))
    for table in tables.values():
        table.write_text(COMPLETED)  # an operator that mounts one completes it before the pods
    # The master by name, as Kubeflow gives its service's.
    common = {"MASTER_ADDR": a, "MASTER_PORT": "29662", "WORLD_SIZE": "2"}
    procs = {job: _pod(ssh_cluster, host, weird_tmp, job, _pod_env(ssh_cluster, **common,
                                                                   RANK=str(i)), "plain_job.py")
             for i, (job, host) in enumerate((("kf-master", a), ("kf-worker", b)))}
    outs = {job: proc.communicate(timeout=300) for job, proc in procs.items()}
    for job, proc in procs.items():
        assert proc.returncode == 0, (job, outs[job][1][-3000:])
        assert "waiting for the operator's rank table" not in outs[job][1]
    master = ssh_cluster.addresses[0]
    assert (f"detected: kubeflow-style pod (RANK=0, WORLD_SIZE=2), node 0 of 2, scheduler "
            f"{master}:29662 ({a}) here") in outs["kf-master"][1]
    assert (f"detected: kubeflow-style pod (RANK=1, WORLD_SIZE=2), node 1 of 2, scheduler "
            f"{master}:29662 ({a}) on node 0") in outs["kf-worker"][1]
    sums = {**checksums(outs["kf-master"][0]), **checksums(outs["kf-worker"][0])}
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}, sums
    # One sum in both pods: the ranks met at the master's address, each in the other's steps.
    assert len(set(sums.values())) == 1, sums
    # Each pod's plan gives its rank the master's address, not its name (MindSpore's scheduler
    # takes none), and only the master's pod plans MindSpore's scheduler (started once a rank
    # imports MindSpore, which plain ranks never do).
    for job, host, rank in (("kf-master", a, 0), ("kf-worker", b, 1)):
        plan = json.loads(ssh_cluster.read_text(host, weird_tmp / job / "plan.json"))
        assert (plan["scheduler"] or {}).get("host") == (a if rank == 0 else None), job
        said = [{key: spec["env"][key] for key in ("MS_SCHED_HOST", "MS_SCHED_PORT",
                                                   "MASTER_ADDR", "MASTER_PORT", "RANK")}
                for spec in plan["ranks"] if spec["host"] == host]
        assert said == [{"MS_SCHED_HOST": master, "MS_SCHED_PORT": "29662", "MASTER_ADDR": master,
                         "MASTER_PORT": "29662", "RANK": str(rank)}], (job, said)
    _no_ssh(ssh_cluster)
    for job in procs:
        assert_no_job_processes(ssh_cluster, job)
