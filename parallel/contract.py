"""The seam between the host side (``launcher``) and the rank side (``parallel``).

Everything that crosses from the launcher into a rank is an environment variable named here, and
everything that comes back is a file whose path is named by one of these variables. Both sides
import this module; it has no dependencies beyond the standard library and never reads
``os.environ`` by itself: callers pass the mapping they want read.

Going in (launcher -> rank):

* MindSpore dynamic-cluster mode: ``MS_ROLE``, ``MS_SCHED_HOST``, ``MS_SCHED_PORT``,
  ``MS_WORKER_NUM``, ``MS_NODE_ID`` (plus the retry and timeout knobs below).
* MindSpore's compile cache, unless the user set it: ``MS_COMPILER_CACHE_ENABLE``,
  ``MS_COMPILER_CACHE_PATH``.
* HCCL rank-table mode: ``RANK_TABLE_FILE``, ``RANK_ID``, ``DEVICE_ID``, ``RANK_SIZE``.
* torchrun's contract for every rank, so torch and torch_npu scripts run unchanged: ``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``,
  ``ROLE_RANK``, ``ROLE_NAME``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and the
  ``TORCHELASTIC_*`` names (``TORCH_ENV``). ``MASTER_PORT`` is free for rank 0 to listen on:
  MindSpore's scheduler takes it only once a rank of its host begins importing MindSpore
  (``EVENT_FRAMEWORK``).
* npu-launch's own: the ``NPU_LAUNCH_*`` names below.

Coming back (rank -> launcher): one JSON-lines events file and one JSON error report per rank,
written by ``parallel.hook.rank_hook`` (through ``sitecustomize``: the user decorates nothing)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from parallel.bad_input import MAX_SHOWN as MAX_SHOWN
from parallel.bad_input import BadInput as BadInput
from parallel.bad_input import shown as shown
from parallel.record_fields import JsonObject as JsonObject
from parallel.record_fields import TypedFields
from parallel.record_fields import flag_of as _flag
from parallel.record_fields import real_of as _real
from parallel.record_fields import text_of as _text
from parallel.record_fields import whole_of as _whole

# MindSpore dynamic cluster (msrun's mode).
MS_ROLE = "MS_ROLE"
MS_SCHED_HOST = "MS_SCHED_HOST"
MS_SCHED_PORT = "MS_SCHED_PORT"
MS_WORKER_NUM = "MS_WORKER_NUM"
MS_NODE_ID = "MS_NODE_ID"
MS_RETRY_INTERVAL_LOWER = "MS_RETRY_INTERVAL_LOWER"
MS_RETRY_INTERVAL_UPPER = "MS_RETRY_INTERVAL_UPPER"
ROLE_SCHEDULER = "MS_SCHED"
ROLE_WORKER = "MS_WORKER"

# MindSpore's compile cache: each rank keeps its compiled graphs in ``rank_<N>/`` of the path.
MS_COMPILER_CACHE_ENABLE = "MS_COMPILER_CACHE_ENABLE"
MS_COMPILER_CACHE_PATH = "MS_COMPILER_CACHE_PATH"

# HCCL rank-table mode.
RANK_TABLE_FILE = "RANK_TABLE_FILE"
RANK_ID = "RANK_ID"
DEVICE_ID = "DEVICE_ID"
RANK_SIZE = "RANK_SIZE"
ASCEND_RT_VISIBLE_DEVICES = "ASCEND_RT_VISIBLE_DEVICES"
ASCEND_PROCESS_LOG_PATH = "ASCEND_PROCESS_LOG_PATH"
"""CANN's logs of a rank (plog, device logs): ``<log dir>/ascend/rank_<N>`` unless the user set
it; the diagnosis reads them."""

# torchrun-style identity.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
GROUP_RANK = "GROUP_RANK"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
ROLE_RANK = "ROLE_RANK"
ROLE_NAME = "ROLE_NAME"
ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
"""``False``: rank 0 of torch's env:// rendezvous listens on ``MASTER_PORT`` itself (torchrun
says ``True`` only when its own agent already serves a store there; npu-launch serves none)."""
TORCH_ENV = (GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE,
             TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
             TORCHELASTIC_USE_AGENT_STORE)
"""What torchrun's agent (``torch/distributed/elastic/agent/server/local_elastic_agent.py``)
sets in a worker beyond the identity above; every rank gets them, whatever its framework."""
OMP_NUM_THREADS = "OMP_NUM_THREADS"
"""torchrun sets 1 when a node runs several ranks and the user set none; the rank hook does the
same as a rank begins importing torch (MindSpore's threads are left as they are)."""
FRAMEWORKS = ("mindspore", "torch")
"""The frameworks the rank hook tells the launcher about (``EVENT_FRAMEWORK``)."""
# npu-launch's own.
JOB_ID = "NPU_LAUNCH_JOB_ID"
"""The job's name, as the user sees it (logs, events). Another launch may carry the same one."""
RESUME_STEP = "NPU_LAUNCH_RESUME_STEP"
"""Set on a restart of a multi-node job: the complete step the trainer resumes from."""
CHECKPOINT = "NPU_LAUNCH_CHECKPOINT"
"""The newest checkpoint file the script's own saves completed (``EVENT_SAVED``) for this rank,
absolute; unset before any (``launcher.plan.checkpoint_arg``: also ``{checkpoint}``)."""
PAYLOAD_KEY = "NPU_LAUNCH_PAYLOAD_KEY"
"""srun/mpirun agents only: the key that gets the plan from the launcher (``launcher.cluster.payload``)."""
TOKEN = "NPU_LAUNCH_TOKEN"
"""A secret drawn for each launch (attempt): teardown sweeps stragglers by it and the node rank,
never by the user-visible job id or by command name, so no launch signals a process it did not
start."""
LOG_DIR = "NPU_LAUNCH_LOG_DIR"
TRACEBACK = "NPU_LAUNCH_TRACEBACK"
"""Set by a user (not the launcher) to see the traceback of an npu-launch bug; read by the CLI."""
EVENTS_FILE = "NPU_LAUNCH_EVENTS_FILE"
"""JSON lines appended by the rank: ``{"event": ..., "rank": ..., "time": ...}``."""
ERROR_FILE = "NPU_LAUNCH_ERROR_FILE"
"""One JSON object written when the rank dies of an uncaught exception."""
DEVICE_KIND = "NPU_LAUNCH_DEVICE"
"""``npu`` or ``cpu``: the device target the rank side selects."""
DEBUG = "NPU_LAUNCH_DEBUG"
"""``1`` in ``--debug``: no communication init, PyNative mode."""
HOST = "NPU_LAUNCH_HOST"
"""The host name the launcher shows for this rank."""
PARENT_PID = "NPU_LAUNCH_PARENT_PID"
"""The supervising process; a rank whose parent is gone exits (see ``rank_hook``)."""
RANK_PID = "NPU_LAUNCH_RANK_PID"
"""Set by the rank hook to the rank's pid: processes the rank starts are not ranks."""
NODE_RANK = "NPU_LAUNCH_NODE_RANK"
NNODES = "NPU_LAUNCH_NNODES"
PARALLEL = "NPU_LAUNCH_PARALLEL"
"""The job's parallel configuration as JSON (``parallel.config.ParallelConfig.to_json``)."""
SEED = "NPU_LAUNCH_SEED"
WAIT_FOR_SCHEDULER = "NPU_LAUNCH_WAIT_SCHEDULER"
"""``1``: the rank hook waits until the scheduler accepts connections before MindSpore's
``init()`` connects, which avoids MindSpore's 3-5 s registration retry."""
STACK_FILE = "NPU_LAUNCH_STACK_FILE"
"""Where the rank writes its Python stacks on SIGUSR1 (hang detection)."""
PROGRESS = "NPU_LAUNCH_PROGRESS"
"""``1``: hang detection is on (``--hang-timeout`` > 0): the rank hook counts progress."""
RESTART = "NPU_LAUNCH_RESTART"
"""How many times the job was restarted before this attempt (0 the first time)."""
SPARE = "NPU_LAUNCH_SPARE"  # in a warm spare only (parallel.hook.spare): the framework it imports
PLANNED_WORLD = "NPU_LAUNCH_PLANNED_WORLD_SIZE"
"""Set when the job goes on with fewer ranks than it was planned with (``--min-nodes`` left a
host out): the planned world size, for ``parallel.data.sharded_dataset``'s global batch."""
DEVFS = "NPU_LAUNCH_DEVFS"
"""Where the ``davinciN`` device nodes are [default: /dev]; tests point it at a fake ``/dev``."""
CPUS = "NPU_LAUNCH_CPUS"
"""``--bind-cores``: the cores the rank is bound to, as a CPU list (``0-11``)."""
NUMA_NODES = "NPU_LAUNCH_NUMA_NODES"
"""``--bind-numa``: the NUMA nodes the rank's memory is bound to, as a list (``0`` or ``0-1``)."""
MSRUN_CPU_LIST = "MSRUN_CPU_LIST"
"""``--bind-cores``: the rank's cores as msrun ``--bind_core`` writes them, a Python list
(``[0, 1, 2]``), which ``mindspore.runtime.set_cpu_affinity`` reads for its threads."""

PREFIX = "NPU_LAUNCH_"

OWNED = {
    **dict.fromkeys((MS_ROLE, MS_SCHED_HOST, MS_SCHED_PORT, MS_WORKER_NUM, MS_NODE_ID),
                    "for MindSpore's dynamic cluster, from --master-addr, --master-port and the "
                    "cards"),
    **dict.fromkeys((RANK_ID, RANK, RANK_SIZE, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE),
                    "from --cards and the hosts, or the rank table"),
    **dict.fromkeys(TORCH_ENV, "as torchrun sets it, from the hosts, the cards and the job"),
    DEVICE_ID: "from --cards, ASCEND_RT_VISIBLE_DEVICES or the rank table",
    MASTER_ADDR: "from --master-addr", MASTER_PORT: "from --master-port",
    RANK_TABLE_FILE: "from --rank-table",
}
"""Variables npu-launch sets in every rank itself, and from what: ``--env`` may not set them
(nor anything starting with ``PREFIX``)."""


def owner_of(name: str) -> "str | None":
    """Why ``--env name=...`` is refused, or ``None`` when a user may set ``name``."""
    if name.startswith(PREFIX):
        return "for its own bookkeeping"
    return OWNED.get(name)

# Event names written to EVENTS_FILE.
EVENT_STARTED = "started"
"""The rank hook is installed; carries ``role``, ``main_thread`` (the id faulthandler prints) and
``process_start`` (when the kernel started the process, seconds since the epoch)."""
EVENT_FRAMEWORK = "framework"
"""Sent once per framework by the rank hook as the rank begins importing it: ``name`` (one of
``FRAMEWORKS``), ``kept`` (``parallel.hook.spare.kept``), ``warm`` (a spare became the rank). A
``mindspore`` one from the scheduler's host starts the scheduler (``launcher.run.supervisor``)."""
EVENT_INIT_STARTED = "init-started"
EVENT_INITIALISED = "initialised"
"""Sent once by a rank, by the rank hook, when MindSpore's communication ``init()`` returns;
carries ``exec_mode`` (``graph`` or ``pynative``)."""
EVENT_LAYOUT = "layout"
"""Sent by ``parallel.init()``: the world size, the parallel layout and this rank's place in it,
and ``exec_mode``."""
EVENT_STEP = "step"
"""A step ended; the first of a ``fit`` also carries ``exec_mode``, ``log_every`` (steps between
two of these), ``saves_on_stop`` (it saves at ``STOP_REQUEST_FILE``'s step) and ``last_words``
(false: it answers no last words request; ``parallel.hook.model_train``'s steps)."""
STOP_REQUEST_FILE = "stop_request"
"""Written by node 0 into the log directory (``LOG_DIR``) when npu-launch is told to stop
(SIGTERM, SIGINT, SIGHUP) and every rank said ``saves_on_stop``: one line, the step at which
every rank saves a checkpoint and exits 0 (a rank past it saves the step it is at); or
``STOP_NO_SAVE``, written as the job's processes are stopped without a save, so that a rank
that got the stop signal itself dies at once (``parallel.hook.preemption``)."""
STOP_NO_SAVE = "none"
LAST_WORDS_REQUEST_FILE = "last_words_request"
"""Written by node 0 into ``LOG_DIR`` when a rank of a data-parallel job failed or hung, before
any other is stopped: ``<rank> <attempt>``, the healthy rank that saves the last step it
completed (``parallel.checkpoints.last_words``) and the attempt (``RESTART``) it is asked of. That rank
writes ``LAST_WORDS_REPLY_FILE``: ``saved <step>`` (its ``checkpoint`` event says
``last_words``: the file stands for every rank) or ``none <why>``."""
LAST_WORDS_REPLY_FILE = "last_words_reply"
EVENT_EVAL = "eval"
"""The trainer's held-out evaluation: ``epoch`` (epochs completed), ``step``, ``loss``,
``accuracy`` (null without class labels) and ``samples``."""
EVENT_CHECKPOINT = "checkpoint"
"""A rank's file of a step is in place: ``step``, ``path`` (absolute, on the rank's host),
``name``, ``size``, ``sha256``, ``position`` (the data position) and ``world_size``."""
EVENT_SAVED = "saved"
"""A checkpoint file the script's ``save_checkpoint`` (which ``ModelCheckpoint`` calls) completed:
``path`` (absolute, on the rank's host), ``size``; when known, ``epoch`` and ``epoch_step`` (as
``ModelCheckpoint`` names it, ``PREFIX-EPOCH_STEP``), ``epoch_steps`` and ``step`` (inside a fit)."""
EVENT_DATA = "data"
"""Sent by ``parallel.data.sharded_dataset`` for a training reader: ``batch_size`` (this rank's),
``global_batch`` (every rank's together) and ``planned_world`` (see ``PLANNED_WORLD``)."""
EVENT_FINISHED = "finished"
"""The end of ``fit``; ``exec_mode`` is the mode the train step ran in."""
EVENT_EXITING = "exiting"
"""Sent by the rank hook once, as the exit handlers begin (before MindSpore's own): ``clean``,
no exception escaped the script and it asked ``sys.exit`` for no code but 0."""
EVENT_FIRST_STEP = "first-step"
"""Sent once by the rank hook when the main thread's first top-level Cell call returns: the end
of the first step (graph compilation), for the start-up breakdown (``launcher.observe.startup``)."""
EVENT_PROGRESS = "progress"
"""The rank hook's view of training progress (``parallel.hook.progress``), sent at most twice a second
and only on a change: ``count`` (top-level Cell calls completed plus dataset batches fetched),
``busy`` (inside a top-level call now) and ``loads`` (checkpoint loads so far); ``section``
(``save`` or ``eval`` while the main thread is inside a checkpoint save or an evaluation, else
"") and ``sections`` (saves and evaluations completed so far): judged by a limit of their own;
``trained`` (training steps: top-level calls of a Cell in training mode) and ``compiling``."""
SECTION_SAVE = "save"
SECTION_EVAL = "eval"
EVENT_STACK = "stack"
"""Not sent by the rank: its supervisor's sample of the rank's stacks when the rank went silent
(``launcher.hangs.stalls``): ``frames`` (the main thread, most recent call first), ``text`` (every
thread, as faulthandler wrote it) and ``native`` (py-spy's native stacks, when it is installed;
they may follow in a second event with no frames)."""
EVENT_ALIVE = "alive"
"""Not sent by the rank: its supervisor read that a quiet rank moved (``launcher.hangs.liveness``):
``how`` (``cpu``, ``io``, ``children``, comma separated), ``bytes_written``, ``bytes_read``."""
EVENT_EXITED = "exited"
"""Not sent by the rank: its supervisor's record that the rank's process ended (``returncode``),
under the same name on the wire from a node agent and in metrics.jsonl."""


@dataclasses.dataclass(frozen=True)
class Event(TypedFields):
    """One event record, parsed once where it enters the launcher (an events file, an agent's
    control line, metrics.jsonl). Fields a record lacks, or holds in the wrong type, are None;
    ``record`` is the record as it came, which metrics.jsonl keeps whole; its other fields are
    read by type (``event.flag("kept")``, ``event.whole(...)``: ``record_fields.TypedFields``)."""

    kind: str
    rank: int
    host: str = "?"
    time: Optional[float] = None
    step: Optional[int] = None
    epoch: Optional[int] = None
    steps: Optional[int] = None
    samples: Optional[int] = None
    loss: Optional[float] = None
    final_loss: Optional[float] = None
    accuracy: Optional[float] = None
    samples_per_s: Optional[float] = None
    returncode: Optional[int] = None
    exec_mode: Optional[str] = None
    path: Optional[str] = None
    main_thread: Optional[str] = None
    count: Optional[int] = None
    busy: Optional[bool] = None
    loads: Optional[int] = None
    name: Optional[str] = None
    section: Optional[str] = None
    sections: Optional[int] = None
    trained: Optional[int] = None
    compiling: Optional[bool] = None
    how: Optional[str] = None
    bytes_written: Optional[int] = None
    bytes_read: Optional[int] = None
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, record: Mapping[str, Any]) -> "Optional[Event]":
        """The event in ``record``; None when it names no kind or no rank."""
        get = record.get
        kind, rank = get("event"), _whole(get("rank"))
        if not isinstance(kind, str) or rank is None:
            return None
        typed: dict[str, Any] = {name: read(value) for name, read in _FIELDS.items()
                                 if (value := get(name)) is not None}
        return cls(kind=kind, rank=rank, host=_text(get("host")) or "?", record=record, **typed)

    @classmethod
    def exited(cls, rank: int, host: str, returncode: Optional[int], time: float,
               stopped: bool = False) -> "Event":
        """The supervisor's record that a rank's process ended; ``stopped``: it ended once
        npu-launch had begun stopping the ranks (its teardown's SIGTERM), not on its own."""
        record: dict[str, Any] = {"event": EVENT_EXITED, "rank": rank, "host": host,
                                  "returncode": returncode, "time": time}
        if stopped:
            record["stopped"] = True
        return cls.parse(record) or cls(EVENT_EXITED, rank)


