"""The same two-node job started by the engines clusters already have: Slurm's srun (a real
slurmctld with one slurmd per host) and OpenMPI's mpirun (over the hosts' sshd)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import RANK_SCRIPTS, assert_no_job_processes, checksums, npu_launch_argv, run_launcher

pytestmark = [pytest.mark.multinode, pytest.mark.mindspore]
JOB = str(RANK_SCRIPTS / "ms_job.py")


def _reference(tmp: Path) -> str:
    """The checksum both ranks of the same job reach on one node."""
    single = run_launcher("--device", "cpu", "--cards", "2", "--log-dir", str(tmp / "one"),
                          JOB, "--steps", "3")
    assert single.returncode == 0, single.stderr[-3000:]
    sums = checksums(single.stdout)
    assert len(sums) == 2, single.stdout[-2000:]
    (value,) = set(sums.values())
    return value


def test_slurm_allocation_runs_one_agent_per_node(slurm_cluster, weird_tmp: Path) -> None:
    argv = ["salloc", "-N2", "--job-name=npl-test", *npu_launch_argv(
        "--launcher", "slurm", "--cards", "1", "--device", "cpu", "--job-id", "sl-job",
        "--log-dir", str(weird_tmp / "sl"), "--kill-timeout", "3", JOB, "--steps", "3")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                            env=slurm_cluster.env, cwd=weird_tmp)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    sums = checksums(result.stdout)
    a, b = slurm_cluster.names
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}, result.stdout[-2000:]
    assert set(sums.values()) == {_reference(weird_tmp)}
    assert "2 rank(s) on 2 node(s) exited 0" in result.stderr
    assert_no_job_processes("sl-job")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_mpirun_runs_one_agent_per_host(ssh_cluster, weird_tmp: Path) -> None:
    hostfile = weird_tmp / "hosts"
    hostfile.write_text("".join(f"{n} slots=1\n" for n in ssh_cluster.names))
    subnet = f"{ssh_cluster.bridge_address.rsplit('.', 1)[0]}.0/24"
    mca = (f"--mca plm_rsh_args '-F {ssh_cluster.ssh_config_path}' "
           f"--mca oob_tcp_if_include {subnet} --mca btl_tcp_if_include {subnet}")
    result = subprocess.run(npu_launch_argv(
        "--launcher", "mpi", "--hostfile", str(hostfile), "--launcher-args", mca,
        "--ssh-option", f"-F {ssh_cluster.ssh_config_path}", "--device", "cpu",
        "--job-id", "mpi-job", "--log-dir", str(weird_tmp / "mpi"), "--kill-timeout", "3",
        JOB, "--steps", "3"), capture_output=True, text=True, timeout=300, cwd=weird_tmp,
        env=ssh_cluster.env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    sums = checksums(result.stdout)
    a, b = ssh_cluster.names
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}
    assert set(sums.values()) == {_reference(weird_tmp)}
    assert_no_job_processes("mpi-job")


def test_by_hand_on_each_node_like_msrun(ssh_cluster, weird_tmp: Path) -> None:
    a, b = ssh_cluster.names
    master = ssh_cluster.addresses[0]
    procs = [ssh_cluster.popen_on(host, npu_launch_argv(
        "--nnodes", "2", "--node-rank", str(i), "--master-addr", master, "--master-port", "29650",
        "--cards", "1", "--device", "cpu", "--job-id", "by-hand", "--log-dir",
        str(weird_tmp / "byhand"), JOB, "--steps", "3"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=weird_tmp) for i, host in enumerate((a, b))]
    outs = [p.communicate(timeout=300) for p in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
    sums = {**checksums(outs[0][0]), **checksums(outs[1][0])}
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}
    assert set(sums.values()) == {_reference(weird_tmp)}
    assert (weird_tmp / "byhand" / "hosts" / b / "summary.json").exists()
    assert_no_job_processes("by-hand")
