"""The plan of a job as plain data: one process spec per rank (plus MindSpore's scheduler).

The plan is what ``--dry-run`` prints (``render``, ``to_json``), what an agent receives
(``from_json``) and what spawning consumes; ``launcher.plan.planner`` lays it out.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import shlex
from typing import Any, Mapping, Optional

from launcher.checkpoints.resume import ResumePoint
from launcher.config.devices import Card, DeviceKind
from launcher.plan.binding import Binding
from parallel import contract

PLAN_FILE = "plan.json"
"""In the job's log directory: the plan its ranks ran (``LaunchPlan.to_json``), read back by
``npu-launch diagnose`` for each rank's host."""


class StartMode(str, enum.Enum):
    """How the ranks find each other.

    ``dynamic-cluster``: MindSpore's scheduler plus workers (msrun's way, works on CPU).
    ``rank-table``: HCCL reads ``RANK_TABLE_FILE``; no scheduler.
    ``single``: one process, no communication, PyNative (``--debug``).
    """

    DYNAMIC_CLUSTER = "dynamic-cluster"
    RANK_TABLE = "rank-table"
    SINGLE = "single"


@dataclasses.dataclass(frozen=True)
class Node:
    """One host of the job and the cards its ranks use, in local-rank order."""

    host: str
    node_rank: int
    cards: tuple[Card, ...]
    user: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class RankAssignment:
    """What a rank table assigns to one local process (rank-table mode)."""

    rank: int
    device_id: int


class Role(str, enum.Enum):
    RANK = "rank"
    SCHEDULER = "scheduler"
    AGENT = "agent"
    """A node agent: npu-launch itself on another host, supervising that host's ranks."""


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One process to start: a rank (``rank`` set), MindSpore's scheduler or a node agent."""

    role: Role
    rank: Optional[int]
    host: str
    node_rank: int
    local_rank: Optional[int]
    device_id: Optional[int]
    log_path: str
    env: Mapping[str, str]
    argv: tuple[str, ...]
    events_path: str = ""
    """A rank's events file (``contract.EVENTS_FILE`` in its env); likewise its error report
    and its stack dump."""
    error_path: str = ""
    stack_path: str = ""
    binding: Optional[Binding] = None
    """``--bind-cores``: the rank's rule, and its cores once found on its host
    (``launcher.plan.binding``); None: not bound."""
    compile_cache: str = ""
    """The folder of MindSpore's compile cache that npu-launch gives the rank
    (``MS_COMPILER_CACHE_PATH`` in its env, ``compile_cache_dir``); empty: none of ours."""

    @property
    def label(self) -> str:
        """``host:rank`` as the console prefix shows it (``host:sched``, ``host:agent``)."""
        names = {Role.RANK: str(self.rank), Role.SCHEDULER: "sched", Role.AGENT: "agent"}
        return f"{self.host}:{names[self.role]}"

    @property
    def command(self) -> tuple[str, ...]:
        """The argv as started: under taskset or numactl when the rank is bound."""
        return self.binding.wrap(self.argv) if self.binding is not None else self.argv

    @property
    def known_command(self) -> tuple[str, ...]:
        """``command`` where it is known yet: a rank bound on another host gets its taskset or
        numactl only there, once its agent found the cores (``launcher.plan.binding``)."""
        bound = self.binding
        return self.command if bound is None or bound.resolved else self.argv

    @property
    def files(self) -> tuple[str, ...]:
        """Every file this process writes (its folders must exist before it starts); the
        compile cache as ``folder/``, so that the folder itself is made on the rank's host."""
        cache = os.path.join(self.compile_cache, "") if self.compile_cache else ""
        return tuple(p for p in (self.log_path, self.events_path, self.error_path,
                                 self.stack_path, cache) if p)


