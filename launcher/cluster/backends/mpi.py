"""OpenMPI: one ``mpirun`` starts an agent on every host of the hostfile (one process each)."""
from __future__ import annotations

import os
from typing import Optional

from launcher.cluster.backends import HostfileBackend, LauncherKind, TransportOptions
from launcher.cluster.backends.common import agent_argv, agent_spec, python_of
from launcher.cluster.node_agents import AgentLaunch
from launcher.cluster.payload import PayloadServer
from launcher.config.hostfile import HostSelection
from launcher.errors import ConfigError
from launcher.plan.launch_plan import LaunchPlan
from parallel import contract


class MpiBackend(HostfileBackend):
    kind = LauncherKind.MPI

    def __init__(self, hosts: list[HostSelection], options: TransportOptions) -> None:
        with_user = next((h for h in hosts if h.user), None)
        if with_user is not None:
            # mpirun's --host takes no login name: dropping it would log in as someone else.
            raise ConfigError(f"--launcher mpi: mpirun cannot log in as {with_user.user!r} on "
                              f"{with_user.host} (drop 'user@' from the hostfile and set User "
                              "in ~/.ssh/config)")
        super().__init__(hosts, options)

    serves_payload = True

    def agent_launches(self, plan: LaunchPlan, payload: bytes,
                       served: Optional[PayloadServer] = None) -> list[AgentLaunch]:
        assert served is not None, "mpirun's agents fetch the plan: serves_payload"
        hosts = ",".join(f"{h.host}:1" for h in self._hosts)
        argv = ["mpirun", "-np", str(len(self._hosts)), "--host", hosts,
                "--map-by", "ppr:1:node", "-wdir", plan.workdir, "-x", contract.PAYLOAD_KEY]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        argv += [*self._options.launcher_args,
                 *agent_argv(python_of(plan), served.address, None, "node0")]
        return [AgentLaunch(agent_spec(plan, "mpirun", 0, argv, served), b"",
                            stdin_nodes=frozenset({0}))]
