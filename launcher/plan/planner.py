"""Hosts x cards -> a ``LaunchPlan``: each rank's identity, files and environment.

Nothing here starts a process or reads ``os.environ`` (the caller passes the environment the
ranks inherit, in ``PlanInputs``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Mapping, Optional, Sequence

from launcher.config.devices import DeviceKind
from launcher.config.launch_config import LaunchConfig
from launcher.plan.binding import Binding, planned
from launcher.plan.checkpoint_arg import has_placeholder
from launcher.plan.launch_plan import LaunchPlan, Node, ProcessSpec, RankAssignment, Role, StartMode, Timeouts
from parallel import contract

SCHEDULER_MODULE = "parallel.mode.scheduler"
# MindSpore retries refused connections every 3-5 s by default; the rank hook already waits for
# the scheduler, so any retry that remains should be short.
_FAST_RETRY = {contract.MS_RETRY_INTERVAL_LOWER: "1", contract.MS_RETRY_INTERVAL_UPPER: "1"}


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What the caller found out before planning: ports, hosts, the rank table's assignments."""

    job_id: str
    log_dir: str
    master_addr: str
    master_port: int
    device: DeviceKind
    nodes: tuple[Node, ...]
    base_pythonpath: str = ""
    boot_dir: str = ""
    assignments: Optional[Mapping[int, Sequence[RankAssignment]]] = None
    rank_table_path: Optional[str] = None
    world_size: Optional[int] = None
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    agents: bool = False
    """Node agents run the ranks (multi-node backends): no rank may take the terminal."""
    inherited: frozenset[str] = frozenset()
    """Names already set in the environment the ranks inherit: the plan's defaults yield to them."""
    token: str = ""
    """This launch's secret; every process carries it (``contract.TOKEN``)."""
    replicated: bool = True
    """The layout is pure data parallelism (``LaunchPlan.replicated``)."""
    launcher_node: Optional[int] = None
    """The node whose host the launcher runs on; None when it runs on none of them."""


def build_plan(config: LaunchConfig, inputs: PlanInputs) -> LaunchPlan:
    """Lay out every process of the job. ``inputs.assignments`` switches on rank-table mode."""
    mode = _start_mode(config, inputs)
    world = inputs.world_size or sum(len(n.cards) for n in inputs.nodes)
    ranks = tuple(_rank_specs(config, inputs, mode, world))
    scheduler = _scheduler_spec(config, inputs, world) if mode is StartMode.DYNAMIC_CLUSTER else None
    return LaunchPlan(job_id=inputs.job_id, log_dir=inputs.log_dir, mode=mode,
                      device=inputs.device, master_addr=inputs.master_addr,
                      master_port=inputs.master_port, world_size=world,
                      nnodes=len(inputs.nodes), scheduler=scheduler, ranks=ranks,
                      workdir=os.path.abspath(config.workdir or "."),
                      foreground=len(ranks) == 1 and len(inputs.nodes) == 1
                      and not inputs.agents, token=inputs.token, replicated=inputs.replicated,
                      timeouts=Timeouts(config.kill_timeout, config.startup_timeout,
                                        config.hang_timeout, config.hang_grace,
                                        config.exit_timeout, config.hang_floor),
                      collect_ranks=_collect_ranks(config, inputs, ranks),
                      script_argv=ranks[0].argv if ranks and has_placeholder(config.script_args) else ())


def _collect_ranks(config: LaunchConfig, inputs: PlanInputs,
                   ranks: Sequence[ProcessSpec]) -> tuple[int, ...]:
    """What node 0 needs sent to resume without the other hosts: each rank's slice that is not
    on the launcher's host; in data parallelism one replica, if the launcher's host has none.
    Nothing for a job without agents, or with ``--no-checkpoint-collect``."""
    if not inputs.agents or not config.checkpoint_collect:
        return ()
    elsewhere = sorted(s.rank for s in ranks
                       if s.rank is not None and s.node_rank != inputs.launcher_node)
    if inputs.replicated:
        return () if len(elsewhere) < len(ranks) else tuple(elsewhere[:1])
    return tuple(elsewhere)


def _start_mode(config: LaunchConfig, inputs: PlanInputs) -> StartMode:
    if inputs.assignments is not None:
        return StartMode.RANK_TABLE
    return StartMode.SINGLE if config.debug else StartMode.DYNAMIC_CLUSTER


