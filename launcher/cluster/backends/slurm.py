"""Slurm: inside an allocation, one ``srun`` starts an agent on every node (one task each)."""
from __future__ import annotations

import copy
import subprocess
from typing import Mapping, Optional

from launcher.cluster.backends import LauncherKind, TransportOptions
from launcher.cluster.backends.common import agent_argv, agent_spec, python_of
from launcher.cluster.node_agents import AgentLaunch
from launcher.cluster.payload import PayloadServer
from launcher.config.hostfile import HostSelection, check_host_name
from launcher.errors import ConfigError
from launcher.limits import MAX_NODES, shown
from launcher.plan.launch_plan import LaunchPlan

SCONTROL_TIMEOUT = 30.0


def allocation_hosts(environ: Mapping[str, str]) -> list[str]:
    """The allocation's node names, expanded by ``scontrol`` (``node[1-3]`` -> 3 names)."""
    variable = "SLURM_JOB_NODELIST" if environ.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    nodelist = environ.get(variable)
    if not nodelist:
        raise ConfigError("--launcher slurm: not inside a Slurm allocation "
                          "(SLURM_JOB_NODELIST is not set)")
    if nodelist.startswith("-"):  # scontrol would take it for one of its options
        raise ConfigError(f"--launcher slurm: node list {shown(nodelist)} starts with '-'")
    if not nodelist.isascii():  # no host name has other characters (check_host_name)
        raise ConfigError(f"--launcher slurm: {variable} {shown(nodelist)}: not ASCII text "
                          "(node names are letters, digits, '.', '_' and '-')")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             check=True, env=dict(environ), timeout=SCONTROL_TIMEOUT).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"--launcher slurm: cannot expand {shown(nodelist)} with scontrol: "
                          f"{_complaint(e)}".strip()) from None
    try:
        names = out.decode("utf-8").split()
    except UnicodeDecodeError:
        raise ConfigError(f"--launcher slurm: scontrol expands {variable} {shown(nodelist)} to "
                          "names that are not UTF-8 text") from None
    return _checked(names, nodelist)


def _complaint(e: BaseException) -> str:
    """scontrol's last line of stderr, else the error."""
    stderr = getattr(e, "stderr", None)
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else ""
    lines = text.strip().splitlines()
    return (lines[-1] if lines else str(e))[:200]


def _checked(names: list[str], nodelist: str) -> list[str]:
    """Node names go on srun's command line and into log paths: the hostfile's rules apply."""
    if len(names) > MAX_NODES:
        raise ConfigError(f"--launcher slurm: the allocation has {len(names)} nodes, more than "
                          f"the {MAX_NODES} a job may have")
    seen: dict[str, str] = {}
    for name in names:
        problem = check_host_name(name)
        if problem is not None:
            raise ConfigError(f"--launcher slurm: {shown(nodelist)}: {problem}")
        first = seen.get(name.lower())
        if first is not None:  # two nodes of the plan on one host: refused as in a hostfile
            same = "" if first == name else f" as {first!r}; names ignore case"
            raise ConfigError(f"--launcher slurm: {shown(nodelist)}: duplicate node {name!r} "
                              f"(given before{same})")
        seen[name.lower()] = name
    return names


class SlurmBackend:
    kind = LauncherKind.SLURM

    def __init__(self, environ: Mapping[str, str], cards: int, nnodes: Optional[int],
                 options: TransportOptions) -> None:
        names = allocation_hosts(environ)
        if nnodes is not None:
            if nnodes < 1:
                raise ConfigError(f"--nnodes {nnodes}: must be at least 1")
            if nnodes > len(names):
                raise ConfigError(f"--nnodes {nnodes}: the allocation has {len(names)} node(s)")
            names = names[:nnodes]
        self._hosts = [HostSelection(name, None, tuple(range(cards))) for name in names]
        self._options = options

    def hosts(self) -> list[HostSelection]:
        return self._hosts

    def only(self, hosts: list[HostSelection]) -> "SlurmBackend":
        """The same backend on fewer of its allocation's nodes (``--min-nodes``)."""
        smaller = copy.copy(self)
        smaller._hosts = list(hosts)
        return smaller

    serves_payload = True

    def agent_launches(self, plan: LaunchPlan, payload: bytes,
                       served: Optional[PayloadServer] = None) -> list[AgentLaunch]:
        assert served is not None, "srun's agents fetch the plan: serves_payload"
        n = len(self._hosts)
        argv = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1",
                f"--nodelist={','.join(h.host for h in self._hosts)}", "--kill-on-bad-exit=1",
                f"--chdir={plan.workdir}", f"--job-name=npu-launch-{plan.job_id}",
                *self._options.launcher_args,
                *agent_argv(python_of(plan), served.address, None)]
        return [AgentLaunch(agent_spec(plan, "srun", 0, argv, served), b"")]
