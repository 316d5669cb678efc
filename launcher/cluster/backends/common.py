"""Pieces the backends share: the agent's command line and its spec, the ssh options."""
from __future__ import annotations

import os
from typing import Optional, Sequence

from launcher.cluster.payload import PayloadServer
from launcher.limits import shell_words
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec, Role
from parallel import contract

AGENT_MODULE = "launcher.cluster.agent"


def agent_argv(python: str, plan_source: str, node_rank: Optional[int],
               stdin_control: str = "all") -> list[str]:
    argv = [python, "-m", AGENT_MODULE, "--plan", plan_source, "--stdin-control", stdin_control]
    return argv + (["--node-rank", str(node_rank)] if node_rank is not None else [])


def agent_spec(plan: LaunchPlan, host: str, node_rank: int, argv: Sequence[str],
               served: Optional[PayloadServer] = None) -> ProcessSpec:
    """Node 0's record of one agent process; its output is kept in ``agents/<host>.log``. An
    srun or mpirun carries the key to the ``served`` plan in its environment."""
    env = {contract.JOB_ID: plan.job_id}
    if served is not None:
        env[contract.PAYLOAD_KEY] = served.key
    return ProcessSpec(role=Role.AGENT, rank=None, host=host, node_rank=node_rank,
                       local_rank=None, device_id=None,
                       log_path=os.path.join(plan.log_dir, "agents", f"{host}.log"),
                       env=env, argv=tuple(argv))


def python_of(plan: LaunchPlan) -> str:
    return plan.ranks[0].argv[0]


def split_ssh_options(options: Sequence[str]) -> tuple[str, ...]:
    """The words of the ``--ssh-option`` values, each split as a shell would (``-F "a b"``);
    ``ConfigError`` for a bad one (see ``limits.shell_words``)."""
    return tuple(word for option in options for word in shell_words("--ssh-option", option))