_FIELDS = {"time": _real, "step": _whole, "epoch": _whole, "steps": _whole, "samples": _whole,
           "loss": _real, "final_loss": _real, "accuracy": _real, "samples_per_s": _real,
           "returncode": _whole, "exec_mode": _text, "path": _text, "main_thread": _text,
           "count": _whole, "busy": _flag, "loads": _whole, "name": _text, "section": _text,
           "sections": _whole, "trained": _whole, "compiling": _flag, "how": _text,
           "bytes_written": _whole, "bytes_read": _whole}
"""How each typed field of ``Event`` is read from a record."""

# What the launcher writes into the job's log directory for ``npu-launch report`` to read.
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVENT_JOB = "job"
"""The first line of metrics.jsonl, written by the monitor: ``job_id`` and ``ranks`` (rank -> host)."""
EVENT_BUSY_ALONE = "busy-alone"
"""Written by the monitor as a rank's spell busy alone ends (``launcher.hangs.stalls.Busy``)."""
EVENT_ATTEMPT = "attempt"
"""Written by the monitor as each attempt of the job ends (``launcher.run.restarts.AttemptRecord``):
``attempt``, ``started_at``, ``ended_at``, ``duration_s``, ``outcome``, ``exit_code``, ``cause``,
``resumed_from``, ``nodes``, ``world_size``, ``waited_s``, ``left_out``."""


