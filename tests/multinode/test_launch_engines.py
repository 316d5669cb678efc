"""The same two-node job started by the engines clusters already have: Slurm's srun (a real
slurmctld with one slurmd per host) and OpenMPI's mpirun (over the hosts' sshd).

The launcher (and ``salloc``) runs inside the first host, from the job's directory, which is
copied to every host first; results and leftovers are looked up inside each host. Slurm's job
and the one started by hand on each node run MindSpore ranks, which end with the checksum of the
same job on one node (``ms_job_checksum``, once per test run): an engine's agents train like one
node. The mpirun job runs plain-Python ranks (``plain_job.py``): how its agents start on each
host is the launcher's, not MindSpore's."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import checksums

from .jobs import assert_no_job_processes, job_dir, launch_on, mpi_launcher_args, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode


def _job(cluster, tmp: Path, script: str = "ms_job.py") -> str:
    """The job directory ``tmp`` (rank script, hostfile) on every host; returns the script."""
    write_hostfile(tmp, cluster)
    job_dir(cluster, tmp, scripts=(script,))
    return str(tmp / script)


@pytest.mark.mindspore
def test_slurm_allocation_runs_one_agent_per_node(slurm_cluster, ms_job_checksum,
                                                  weird_tmp: Path) -> None:
    job = _job(slurm_cluster, weird_tmp)
    result = run_on_node0(slurm_cluster, [
        "--launcher", "slurm", "--cards", "1", "--device", "cpu", "--job-id", "sl-job",
        "--log-dir", str(weird_tmp / "sl"), "--kill-timeout", "3", job, "--steps", "3"],
        cwd=weird_tmp, prefix=["salloc", "-N2", "--job-name=npl-test"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    sums = checksums(result.stdout)
    a, b = slurm_cluster.names
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}, result.stdout[-2000:]
    assert set(sums.values()) == {ms_job_checksum(2)}
    assert "2 rank(s) on 2 node(s) exited 0" in result.stderr
    assert_no_job_processes(slurm_cluster, "sl-job")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_mpirun_runs_one_agent_per_host(ssh_cluster, weird_tmp: Path) -> None:
    job = _job(ssh_cluster, weird_tmp, "plain_job.py")
    result = run_on_node0(ssh_cluster, [
        "--launcher", "mpi", "--hostfile", str(weird_tmp / "hosts"),
        "--launcher-args", mpi_launcher_args(ssh_cluster),
        "--ssh-option", f"-F {ssh_cluster.ssh_config_path}", "--device", "cpu",
        "--job-id", "mpi-job", "--log-dir", str(weird_tmp / "mpi"), "--kill-timeout", "3",
        job, "--steps", "3"], cwd=weird_tmp)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    sums = checksums(result.stdout)
    a, b = ssh_cluster.names
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}, result.stdout[-2000:]
    # One sum on both hosts: each rank took part in the other's all-reduces over MASTER_PORT.
    assert len(set(sums.values())) == 1, sums
    summary = json.loads(ssh_cluster.read_text(a, weird_tmp / "mpi" / "summary.json"))
    assert [(r["rank"], r["host"], r["exit_code"]) for r in summary["ranks"]] == [
        (0, a, 0), (1, b, 0)], summary["ranks"]
    assert "2 rank(s) on 2 node(s) exited 0" in result.stderr
    assert_no_job_processes(ssh_cluster, "mpi-job")


@pytest.mark.mindspore
def test_by_hand_on_each_node_like_msrun(ssh_cluster, ms_job_checksum, weird_tmp: Path) -> None:
    job = _job(ssh_cluster, weird_tmp)
    a, b = ssh_cluster.names
    master = ssh_cluster.addresses[0]
    procs = [launch_on(ssh_cluster, host, [
        "--nnodes", "2", "--node-rank", str(i), "--master-addr", master, "--master-port", "29650",
        "--cards", "1", "--device", "cpu", "--job-id", "by-hand", "--log-dir",
        str(weird_tmp / "byhand"), job, "--steps", "3"], cwd=weird_tmp)
        for i, host in enumerate((a, b))]
    outs = [p.communicate(timeout=300) for p in procs]
    for proc, (_out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
    sums = {**checksums(outs[0][0]), **checksums(outs[1][0])}
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}
    assert set(sums.values()) == {ms_job_checksum(2)}
    # Node 1's launcher keeps its summary on node 1's own disk.
    assert ssh_cluster.exists(b, weird_tmp / "byhand" / "hosts" / b / "summary.json")
    assert_no_job_processes(ssh_cluster, "by-hand")
