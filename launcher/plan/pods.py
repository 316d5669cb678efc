"""A Kubernetes pod that an operator placed: which node of the job it is, and its rank table.

In such a pod the operator has already chosen everything a job started by hand on every node
needs (``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``), and says it in the
pod's environment:

* MindCluster's ascend-operator (also for Volcano jobs it serves), for MindSpore: ``MS_ROLE``
  (``MS_SCHED`` in the one scheduler pod, ``MS_WORKER`` in every worker pod), ``MS_SCHED_HOST``
  and ``MS_SCHED_PORT`` (the scheduler pod's address: its own IP there, its service's elsewhere),
  ``MS_WORKER_NUM`` (the job's ranks), ``MS_LOCAL_WORKER`` (each pod's), ``MS_NODE_RANK`` (the
  worker pod's index; 0 in the scheduler pod), ``MS_SERVER_NUM`` (0) and ``NPU_POD`` (whether
  this pod has cards: a scheduler pod without them runs no rank). Its HCCL rank table is
  mounted at ``/user/serverid/devindex/config/hccl.json`` and reads ``"status":
  "initializing"`` until every pod of the job is placed, then ``"completed"``.
* Kubeflow's training operator (PyTorchJob) and operators like it: ``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK`` (the pod's index, the master's 0) and ``WORLD_SIZE`` (the pods
  times ``PET_NPROC_PER_NODE``, which newer versions set with ``PET_NNODES``; the
  ascend-operator's PyTorch jobs set it to the job's cards, with ``LOCAL_WORLD_SIZE``).

``detect`` reads that (only with ``--launcher auto``, only where ``KUBERNETES_SERVICE_HOST``
says this is a pod); ``node_config`` makes the job a node's share started by hand;
``share`` leaves out of the plan what another pod runs (the ascend-operator's scheduler has a
pod of its own); ``launcher.plan.pod_waits`` waits for what the pod needs before anything
starts.
The findings and their sources: ``tests/fixtures/pods/README.md``.
"""
from __future__ import annotations

import dataclasses
import enum
import ipaddress
import os
import re
import socket
from typing import Mapping, Optional

from launcher.config.launch_config import LaunchConfig
from launcher.errors import ConfigError
from launcher.limits import MAX_NODES, MAX_RANKS_PER_NODE, check_path_length, shown
from launcher.plan.launch_plan import LaunchPlan
from rank_tables.bounded import whole_number

