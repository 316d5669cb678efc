"""A torch DDP job over two real (namespace) hosts, by ssh and by Slurm's srun: the script
(``tests/rank_scripts/torch_ddp.py``) runs unchanged, ends with the checksums it reaches under
torchrun on one node, and no host runs a MindSpore process (no scheduler, no rank loads it)."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from .jobs import assert_no_job_processes, job_dir, launch_on, run_on_node0, write_hostfile

pytestmark = [pytest.mark.multinode, pytest.mark.torch]
_CHECKSUM = re.compile(r"\[([^:\]]+):(\d+)\] rank \d+/2 checksum (\S+)")


@pytest.fixture
def torchrun_checksum(torchrun_result: subprocess.CompletedProcess) -> str:
    """What both ranks reach under torchrun, 2 ranks on one node (here, outside the hosts; the
    session's ``torchrun_result``)."""
    (value,) = set(re.findall(r"checksum (\S+)", torchrun_result.stdout))
    return value


def _assert_torch_only(cluster, log_dir: Path, stdout: str) -> None:
    """Neither host started MindSpore's scheduler, and every rank told it imported torch only."""
    assert "mindspore loaded: True" not in stdout and stdout.count("mindspore loaded: False") == 2
    for host in cluster.names:
        assert not cluster.exists(host, log_dir / "hosts" / host / "scheduler.log"), host
    for rank, host in enumerate(cluster.names):
        events = cluster.read_text(host, log_dir / "hosts" / host / "events" / f"rank_{rank}.jsonl")
        assert events is not None, (host, rank)
        names = {e.get("name") for e in map(json.loads, events.splitlines())
                 if e["event"] == "framework"}
        assert names == {"torch"}, (host, rank, names)


def _run(cluster, tmp: Path, job: str, *launcher: str, prefix: tuple[str, ...] = ()
         ) -> subprocess.CompletedProcess:
    write_hostfile(tmp, cluster)
    job_dir(cluster, tmp, scripts=("torch_ddp.py",))
    result = run_on_node0(cluster, [*launcher, "--device", "cpu", "--job-id", job, "--log-dir",
                                    str(tmp / job), "--kill-timeout", "3",
                                    str(tmp / "torch_ddp.py")], cwd=tmp, prefix=prefix)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _checksums(stdout: str) -> dict[tuple[str, int], str]:
    return {(host, int(rank)): value for host, rank, value in _CHECKSUM.findall(stdout)}


def test_ddp_over_ssh_hosts_ends_as_under_torchrun(ssh_cluster, weird_tmp: Path,
                                                   torchrun_checksum: str) -> None:
    result = _run(ssh_cluster, weird_tmp, "torch-ssh", "--hostfile", str(weird_tmp / "hosts"),
                  "--ssh-option", f"-F {ssh_cluster.ssh_config_path}")
    a, b = ssh_cluster.names
    assert _checksums(result.stdout) == {(a, 0): torchrun_checksum, (b, 1): torchrun_checksum}
    _assert_torch_only(ssh_cluster, weird_tmp / "torch-ssh", result.stdout)
    assert_no_job_processes(ssh_cluster, "torch-ssh")


def test_ddp_in_a_slurm_allocation_ends_as_under_torchrun(slurm_cluster, weird_tmp: Path,
                                                          torchrun_checksum: str) -> None:
    result = _run(slurm_cluster, weird_tmp, "torch-slurm", "--launcher", "slurm", "--cards", "1",
                  prefix=("salloc", "-N2", "--job-name=npl-test"))
    a, b = slurm_cluster.names
    assert _checksums(result.stdout) == {(a, 0): torchrun_checksum, (b, 1): torchrun_checksum}
    _assert_torch_only(slurm_cluster, weird_tmp / "torch-slurm", result.stdout)
    assert_no_job_processes(slurm_cluster, "torch-slurm")


def test_ddp_in_kubeflow_pods_ends_as_under_torchrun(ssh_cluster, weird_tmp: Path,
                                                     torchrun_checksum: str) -> None:
    """Each host plays one pod of a PyTorchJob: the same command, the operator's variables
    (the master by its service name), no ssh; rank 0's pod listens on MASTER_PORT itself."""
    a, b = ssh_cluster.names
    job_dir(ssh_cluster, weird_tmp, scripts=("torch_ddp.py",))
    env = {k: v for k, v in ssh_cluster.env.items() if k not in ("MS_ROLE", "MASTER_ADDR", "RANK")}
    pod = {**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": a,
           "MASTER_PORT": "29663", "WORLD_SIZE": "2"}
    procs = {job: launch_on(ssh_cluster, host, ["--device", "cpu", "--job-id", job, "--log-dir",
                                                str(weird_tmp / job), "--kill-timeout", "3",
                                                str(weird_tmp / "torch_ddp.py")],
                            cwd=weird_tmp, env={**pod, "RANK": str(i)})
             for i, (job, host) in enumerate((("kf-torch-0", a), ("kf-torch-1", b)))}
    outs = {job: proc.communicate(timeout=300) for job, proc in procs.items()}
    for job, proc in procs.items():
        assert proc.returncode == 0, (job, outs[job][1][-3000:])
    stdout = outs["kf-torch-0"][0] + outs["kf-torch-1"][0]
    assert _checksums(stdout) == {(a, 0): torchrun_checksum, (b, 1): torchrun_checksum}
    for job, host in (("kf-torch-0", a), ("kf-torch-1", b)):
        assert not ssh_cluster.exists(host, weird_tmp / job / "hosts" / host / "scheduler.log")
        assert_no_job_processes(ssh_cluster, job)
    assert "mindspore loaded: True" not in stdout
