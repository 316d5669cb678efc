"""How node 0 reaches the other hosts: one module per engine (ssh, Slurm, OpenMPI).

Each backend answers two questions: which hosts make up the job (``hosts``), and which
processes start the node agents on them (``agent_launches``). Everything else, the plan, the
agents and the teardown, is the same for all.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Mapping, Optional, Protocol

from launcher.cluster.backends.common import split_ssh_options
from launcher.cluster.backends.ssh_mux import SshMasters
from launcher.cluster.node_agents import AgentLaunch
from launcher.cluster.payload import PayloadServer
from launcher.config.hostfile import HostSelection
from launcher.limits import DEFAULT_FANOUT
from launcher.plan.launch_plan import LaunchPlan


class LauncherKind(str, enum.Enum):
    """``auto``: slurm inside an allocation, else ssh with a hostfile, else local (an
    operator's Kubernetes pod is detected before this, ``launcher.plan.pods``: its share runs
    locally)."""

    AUTO = "auto"
    LOCAL = "local"
    SSH = "ssh"
    SLURM = "slurm"
    MPI = "mpi"


@dataclasses.dataclass(frozen=True)
class TransportOptions:
    """What the user said about reaching hosts: ssh port and options, extra srun/mpirun args,
    and how many ssh connections may be set up at once (``--fanout``, ``launcher.cluster.fanout``)."""

    ssh_port: Optional[int] = None
    ssh_options: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    fanout: int = DEFAULT_FANOUT
    masters: Optional[SshMasters] = dataclasses.field(default=None, compare=False, repr=False)
    """This launch's ssh control masters (``launcher.cluster.backends.ssh_mux``): preflight opens one
    per host, every later ssh to it rides on it; None: each ssh connects on its own."""


class Backend(Protocol):
    kind: LauncherKind
    serves_payload: bool
    """Its agents fetch the payload from the launcher (``launcher.cluster.payload``); else they get it
    on their stdin."""

    def hosts(self) -> list[HostSelection]:
        """The job's hosts in node-rank order, with the cards each may use."""

    def agent_launches(self, plan: LaunchPlan, payload: bytes,
                       served: Optional[PayloadServer] = None) -> list[AgentLaunch]:
        """The processes that start every node's agent, fed ``payload`` (or pointed at it,
        ``served``)."""


class HostfileBackend:
    """A backend whose hosts come from a hostfile (ssh, OpenMPI)."""

    def __init__(self, hosts: list[HostSelection], options: TransportOptions) -> None:
        split_ssh_options(options.ssh_options)  # refused here, before anything starts
        self._hosts = hosts
        self._options = options

    def hosts(self) -> list[HostSelection]:
        return self._hosts

    @property
    def options(self) -> TransportOptions:
        """How its hosts are reached (``launcher.cluster.card_checks`` asks one again over ssh)."""
        return self._options


def choose_kind(requested: LauncherKind, environ: Mapping[str, str],
                has_hostfile: bool) -> LauncherKind:
    if requested is not LauncherKind.AUTO:
        return requested
    if environ.get("SLURM_JOB_ID") and environ.get("SLURM_JOB_NODELIST"):
        return LauncherKind.SLURM
    return LauncherKind.SSH if has_hostfile else LauncherKind.LOCAL
