"""ssh: one agent per host, each an ``ssh`` client fed the plan on stdin (OpenSSH, BatchMode),
at most ``--fanout`` of them connecting at once (``launcher.fanout``)."""
from __future__ import annotations

import shlex
from typing import Optional, Sequence

from launcher.backends import HostfileBackend, LauncherKind, TransportOptions
from launcher.backends.common import agent_argv, agent_spec, python_of, split_ssh_options
from launcher.cluster import AgentLaunch
from launcher.payload import PayloadServer
from launcher.plan import LaunchPlan

__all__ = ["SshBackend", "split_ssh_options", "ssh_argv"]


def ssh_argv(host: str, user: Optional[str], remote: Sequence[str], workdir: str,
             options: TransportOptions) -> list[str]:
    """``ssh`` running ``remote`` in ``workdir`` on ``host``.

    ``options.ssh_options`` are the ``--ssh-option`` values as given (split here by
    ``split_ssh_options``). The remote side is a shell, so every word is quoted; the host and
    user come from a validated hostfile, and ``--`` ends ssh's options before them, so
    nothing after it is read as an option.
    """
    command = f"cd -- {shlex.quote(workdir)} && exec {shlex.join(remote)}"
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    if options.ssh_port is not None:
        argv += ["-p", str(options.ssh_port)]
    argv += split_ssh_options(options.ssh_options)
    return argv + ["--", f"{user}@{host}" if user else host, command]


class SshBackend(HostfileBackend):
    kind = LauncherKind.SSH

    serves_payload = False

    def agent_launches(self, plan: LaunchPlan, payload: bytes,
                       served: Optional[PayloadServer] = None) -> list[AgentLaunch]:
        launches = []
        for node_rank, host in enumerate(self._hosts):
            remote = agent_argv(python_of(plan), "-", node_rank)
            argv = ssh_argv(host.host, host.user, remote, plan.workdir, self._options)
            launches.append(AgentLaunch(agent_spec(plan, host.host, node_rank, argv), payload,
                                        self._options.fanout))
        return launches