@dataclasses.dataclass(frozen=True)
class Timeouts:
    """How every node's supervisor waits: ``--kill-timeout``, ``--startup-timeout``,
    ``--hang-timeout`` (0: never), ``--hang-grace``, ``--exit-timeout`` and ``--hang-floor``,
    carried in the plan so agents get them with it."""

    kill: float = 10.0
    startup: float = 300.0
    hang: Optional[float] = None
    """None: learnt from the job (``hang_limits.Limits``)."""
    hang_grace: float = 1800.0
    exit: float = 60.0
    """How long node 0 waits, once every rank's script ended cleanly, for the ranks still in
    their exit handlers (0: without a limit; ``attempt.lingering``)."""
    hang_floor: float = 10.0
    """The least a learnt hang limit is (``hang_limits.LEARN_FLOOR`` unless given)."""


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """The whole job, every node's processes included."""

    job_id: str
    log_dir: str
    mode: StartMode
    device: DeviceKind
    master_addr: str
    master_port: int
    world_size: int
    nnodes: int
    scheduler: Optional[ProcessSpec]
    ranks: tuple[ProcessSpec, ...]
    workdir: str
    foreground: bool
    """One rank on one node: it gets the terminal (stdin too, for pdb) instead of a log file."""
    token: str = ""
    """This launch's secret (``contract.TOKEN``): what teardown sweeps by."""
    timeouts: Timeouts = Timeouts()
    restart: int = 0
    """Which restart of the job this is (``--max-restarts``); ranks see it as
    ``contract.RESTART``."""
    replicated: bool = True
    """Every rank holds the whole model (pure data parallelism): one rank's checkpoint can
    stand in for another's."""
    resume: Optional[ResumePoint] = None
    """The complete step a restart resumes from (node 0's ledger); ranks see its step as
    ``contract.RESUME_STEP``, and every node puts the manifest beside its ranks' files."""
    master_name: str = ""
    """The host name ``master_addr`` was resolved from (``--master-addr node1``), or ""."""
    collect_ranks: tuple[int, ...] = ()
    """Ranks whose checkpoint files their agents send to node 0 as they are written
    (``launcher.cluster.collect``): a sliced layout's every rank not on the launcher's host; in data
    parallelism none, or the lowest rank when the launcher's host runs no rank."""
    script_argv: tuple[str, ...] = ()
    """The ranks' argv as given, when an argument holds ``{checkpoint}``: each attempt's plan
    has it replaced by each rank's newest checkpoint (``launcher.plan.checkpoint_arg``)."""

    def restarted(self, attempt: int, resume: Optional[ResumePoint] = None) -> "LaunchPlan":
        """This job again, as its ``attempt``-th restart, resuming from ``resume``."""
        told = {contract.RESTART: str(attempt), contract.TORCHELASTIC_RESTART_COUNT: str(attempt)}
        if resume is not None:
            told[contract.RESUME_STEP] = str(resume.step)

        def again(spec: ProcessSpec) -> ProcessSpec:
            env = {k: v for k, v in spec.env.items() if k != contract.RESUME_STEP}
            return dataclasses.replace(spec, env={**env, **told})
        return dataclasses.replace(self, restart=attempt, resume=resume,
                                   ranks=tuple(map(again, self.ranks)),
                                   scheduler=again(self.scheduler) if self.scheduler else None)

    @property
    def processes(self) -> tuple[ProcessSpec, ...]:
        return ((self.scheduler,) if self.scheduler else ()) + self.ranks

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts the ranks run on, in node order."""
        return tuple(dict.fromkeys(spec.host for spec in self.ranks))

    @property
    def planned_world(self) -> int:
        """The world size the job was planned with: more than ``world_size`` once ``--min-nodes``
        left a host out (``contract.PLANNED_WORLD``)."""
        told = self.ranks[0].env.get(contract.PLANNED_WORLD) if self.ranks else None
        return int(told) if told else self.world_size

    def on_node(self, node_rank: int) -> tuple[ProcessSpec, ...]:
        return tuple(p for p in self.processes if p.node_rank == node_rank)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, default=_json_default)

    @classmethod
    def from_json(cls, text: str) -> "LaunchPlan":
        """The inverse of ``to_json``: how a node agent receives its plan. It is the plan this
        launcher wrote (``asdict``: every field there), so each field is read as required."""
        data = json.loads(text)
        data["mode"] = StartMode(data["mode"])
        data["device"] = DeviceKind(data["device"])
        data["scheduler"] = _spec_from_dict(data["scheduler"]) if data["scheduler"] else None
        data["ranks"] = tuple(_spec_from_dict(r) for r in data["ranks"])
        data["timeouts"] = Timeouts(**data["timeouts"])
        data["resume"] = ResumePoint.from_dict(data["resume"]) if data["resume"] else None
        data["collect_ranks"] = tuple(int(r) for r in data["collect_ranks"])
        data["script_argv"] = tuple(str(a) for a in data["script_argv"])
        return cls(**data)

    def render(self) -> str:
        """The plan as a person reads it (``--dry-run``)."""
        head = (f"job {self.job_id}: {self.world_size} rank(s) on {self.nnodes} node(s), "
                f"{self.mode.value} mode{', in the foreground' if self.foreground else ''}, "
                f"device {self.device.value}, "
                f"master {self.master_addr}:{self.master_port}"
                f"{f' ({self.master_name})' if self.master_name else ''}\nlog dir: {self.log_dir}\n"
                f"working dir: {self.workdir}")
        return "\n".join([head, *(_render_process(spec, self.foreground and spec.role is Role.RANK)
                                   for spec in self.processes)])


def _render_process(spec: ProcessSpec, foreground: bool = False) -> str:
    """One process of ``--dry-run``'s plan; a rank in the foreground writes to the terminal,
    not to its log."""
    who = f"rank {spec.rank}" if spec.role is Role.RANK else spec.role.value
    device = "" if spec.device_id is None else f"  device {spec.device_id}"
    env = "\n".join(f"    {k}={v}" for k, v in sorted(spec.env.items()))
    bound = spec.binding
    cores = "" if bound is None else f"  {bound.describe(spec.host)}\n"
    argv = spec.known_command
    log = "output to this terminal (in the foreground)" if foreground else f"log {spec.log_path}"
    return (f"{who}  [{spec.label}]{device}  {log}\n{cores}  env:\n{env}\n"
            f"  cmd: {shlex.join(argv)}")


def _spec_from_dict(data: dict) -> ProcessSpec:
    bound = data["binding"]
    return ProcessSpec(**{**data, "role": Role(data["role"]), "argv": tuple(data["argv"]),
                          "binding": Binding.from_dict(bound) if bound else None})


def _json_default(value: Any) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    return dict(value)