def _rank_specs(config: LaunchConfig, inputs: PlanInputs, mode: StartMode, world: int):
    first_rank = 0
    for node in inputs.nodes:
        assigned = inputs.assignments[node.node_rank] if inputs.assignments is not None else None
        for local_rank, card in enumerate(node.cards):
            rank = assigned[local_rank].rank if assigned else first_rank + local_rank
            device = assigned[local_rank].device_id if assigned else card.logical
            card_id = card.physical if inputs.device is DeviceKind.NPU else None
            binding = planned(config.bind_cores, config.bind_numa, card_id)
            yield _rank_spec(config, inputs, mode, node, local_rank, rank, device, world,
                             binding)
        first_rank += len(node.cards)


def _rank_spec(config: LaunchConfig, inputs: PlanInputs, mode: StartMode, node: Node,
               local_rank: int, rank: int, device: int, world: int,
               binding: Optional[Binding] = None) -> ProcessSpec:
    node_dir = node_log_dir(inputs, node.host)
    files = {"events_path": os.path.join(node_dir, "events", f"rank_{rank}.jsonl"),
             "error_path": os.path.join(node_dir, "errors", f"rank_{rank}.json"),
             "stack_path": os.path.join(node_dir, "stacks", f"rank_{rank}.txt"),
             "compile_cache": compile_cache_dir(config, inputs, world)}
    env = {
        **inputs.extra_env,  # first: what the plan sets below wins over node 0's environment
        contract.RANK_ID: str(rank), contract.RANK: str(rank),
        contract.RANK_SIZE: str(world), contract.WORLD_SIZE: str(world),
        contract.LOCAL_RANK: str(local_rank), contract.LOCAL_WORLD_SIZE: str(len(node.cards)),
        contract.DEVICE_ID: str(device),
        contract.MASTER_ADDR: inputs.master_addr, contract.MASTER_PORT: str(inputs.master_port),
        contract.EVENTS_FILE: files["events_path"], contract.ERROR_FILE: files["error_path"],
        contract.STACK_FILE: files["stack_path"],
        **_torchrun_env(config, inputs, node, rank, world),
        **_common_env(inputs, node),
    }
    if files["compile_cache"]:
        env.update({contract.MS_COMPILER_CACHE_ENABLE: "1",
                    contract.MS_COMPILER_CACHE_PATH: files["compile_cache"]})
    if config.hang_timeout != 0:
        env[contract.PROGRESS] = "1"
    if not _user_sets(contract.ASCEND_PROCESS_LOG_PATH, config, inputs):
        env[contract.ASCEND_PROCESS_LOG_PATH] = ascend_log_dir(inputs.log_dir, rank)
    if mode is StartMode.DYNAMIC_CLUSTER:
        env.update(_cluster_env(config, inputs, world))
        env.update({contract.MS_ROLE: contract.ROLE_WORKER, contract.MS_NODE_ID: str(rank),
                    contract.WAIT_FOR_SCHEDULER: "1"})
    elif mode is StartMode.RANK_TABLE:
        env[contract.RANK_TABLE_FILE] = os.path.abspath(inputs.rank_table_path or "")
    else:
        env[contract.DEBUG] = "1" if config.debug else "0"
    _add_user_env(env, config, inputs)
    return ProcessSpec(role=Role.RANK, rank=rank, host=node.host, node_rank=node.node_rank,
                       local_rank=local_rank, device_id=device,
                       log_path=os.path.join(node_dir, f"rank_{rank}.log"), env=env,
                       argv=(config.python, config.script, *config.script_args),
                       binding=binding, **files)


def _torchrun_env(config: LaunchConfig, inputs: PlanInputs, node: Node, rank: int,
                  world: int) -> dict[str, str]:
    """What torchrun's agent sets in a worker beyond the identity (``contract.TORCH_ENV``), so
    that a torch or torch_npu script runs as under torchrun. Rank 0 listens on ``MASTER_PORT``
    itself (no agent store), as under torchrun's c10d rendezvous."""
    return {contract.GROUP_RANK: str(node.node_rank),
            contract.GROUP_WORLD_SIZE: str(len(inputs.nodes)),
            contract.ROLE_RANK: str(rank), contract.ROLE_NAME: "default",
            contract.ROLE_WORLD_SIZE: str(world), contract.TORCHELASTIC_RUN_ID: inputs.job_id,
            contract.TORCHELASTIC_RESTART_COUNT: "0",
            contract.TORCHELASTIC_MAX_RESTARTS: str(config.max_restarts),
            contract.TORCHELASTIC_USE_AGENT_STORE: "False"}


