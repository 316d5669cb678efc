"""ssh: one agent per host, each an ``ssh`` client fed the plan on stdin (OpenSSH, BatchMode),
at most ``--fanout`` of them connecting at once (``launcher.cluster.fanout``)."""
from __future__ import annotations

import shlex
from typing import Optional, Sequence

from launcher.cluster.backends import HostfileBackend, LauncherKind, TransportOptions
from launcher.cluster.backends.common import agent_argv, agent_spec, python_of, split_ssh_options
from launcher.cluster.backends.ssh_mux import destination, ssh_base
from launcher.cluster.node_agents import AgentLaunch
from launcher.cluster.payload import PayloadServer
from launcher.plan.launch_plan import LaunchPlan

__all__ = ["SshBackend", "split_ssh_options", "ssh_argv"]


def ssh_argv(host: str, user: Optional[str], remote: Sequence[str], workdir: str,
             options: TransportOptions) -> list[str]:
    """``ssh`` running ``remote`` in ``workdir`` on ``host``.

    ``options.ssh_options`` are the ``--ssh-option`` values as given (split here by
    ``split_ssh_options``). The remote side is a shell, so every word is quoted; the host and
    user come from a validated hostfile, and ``--`` ends ssh's options before them, so
    nothing after it is read as an option. With ``options.masters``, it rides on the host's
    control master (``launcher.cluster.backends.ssh_mux``) when there is one.
    """
    command = f"cd -- {shlex.quote(workdir)} && exec {shlex.join(remote)}"
    control = options.masters.path_for(host, user, options.ssh_port) if options.masters else None
    mux = ["-o", "ControlMaster=no", "-o", f"ControlPath={control}"] if control else []
    return ssh_base(options.ssh_port, options.ssh_options, mux) + ["--", destination(host, user),
                                                                   command]


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