RANK_TABLE_PATH = "/user/serverid/devindex/config/hccl.json"
"""Where MindCluster mounts the job's rank table in every pod (hostPath or ConfigMap)."""
RANK_TABLE_ENV = "NPU_LAUNCH_POD_RANK_TABLE"
"""Another path for the pod's rank table: for tests, and for clusters that mount it elsewhere
(where it is set, the table is waited for even if its folder does not exist yet)."""
KUBERNETES = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every container of every pod."""

_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                        r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")
"""A DNS name (a Kubernetes service's): dot-separated labels of letters, digits, ``-`` and ``_``."""
_ASCEND_KEYS = ("MS_ROLE", "MS_SCHED_HOST", "MS_WORKER_NUM")
_KUBEFLOW_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


class Operator(str, enum.Enum):
    ASCEND = "ascend-operator"
    KUBEFLOW = "kubeflow-style"


@dataclasses.dataclass(frozen=True)
class Pod:
    """This pod's place in the job, as its operator's environment says it."""

    operator: Operator
    role: str
    """How the operator names this pod: ``MS_ROLE=MS_WORKER``, ``RANK=1``."""
    nnodes: int
    """The pods that run ranks."""
    node_rank: Optional[int]
    """This pod's node; None: it runs no rank (the ascend-operator's scheduler pod)."""
    master_addr: str
    master_port: int
    hosts_scheduler: bool
    """MindSpore's scheduler runs here (else in another pod: node 0's, or its own)."""
    cards: Optional[int]
    """Ranks on each node, where the operator says it (``MS_LOCAL_WORKER``)."""
    cards_from: str = ""
    """The variables ``cards`` comes from, for messages."""
    rank_table: Optional[str] = None
    """The operator's rank table, waited for before the ranks start; None: none here."""
    master_name: str = ""
    """The name the operator gave for the scheduler's address, once resolved (``master_addr``
    is then its IP)."""

    @property
    def master_variable(self) -> str:
        return "MS_SCHED_HOST" if self.operator is Operator.ASCEND else "MASTER_ADDR"

    def describe(self) -> str:
        """The ``detected:`` line: who placed this pod, which node it is, where the scheduler
        and the rank table are."""
        scheduler = f"{self.master_addr}:{self.master_port}" + (
            f" ({self.master_name})" if self.master_name else "")
        if self.node_rank is None:
            return (f"{self.operator.value} pod ({self.role}), MindSpore's scheduler alone at "
                    f"{scheduler} for {self.nnodes} node(s) (no cards here, no rank table wait)")
        where = "here" if self.hosts_scheduler else (
            "in the scheduler pod" if self.operator is Operator.ASCEND else "on node 0")
        table = f"rank table {self.rank_table}" if self.rank_table else "no rank table"
        return (f"{self.operator.value} pod ({self.role}), node {self.node_rank} of "
                f"{self.nnodes}, scheduler {scheduler} {where}, {table}")


def detect(config: LaunchConfig, environ: Mapping[str, str]) -> Optional[Pod]:
    """The operator's pod this runs in, or None: not a pod, no operator's variables, or an
    explicit ``--launcher`` or ``--debug`` (they turn detection off). Inconsistent variables,
    and options that contradict them, are a ``ConfigError`` naming the variable."""
    pod = None if config.launcher != "auto" or config.debug else read_pod(environ)
    if pod is None and config.rank_table_timeout is not None:
        raise ConfigError("--rank-table-timeout waits for the rank table of an operator's "
                          "Kubernetes pod; this is none (no KUBERNETES_SERVICE_HOST with "
                          "MS_SCHED_HOST or MASTER_ADDR, or --launcher/--debug given)")
    if pod is not None:
        _check_options(config, pod)
    return pod


def read_pod(environ: Mapping[str, str]) -> Optional[Pod]:
    """The pod the environment describes (see the module docstring), or None."""
    if not environ.get(KUBERNETES):
        return None
    if any(key in environ for key in _ASCEND_KEYS):
        pod = _ascend_pod(environ)
        if all(key in environ for key in _KUBEFLOW_KEYS):
            _check_agreement(pod, _kubeflow_pod(environ))
        return pod
    if all(key in environ for key in _KUBEFLOW_KEYS):
        return _kubeflow_pod(environ)
    return None


def _ascend_pod(environ: Mapping[str, str]) -> Pod:
    role = _required(environ, "MS_ROLE")
    if role not in ("MS_SCHED", "MS_WORKER"):
        raise ConfigError(f"MS_ROLE={shown(role)}: an ascend-operator pod is MS_SCHED or "
                          "MS_WORKER (parameter servers are not supported)")
    servers = environ.get("MS_SERVER_NUM", "0")
    if servers != "0":
        raise ConfigError(f"MS_SERVER_NUM={shown(servers)}: parameter servers are not "
                          "supported (the ascend-operator sets 0)")
    world = _number(environ, "MS_WORKER_NUM", 1, MAX_NODES * MAX_RANKS_PER_NODE)
    local = _number(environ, "MS_LOCAL_WORKER", 1, MAX_RANKS_PER_NODE)
    if world % local:
        raise ConfigError(f"MS_WORKER_NUM={world}: not a multiple of MS_LOCAL_WORKER={local} "
                          "(the ranks of each pod)")
    nnodes = world // local
    node = _number(environ, "MS_NODE_RANK", 0, MAX_NODES - 1)
    shape = f"MS_WORKER_NUM={world} / MS_LOCAL_WORKER={local}"
    if node >= nnodes:
        raise ConfigError(f"MS_NODE_RANK={node}: the job has {nnodes} node(s) ({shape})")
    scheduler = role == "MS_SCHED"
    with_cards = environ.get("NPU_POD", "").lower() == "true"
    if scheduler and with_cards and node != 0:
        raise ConfigError(f"MS_NODE_RANK={node}: a scheduler pod with cards (NPU_POD=true) "
                          "runs node 0")
    node_rank = None if scheduler and not with_cards else node
    label = f"MS_ROLE={role}" + (", NPU_POD=true" if scheduler and with_cards else "")
    return Pod(Operator.ASCEND, label, nnodes, node_rank, _address(environ, "MS_SCHED_HOST"),
               _port(environ, "MS_SCHED_PORT"), scheduler, local, f"MS_LOCAL_WORKER={local}",
               _rank_table(environ) if node_rank is not None else None)


def _kubeflow_pod(environ: Mapping[str, str]) -> Pod:
    world = _number(environ, "WORLD_SIZE", 1, MAX_NODES * MAX_RANKS_PER_NODE)
    rank = _number(environ, "RANK", 0, MAX_NODES * MAX_RANKS_PER_NODE)
    nnodes, cards, shape = _kubeflow_shape(environ, world)
    if rank >= nnodes:
        raise ConfigError(f"RANK={rank}: the job has {nnodes} node(s) ({shape}); RANK is the "
                          "pod's index")
    return Pod(Operator.KUBEFLOW, f"RANK={rank}, WORLD_SIZE={world}", nnodes, rank,
               _address(environ, "MASTER_ADDR"), _port(environ, "MASTER_PORT"), rank == 0,
               cards, shape, _rank_table(environ))


def _kubeflow_shape(environ: Mapping[str, str], world: int) -> tuple[int, Optional[int], str]:
    """Nodes, ranks per node (None: not said) and whence: ``PET_NNODES`` (Kubeflow 1.7 and
    later), ``LOCAL_WORLD_SIZE`` (the ascend-operator's PyTorch jobs), else ``WORLD_SIZE``
    counts the pods (Kubeflow without ``nprocPerNode``: one process per pod, as it sees it)."""
    if "PET_NNODES" in environ:
        text = environ["PET_NNODES"]
        if ":" in text:
            raise ConfigError(f"PET_NNODES={shown(text)}: an elastic range of nodes; npu-launch "
                              "runs a fixed number (give the job a fixed size)")
        nnodes = _number(environ, "PET_NNODES", 1, MAX_NODES)
        if world % nnodes:
            raise ConfigError(f"WORLD_SIZE={world}: not a multiple of PET_NNODES={nnodes}")
        per = world // nnodes
        if per > MAX_RANKS_PER_NODE:  # else refused later as a --cards nobody gave
            raise ConfigError(f"WORLD_SIZE={world} / PET_NNODES={nnodes}: {per} ranks per pod; "
                              f"expected 1-{MAX_RANKS_PER_NODE}")
        return nnodes, per if per > 1 else None, f"PET_NNODES={nnodes}"
    if "LOCAL_WORLD_SIZE" in environ:
        local = _number(environ, "LOCAL_WORLD_SIZE", 1, MAX_RANKS_PER_NODE)
        if world % local:
            raise ConfigError(f"WORLD_SIZE={world}: not a multiple of LOCAL_WORLD_SIZE={local} "
                              "(the ranks of each pod)")
        return world // local, local, f"WORLD_SIZE={world} / LOCAL_WORLD_SIZE={local}"
    if world > MAX_NODES:
        raise ConfigError(f"WORLD_SIZE={world}: more than {MAX_NODES} pods (without PET_NNODES "
                          "or LOCAL_WORLD_SIZE it counts the pods)")
    return world, None, f"WORLD_SIZE={world} pods"


def _check_agreement(ascend: Pod, kubeflow: Pod) -> None:
    """A pod with both operators' variables runs only if they describe the same job: else
    npu-launch cannot tell which placed it, and one set would be ignored without a word."""
    said = [(f"MS_SCHED_HOST={ascend.master_addr}", f"MASTER_ADDR={kubeflow.master_addr}",
             _same_host(ascend.master_addr, kubeflow.master_addr)),
            (f"MS_SCHED_PORT={ascend.master_port}", f"MASTER_PORT={kubeflow.master_port}",
             ascend.master_port == kubeflow.master_port),
            (f"{ascend.nnodes} node(s) by MS_WORKER_NUM / MS_LOCAL_WORKER",
             f"{kubeflow.nnodes} by {kubeflow.cards_from}", ascend.nnodes == kubeflow.nnodes)]
    if ascend.node_rank is not None:
        said.append((f"MS_NODE_RANK={ascend.node_rank}", f"RANK={kubeflow.node_rank}",
                     ascend.node_rank == kubeflow.node_rank))
    for one, other, agree in said:
        if not agree:
            raise ConfigError(f"{one} and {other} disagree: this pod has the variables of two "
                              "operators (the ascend-operator's MS_*, and a Kubeflow-style "
                              "MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK); remove one set, or "
                              "give --launcher local and the options by hand")


def _same_host(one: str, other: str) -> bool:
    """Whether two addresses name one host: equal, or resolving to one address (a name that
    does not resolve yet, as a service before its pod runs, is given the benefit of the doubt)."""
    if one == other:
        return True
    try:
        return socket.gethostbyname(one) == socket.gethostbyname(other)
    except (OSError, UnicodeError):
        return True


def _rank_table(environ: Mapping[str, str]) -> Optional[str]:
    """The table to wait for: the override's, else MindCluster's where its folder is mounted."""
    override = environ.get(RANK_TABLE_ENV)
    if override:
        # A path the kernel refuses would be waited for until the timeout, never to appear.
        check_path_length(f"{RANK_TABLE_ENV}={shown(override)}", override)
        return override
    return RANK_TABLE_PATH if os.path.isdir(os.path.dirname(RANK_TABLE_PATH)) else None


def _required(environ: Mapping[str, str], key: str) -> str:
    value = environ.get(key)
    if value is None or not value.strip():
        said = [k for k in (*_ASCEND_KEYS, *_KUBEFLOW_KEYS) if environ.get(k)]
        raise ConfigError(f"{key}: not set in this pod, though its operator set "
                          f"{', '.join(said)}")
    return value.strip()


def _number(environ: Mapping[str, str], key: str, low: int, high: int) -> int:
    text = _required(environ, key)
    value = whole_number(text)
    if value is None or not low <= value <= high:
        raise ConfigError(f"{key}={shown(text)}: expected a whole number {low}-{high}")
    return value


def _port(environ: Mapping[str, str], key: str) -> int:
    return _number(environ, key, 1, 65535)


def _address(environ: Mapping[str, str], key: str) -> str:
    """An IP address, or a name that can resolve: a service name is waited for until its pod
    runs (``pod_waits.with_master_ip``), so one that never could (``%%%``) is refused now."""
    text = _required(environ, key)
    try:
        ipaddress.ip_address(text.removeprefix("[").removesuffix("]"))
        return text
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(text):
        raise ConfigError(f"{key}={shown(text)}: expected a host name or an IP address")
    return text


def _check_options(config: LaunchConfig, pod: Pod) -> None:
    """What the user said must not contradict the operator: one line, naming both."""
    turn_off = "give --launcher local to run without the pod's environment"
    if config.hostfile:
        raise ConfigError(f"--hostfile: this is an {pod.operator.value} pod ({pod.role}); it "
                          "runs its own node's share and the operator starts the other pods "
                          "(give --launcher ssh to use the hostfile anyway)")
    if config.rank_table:
        raise ConfigError(f"--rank-table: in an {pod.operator.value} pod the job starts in "
                          f"dynamic-cluster mode from the pod's environment; {turn_off}")
    given = {"--nnodes": (config.nnodes, pod.nnodes),
             "--node-rank": (config.node_rank, pod.node_rank or 0),
             "--master-addr": (config.master_addr, pod.master_addr),
             "--master-port": (config.master_port, pod.master_port),
             "--cards": (config.cards, pod.cards)}
    for option, (value, said) in given.items():
        if value is not None and said is not None and value != said:
            raise ConfigError(f"{option} {value}: this {pod.operator.value} pod says "
                              f"{said} ({pod.describe()}); {turn_off}")


def node_config(config: LaunchConfig, pod: Pod) -> LaunchConfig:
    """``config`` as this node's share of a job started by hand, as the pod says it."""
    return dataclasses.replace(config, nnodes=pod.nnodes, node_rank=pod.node_rank or 0,
                               master_addr=pod.master_addr, master_port=pod.master_port,
                               cards=config.cards or pod.cards, launcher="local")


def share(plan: LaunchPlan, pod: Pod) -> LaunchPlan:
    """The plan as this pod runs it. A worker pod of the ascend-operator leaves the scheduler
    to the scheduler pod; that pod, when it has no cards, runs the scheduler alone, and counts
    as a node of its own (its supervisor then waits for the scheduler to exit, which MindSpore's
    does once every rank of the other pods has left)."""
    if not pod.hosts_scheduler:
        return dataclasses.replace(plan, scheduler=None)
    if pod.node_rank is None:
        return dataclasses.replace(plan, ranks=(), nnodes=plan.nnodes + 1)
    return plan