def _scheduler_spec(config: LaunchConfig, inputs: PlanInputs, world: int) -> ProcessSpec:
    node = inputs.nodes[0]
    env = {**inputs.extra_env, **_common_env(inputs, node), **_cluster_env(config, inputs, world),
           contract.MS_ROLE: contract.ROLE_SCHEDULER}
    _add_user_env(env, config, inputs)
    return ProcessSpec(role=Role.SCHEDULER, rank=None, host=node.host, node_rank=node.node_rank, local_rank=None,
                       device_id=None,
                       log_path=os.path.join(node_log_dir(inputs, node.host), "scheduler.log"),
                       env=env, argv=(config.python, "-m", SCHEDULER_MODULE))


def node_log_dir(inputs: PlanInputs, host: str) -> str:
    """Where a node keeps its ranks' own logs: the job's log dir, or a folder per host when
    nodes may share one file system (node 0 then gathers streamed copies at the top)."""
    separate = len(inputs.nodes) > 1 or inputs.agents
    return os.path.join(inputs.log_dir, "hosts", host) if separate else inputs.log_dir


COMPILE_CACHE = "compile_cache"
"""The log dir's folder of MindSpore's compile caches, one per launch."""


def compile_cache_dir(config: LaunchConfig, inputs: PlanInputs, world: int) -> str:
    """Where the ranks keep MindSpore's compile cache, so that a restart loads its graphs
    instead of compiling them again: ``compile_cache/<launch>`` in the job's log dir (on every
    host; MindSpore keeps each rank's graphs in ``rank_<N>/`` there). Empty when the user set
    either variable (in the environment or by ``--env``: even ``MS_COMPILER_CACHE_ENABLE=0``
    alone), or with ``--no-compile-cache``.

    ``<launch>`` comes from this launch's token and the world size: MindSpore checks only that
    the script's files are unchanged before it runs a cached graph, not the shapes it was
    compiled for, so a new launch into the same ``--log-dir`` with other arguments (or a restart
    on fewer ranks) must not find the old graphs (it would train on them silently)."""
    names = (contract.MS_COMPILER_CACHE_ENABLE, contract.MS_COMPILER_CACHE_PATH)
    user = dict(config.env)
    if not config.compile_cache or any(n in inputs.inherited or n in user or
                                       n in inputs.extra_env for n in names):
        return ""
    launch = hashlib.sha256(f"{inputs.token} {world}".encode()).hexdigest()[:12]
    return os.path.join(inputs.log_dir, COMPILE_CACHE, launch)


ASCEND_LOGS = "ascend"
"""The log dir's folder of CANN's own logs, one ``rank_<N>`` folder per rank."""


def ascend_log_dir(log_dir: str, rank: int) -> str:
    """Where CANN writes rank ``rank``'s plog and device logs (``ASCEND_PROCESS_LOG_PATH``)."""
    return os.path.join(log_dir, ASCEND_LOGS, f"rank_{rank}")


def _user_sets(name: str, config: LaunchConfig, inputs: PlanInputs) -> bool:
    return name in inputs.inherited or name in dict(config.env) or name in inputs.extra_env


def _cluster_env(config: LaunchConfig, inputs: PlanInputs, world: int) -> dict[str, str]:
    env = {contract.MS_SCHED_HOST: inputs.master_addr,
           contract.MS_SCHED_PORT: str(inputs.master_port),
           contract.MS_WORKER_NUM: str(world)}
    env.update({k: v for k, v in _FAST_RETRY.items()
                if k not in inputs.inherited and k not in inputs.extra_env})
    return env


def _add_user_env(env: dict[str, str], config: LaunchConfig, inputs: PlanInputs) -> None:
    """``--env`` on top; a ``PYTHONPATH`` of the user's goes after the boot directory, which
    must stay first (it loads the rank hook: error reports, the parent-death signal)."""
    env.update(config.env)
    user_path = dict(config.env).get("PYTHONPATH")
    if user_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (inputs.boot_dir, user_path) if p)


def _common_env(inputs: PlanInputs, node: Node) -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (inputs.boot_dir, inputs.base_pythonpath) if p)
    env = {
        contract.JOB_ID: inputs.job_id, contract.TOKEN: inputs.token, contract.LOG_DIR: inputs.log_dir,
        contract.DEVICE_KIND: inputs.device.value, contract.HOST: node.host,
        contract.NODE_RANK: str(node.node_rank), contract.NNODES: str(len(inputs.nodes)),
        contract.RESTART: "0", "PYTHONUNBUFFERED": "1",
    }
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env
