"""Slurm over the hosts: a private ``munged`` and ``slurmctld``, one ``slurmd`` per host.

munged (own key and socket, ``AuthInfo=socket=...``) and slurmctld run in the root namespace,
slurmctld on the bridge address and a free port, as on a head node; ``slurmd -N <host>`` runs
inside each host. ``Cluster.env`` carries ``SLURM_CONF`` for ``srun``/``salloc``/``sinfo``,
which are run inside a host, as on a login node. Config, state, spool and the munge socket live
in the cluster's work dir under ``/run/npl-clusters``, which every host shares.
"""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from polling import wait_for

from .common import SLURM_BINARIES, ClusterError, free_port, need_binaries, tail
from .netns import Host

if TYPE_CHECKING:
    from .cluster import Cluster

SLURMD_PORT = 6818


def start_slurm(cluster: "Cluster", timeout: float) -> Path:
    """Start munged, slurmctld and the slurmds; wait until every node is idle. Returns the
    path of ``slurm.conf``."""
    need_binaries(SLURM_BINARIES)
    d = cluster.work_subdir("slurm")
    for sub in ("state", "spool", "munge"):
        cluster.work_subdir("slurm", sub)
    sock = _start_munged(cluster, d / "munge")
    conf = write_slurm_conf(d, cluster.tag, cluster.hosts, cluster.bridge_address, sock,
                            free_port(cluster.bridge_address), cluster.slurm_cpus)
    cluster.start_daemon("slurmctld", None, ["slurmctld", "-D", "-c", "-f", str(conf)])
    for h in cluster.hosts:
        cluster.start_daemon("slurmd", h.name, ["slurmd", "-D", "-N", h.name, "-f", str(conf)])
    env = {**cluster.env, "SLURM_CONF": str(conf)}
    log = d / "slurmctld.log"
    wait_for(lambda: nodes_idle(env, cluster.names), "all slurm nodes idle", timeout, every=0.1,
             check=cluster.daemon_alive_check("slurmctld", None), failure=ClusterError,
             detail=lambda: f"{log}: {tail(log)}")
    return conf


def _start_munged(cluster: "Cluster", d: Path) -> Path:
    os.chmod(d, 0o700)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = d / "munge.socket"
    cluster.start_daemon("munged", None, [
        "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
        f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
        f"--seed-file={d / 'munged.seed'}"])
    wait_for(sock.exists, "munged socket", 10, every=0.1, check=cluster.daemon_alive_check("munged", None),
             failure=ClusterError)
    return sock


def write_slurm_conf(d: Path, tag: str, hosts: list[Host], ctld_address: str, munge_socket: Path,
                     ctld_port: int, cpus: int) -> Path:
    """``slurm.conf`` for one partition of all hosts (no cgroups, no accounting)."""
    lines = [
        f"ClusterName=npl{tag}",
        f"SlurmctldHost={socket.gethostname()}({ctld_address})",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool'}/%n",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'spool'}/slurmd.%n.pid",
        f"SlurmctldLogFile={d / 'slurmctld.log'}",
        f"SlurmdLogFile={d / 'spool'}/slurmd.%n.log",
        f"PlugStackConfig={d / 'plugstack.conf'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=300",
        "InactiveLimit=0",
        "KillWait=5",
        "MinJobAge=10",
    ]
    lines += [f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} State=UNKNOWN" for h in hosts]
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    (d / "plugstack.conf").write_text("")
    path = d / "slurm.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def nodes_idle(env: dict[str, str], names: list[str]) -> bool:
    """``sinfo`` says every node of ``names`` is idle."""
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env,
                         capture_output=True, text=True, timeout=30)
    states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
    return res.returncode == 0 and all(states.get(n) == "idle" for n in names)