@dataclasses.dataclass(frozen=True)
class RankIdentity:
    """Who a rank is, read from whichever launcher started it.

    The table maps each generic name to the variables that carry it, first match wins:
    npu-launch and msrun/rank-table scripts, torchrun, OpenMPI, Slurm.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device_id: int
    debug: bool
    device_kind: str

    SOURCES = {
        "rank": (RANK_ID, RANK, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
        "world_size": (RANK_SIZE, WORLD_SIZE, MS_WORKER_NUM, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                       "SLURM_NTASKS"),
        "local_rank": (LOCAL_RANK, "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
        "local_world_size": (LOCAL_WORLD_SIZE, "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "SLURM_NTASKS_PER_NODE"),
        "device_id": (DEVICE_ID, LOCAL_RANK, "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
    }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "RankIdentity":
        """Read the identity from ``environ``; a process started by hand is rank 0 of 1."""
        rank = _first_int(environ, cls.SOURCES["rank"], default=_ms_node_id(environ))
        world = _first_int(environ, cls.SOURCES["world_size"], default=1)
        local_world = _first_int(environ, cls.SOURCES["local_world_size"], default=world)
        local = _first_int(environ, cls.SOURCES["local_rank"], default=rank % max(local_world, 1))
        return cls(rank=rank, world_size=world, local_rank=local, local_world_size=local_world,
                   device_id=_first_int(environ, cls.SOURCES["device_id"], default=local),
                   debug=environ.get(DEBUG) == "1", device_kind=environ.get(DEVICE_KIND, ""))


def _ms_node_id(environ: Mapping[str, str]) -> int:
    return _first_int(environ, (MS_NODE_ID,), default=0)


def _first_int(environ: Mapping[str, str], names: tuple, default: int) -> int:
    name: Optional[str] = next((n for n in names if environ.get(n, "").strip()), None)
    if name is None:
        return default
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"environment variable {name}: {environ[name]!r} is not an "
                         "integer") from None
