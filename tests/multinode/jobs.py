"""What the multi-node tests share about jobs on the fake hosts, each answered from inside the
hosts: a job's directory put on every host, its hostfile, its processes in each host's own
process table, its events on each host's own disk.

Nothing here looks at the machine from the root namespace: a check that a job left nothing
running asks every host for its process table (``Cluster.processes``), as ``ps`` there would.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from helpers import RANK_SCRIPTS, is_worker, npu_launch_argv

from launcher.run.strays import GUARDIAN_OF

from .cluster import Cluster

_INIT_EVENT = "initialised"


# ------------------------------------------------------------------ the job's files
def job_dir(cluster: Cluster, path: Path, scripts: Sequence[str] = ("ms_job.py",)) -> Path:
    """Make ``path`` a job directory: the rank scripts copied in from ``tests/rank_scripts``,
    then the whole directory (with anything the test put there first, a hostfile, an env file)
    copied to the same path on every host, as a user would with rsync. Returns ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    for name in scripts:
        shutil.copy(RANK_SCRIPTS / name, path / name)
    cluster.put(path)
    return path


def write_hostfile(folder: Path, cluster: Cluster, *, slots: int = 1, user_on_last: str = "",
                   extra: str = "") -> Path:
    """``folder/hosts``: the cluster's hosts with ``slots`` each (``user_on_last`` logs in to the
    last one), then ``extra`` lines."""
    lines = [f"{n} slots={slots}\n" for n in cluster.names]
    if user_on_last:
        lines[-1] = f"{user_on_last}@{lines[-1]}"
    path = folder / "hosts"
    path.write_text("# test hosts\n" + "".join(lines) + extra)
    return path


def mpi_launcher_args(cluster: Cluster) -> str:
    """``--launcher-args`` for mpirun over the hosts: its ssh config, and the hosts' subnet for
    OpenMPI's own traffic (not the loopback or other interfaces)."""
    subnet = f"{cluster.bridge_address.rsplit('.', 1)[0]}.0/24"
    return (f"--mca plm_rsh_args '-F {cluster.ssh_config_path}' "
            f"--mca oob_tcp_if_include {subnet} --mca btl_tcp_if_include {subnet}")


# ------------------------------------------------------------------ running on node 0
def launch_on(cluster: Cluster, host: str, args: Sequence[str], cwd: Path,
              env: Optional[dict] = None, prefix: Sequence[str] = ()) -> subprocess.Popen:
    """``npu-launch ARGS`` (after ``prefix``, e.g. ``salloc -N2``) started inside ``host``,
    from ``cwd`` there, with its output piped back."""
    return cluster.popen_on(host, [*prefix, *npu_launch_argv(*args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_on_node0(cluster: Cluster, args: Sequence[str], cwd: Path, env: Optional[dict] = None,
                 prefix: Sequence[str] = (), timeout: float = 300) -> subprocess.CompletedProcess:
    """``npu-launch ARGS`` run to the end on the first host, from ``cwd`` there."""
    return cluster.run_on(cluster.names[0], [*prefix, *npu_launch_argv(*args)], cwd=cwd, env=env,
                          timeout=timeout)


def run_python_on(cluster: Cluster, host: str, code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` inside the host (the image's Python, which imports launcher)."""
    return cluster.run_on(host, [sys.executable, "-c", code, *args])


# ------------------------------------------------------------------ the job's processes
def job_processes(cluster: Cluster, job_id: str) -> dict[str, list[dict]]:
    """Per host, its processes whose environment carries ``NPU_LAUNCH_JOB_ID=job_id``."""
    return {host: [p for p in cluster.processes(host) if p["env"].get("NPU_LAUNCH_JOB_ID") == job_id]
            for host in cluster.names}


def job_pids(cluster: Cluster, job_id: str) -> set[tuple[str, int]]:
    """``(host, pid as the host numbers it)`` of every process of the job."""
    return {(host, p["pid"]) for host, procs in job_processes(cluster, job_id).items() for p in procs}


def assert_no_job_processes(cluster: Cluster, job_id: str) -> None:
    """No host runs anything of the job, its agents' guardians included (each host's own
    process table says so)."""
    left = {host: [f"{p['pid']} {' '.join(p['cmdline'])[:120]}" for p in procs]
            for host in cluster.names
            if (procs := [p for p in cluster.processes(host)
                          if job_id in (p["env"].get("NPU_LAUNCH_JOB_ID"),
                                        p["env"].get(GUARDIAN_OF))])}
    assert not left, f"job {job_id} left processes: {left}"


def worker(cluster: Cluster, job_id: str, rank: int) -> tuple[str, int]:
    """``(host, pid there)`` of the job's MindSpore worker ``rank``; fails when there is none."""
    for host, procs in job_processes(cluster, job_id).items():
        for p in procs:
            if is_worker(p["env"], rank):
                return host, p["pid"]
    raise AssertionError(f"job {job_id} runs no worker of rank {rank} on any host")


def kill_in_host(cluster: Cluster, host: str, pid: int, signal_name: str = "KILL") -> None:
    """``kill -s SIGNAL PID`` run inside the host, as its user would."""
    res = cluster.run_on(host, ["kill", "-s", signal_name, str(pid)])
    assert res.returncode == 0, f"kill {pid} on {host}: {res.stderr}"


# ------------------------------------------------------------------ the job's events
def initialised(cluster: Cluster, log_dir: Path, ranks: range) -> bool:
    """Every rank in ``ranks`` reported ``initialised``, in the event files of whichever host
    it ran on (each host keeps its own ranks' events on its own disk)."""
    done: set[int] = set()
    for host in cluster.names:
        events = cluster.probe(host, "events", str(log_dir))
        done |= {int(rank) for rank, names in events.items() if _INIT_EVENT in names}
    return set(ranks) <= done


