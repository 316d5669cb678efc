"""The launch configuration: a frozen value built from options and an optional YAML file
(read by ``launcher.config.config_file``).

Building one never reads ``os.environ`` and never starts anything; it only checks that the values
make sense together and raises ``ConfigError`` (exit 2, one line) when they do not.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterable, Mapping, Optional

from launcher import limits
from launcher.config.cpu_list import check_options as check_binding
from launcher.config.devices import DeviceKind
from launcher.config.script_check import check_python_source
from launcher.errors import ConfigError
from launcher.limits import shown
from parallel import contract
from parallel.config import ParallelConfig


@dataclasses.dataclass(frozen=True)
class ConsoleFilter:
    """Which ranks' lines reach the console: all (``ranks is None``), none, or a set."""

    ranks: Optional[frozenset[int]] = None

    @classmethod
    def parse(cls, text: str) -> "ConsoleFilter":
        text = text.strip().lower()
        if not text:  # given, and empty: not read as the default
            raise ConfigError("--console: empty (expected 'all', 'none' or ranks like 0,3)")
        if text == "all":
            return cls(None)
        if text == "none":
            return cls(frozenset())
        parts = text.split(",")
        ranks = [r for r in (limits.whole_number(part.strip()) for part in parts) if r is not None]
        if len(ranks) != len(parts):
            raise ConfigError(f"--console {text[:limits.MAX_SHOWN]}: expected 'all', 'none' or ranks like "
                              "0,3")
        seen: set[int] = set()
        for rank in ranks:
            if rank in seen:
                raise ConfigError(f"--console {text[:limits.MAX_SHOWN]}: rank {rank} is named twice")
            seen.add(rank)
        return cls(frozenset(ranks))

    def check_world(self, world_size: int) -> None:
        """Refuse ranks the job does not have (a filter that would show nothing by accident)."""
        missing = sorted(r for r in self.ranks or () if r >= world_size)
        if missing:
            raise ConfigError(f"--console {self}: the job has ranks 0-{world_size - 1}, "
                              f"not {','.join(map(str, missing))}")

    def shows(self, rank: Optional[int]) -> bool:
        return self.ranks is None or rank in self.ranks

    def __str__(self) -> str:
        if self.ranks is None:
            return "all"
        return ",".join(map(str, sorted(self.ranks))) or "none"


DEFAULT_BACKOFF = 1.0
"""Seconds before the second restart when ``--restart-backoff`` is not given (the first comes at
once); doubled before each next one."""
DEFAULT_BACKOFF_MAX = 60.0
"""The longest wait between two attempts (``--restart-backoff-max``)."""


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Everything one launch needs, already checked. ``cards=None`` means every card found."""

    script: str
    script_args: tuple[str, ...] = ()
    cards: Optional[int] = None
    device: DeviceKind = DeviceKind.AUTO
    rank_table: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    log_dir: Optional[str] = None
    job_id: Optional[str] = None
    console: ConsoleFilter = ConsoleFilter()
    runtime_logs: bool = False
    merge_lines: bool = True
    kill_timeout: float = 10.0
    startup_timeout: float = 300.0
    debug: bool = False
    dry_run: bool = False
    json: bool = False
    env: tuple[tuple[str, str], ...] = ()
    python: str = ""
    workdir: str = ""
    checkpoint_collect: bool = True
    """Node 0 gathers what a restart needs from hosts that share no storage with it
    (``launcher.cluster.collect``); off (``--no-checkpoint-collect``), files stay on their hosts and
    are only tracked."""
    compile_cache: bool = True
    """Ranks keep MindSpore's compile cache in the log dir, so a restart does not compile again
    (``launcher.plan.planner.compile_cache_dir``); off: ``--no-compile-cache``."""
    hostfile: Optional[str] = None
    include: Optional[str] = None
    exclude: Optional[str] = None
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    launcher: str = "auto"
    ssh_port: Optional[int] = None
    ssh_options: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    fanout: Optional[int] = None
    """``--fanout``: at most this many ssh connections set up at once (preflight, the copies of
    ``--sync-workdir``, the agents; ``launcher.cluster.fanout``); None: not given, ``ssh_fanout``."""
    preflight: bool = True
    sync_workdir: bool = False
    server_id: Optional[str] = None
    hang_timeout: Optional[float] = None
    """``--hang-timeout``: None when not given (the limit is learnt from the job,
    ``hang_limits.Limits``); 0 turns hang detection off."""
    hang_grace: float = 1800.0
    hang_floor: float = 10.0
    """``--hang-floor``: the least a learnt hang limit is, in seconds."""
    exit_timeout: float = 60.0
    """``--exit-timeout``: how long ranks may stay in their exit handlers once every rank's
    script ended cleanly (0: without a limit)."""
    max_restarts: int = 0
    restart_backoff: Optional[float] = None
    """``--restart-backoff``: seconds before the first restart, doubled before each next one
    (None: not given, ``DEFAULT_BACKOFF``)."""
    restart_backoff_max: Optional[float] = None
    """``--restart-backoff-max``: the longest wait between attempts (None: ``DEFAULT_BACKOFF_MAX``)."""
    min_nodes: Optional[int] = None
    """``--min-nodes``: a host whose ranks caused the last two failures is left out of the next
    attempt while at least this many hosts remain (None: never leave one out)."""
    card_free_timeout: float = 60.0
    """``--card-free-timeout``: before a restart, how long to wait for the failed hosts' cards
    to be let go by every process (``launcher.cluster.card_checks``)."""
    bind_cores: Optional[str] = None
    """``--bind-cores``: ``auto``, ``none`` or a CPU list (``launcher.plan.binding``); None: not
    given (none, or auto with ``--bind-numa``)."""
    bind_numa: bool = False
    rank_table_timeout: Optional[float] = None
    """``--rank-table-timeout``: in an operator's Kubernetes pod, seconds to wait for its rank
    table to read ``completed`` (``launcher.plan.pods``; None: not given, the default)."""
    parallel: ParallelConfig = ParallelConfig()

    def __post_init__(self) -> None:
        self._check_script()
        self._check_numbers()
        self._check_names()
        self._check_combinations()
        if self.node_rank is not None:
            self._check_manual_node(self.node_rank)
        for key, value in self.env:
            check_env_name(key)
            _check_text(f"--env {key}", value)
            limits.check_exec_string(f"--env {key}", f"{key}={value}")
        for index, arg in enumerate(self.script_args, 1):
            _check_text("a script argument", arg)
            limits.check_exec_string(f"script argument {index}", arg)
        limits.check_exec_total(self.script_args, self.env)
        check_binding(self.bind_cores, self.bind_numa, self.env)
        self._check_env_against_options()

    @property
    def ssh_fanout(self) -> int:
        """The ``--fanout`` in force: as given, else ``limits.DEFAULT_FANOUT``."""
        return fanout_in_force(self.fanout)

    def _check_script(self) -> None:
        if not self.script:
            raise ConfigError("no script given: npu-launch [OPTIONS] SCRIPT [ARGS]...")
        _check_text("script", self.script)
        limits.check_exec_string("script", self.script)
        limits.check_path_length(f"script {shown(self.script)}", self.script)
        path = os.path.join(self.workdir, self.script)
        if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "__main__.py")):
            raise ConfigError(f"script {shown(self.script)}: a directory without __main__.py")
        if not os.path.exists(path):
            raise ConfigError(f"script {shown(self.script)}: no such file")
        main = os.path.join(path, "__main__.py") if os.path.isdir(path) else path
        check_python_source(main, shown(self.script))

    def _check_env_against_options(self) -> None:
        """``--env`` may not turn on what an option turns off, nor tell the ranks other cards
        than npu-launch picked for them."""
        for key, value in self.env:
            if key in _COMPILE_CACHE_VARIABLES and not self.compile_cache and \
                    _turns_on(key, value):
                raise ConfigError(f"--env {key}={shown(value)}: turns MindSpore's compile cache "
                                  "on in every rank, and --no-compile-cache asks for none; give "
                                  "one of them")
            if key == contract.MSRUN_CPU_LIST and (self.bind_cores or "").strip() == "none":
                raise ConfigError(f"--env {key}: binds MindSpore's threads to cores in every "
                                  "rank, and --bind-cores none asks for no binding; give one "
                                  "of them")
            if key == contract.ASCEND_RT_VISIBLE_DEVICES:
                raise ConfigError(f"--env {key}: npu-launch picks the cards (and each rank's "
                                  f"DEVICE_ID) from {key} in its own environment; set it there "
                                  f"instead (export {key}=...)")

    def _check_numbers(self) -> None:
        _check_range("--cards", self.cards, 1, limits.MAX_RANKS_PER_NODE,
                     "ranks on one node")
        _check_range("--nnodes", self.nnodes, 1, limits.MAX_NODES, "nodes")
        _check_range("--node-rank", self.node_rank, 0, limits.MAX_NODES - 1, "node index")
        _check_range("--master-port", self.master_port, 1, 65535, "TCP port")
        _check_range("--ssh-port", self.ssh_port, 1, 65535, "TCP port")
        fanout_in_force(self.fanout)
        _check_range("--max-restarts", self.max_restarts, 0, limits.MAX_RESTARTS, "restarts")
        _check_range("--min-nodes", self.min_nodes, 1, limits.MAX_NODES, "nodes")
        for option, seconds in (("--kill-timeout", self.kill_timeout),
                                ("--startup-timeout", self.startup_timeout),
                                ("--hang-timeout", self.hang_timeout or 0.0),
                                ("--hang-grace", self.hang_grace),
                                ("--hang-floor", self.hang_floor),
                                ("--exit-timeout", self.exit_timeout),
                                ("--rank-table-timeout", self.rank_table_timeout or 0.0),
                                ("--restart-backoff", self.restart_backoff or 0.0),
                                ("--restart-backoff-max", self.restart_backoff_max or 0.0),
                                ("--card-free-timeout", self.card_free_timeout)):
            if not 0 <= seconds <= limits.MAX_TIMEOUT:  # also refuses nan
                raise ConfigError(f"{option} {seconds}: expected seconds between 0 and "
                                  f"{limits.MAX_TIMEOUT:.0f} (a week)")

    def _check_names(self) -> None:
        if self.job_id is not None and not (_JOB_ID.fullmatch(self.job_id)
                                            and ".." not in self.job_id):
            raise ConfigError(f"--job-id {shown(self.job_id)}: expected up to 128 letters, "
                              "digits, '.', '_', '-' (it names a folder under the log root)")
        for option, value in (("--master-addr", self.master_addr),
                              ("--server-id", self.server_id)):
            if value is not None and not _ADDRESS.fullmatch(value):
                raise ConfigError(f"{option} {shown(value)}: expected a host name or an IP "
                                  "address")
        for option, value in (("--log-dir", self.log_dir), ("--hostfile", self.hostfile),
                              ("--rank-table", self.rank_table)):
            if value is not None:
                _check_text(option, value)
                if not value:
                    raise ConfigError(f"{option}: empty path")
                limits.check_path_length(f"{option} {shown(value)}", value)

    def _check_combinations(self) -> None:
        """Options that would be ignored are refused, so a job never runs other than asked."""
        if self.json and not self.dry_run:
            raise ConfigError("--json goes with --dry-run")
        if self.debug and self.cards not in (None, 1):
            raise ConfigError(f"--debug runs one card; got --cards {self.cards}")
        for option, value in (("--hostfile", self.hostfile), ("--nnodes", self.nnodes),
                              ("--node-rank", self.node_rank),
                              ("--max-restarts", self.max_restarts or None)):
            if self.debug and value is not None:
                raise ConfigError(f"--debug runs one card on this host; it goes without "
                                  f"{option}")
        self._check_restarts()
        if self.rank_table and self.hostfile:
            raise ConfigError("--rank-table goes without --hostfile: in rank-table mode start "
                              "npu-launch on each server of the table (--server-id picks its "
                              "share)")
        if self.hostfile and self.launcher == "local":
            raise ConfigError("--launcher local runs on this host only; it goes without "
                              "--hostfile")
        for option, value in (("--include", self.include), ("--exclude", self.exclude)):
            if value is not None and not self.hostfile:
                raise ConfigError(f"{option} filters the hosts of a --hostfile; none given")
        if self.fanout is not None and not self.hostfile:
            raise ConfigError("--fanout bounds the ssh connections to the hosts of a --hostfile; "
                              "none given (srun starts a Slurm job's nodes itself)")
        if self.sync_workdir and not self.hostfile:
            raise ConfigError("--sync-workdir copies the launch directory over ssh to the hosts "
                              "of a --hostfile; none given (a Slurm job needs it on every node "
                              "already)")
        if self.sync_workdir and not self.preflight:
            raise ConfigError("--sync-workdir copies where preflight finds the launch directory "
                              "missing or different; it goes without --no-preflight")

    def _check_restarts(self) -> None:
        for option, value in (("--restart-backoff", self.restart_backoff),
                              ("--restart-backoff-max", self.restart_backoff_max),
                              ("--min-nodes", self.min_nodes)):
            if value is not None and not self.max_restarts:
                raise ConfigError(f"{option} is about restarts; this job restarts never "
                                  "(give --max-restarts N)")
        first, cap = self.restart_backoff, self.restart_backoff_max
        if first is not None and cap is not None and cap < first:
            raise ConfigError(f"--restart-backoff-max {cap:g} is shorter than --restart-backoff "
                              f"{first:g}")

    @property
    def backoff(self) -> tuple[float, float]:
        """(the wait before the first restart, the longest wait), as given or by default."""
        first = DEFAULT_BACKOFF if self.restart_backoff is None else self.restart_backoff
        if self.restart_backoff_max is None:
            return first, max(first, DEFAULT_BACKOFF_MAX)
        return first, self.restart_backoff_max

    def _check_manual_node(self, node_rank: int) -> None:
        """``--node-rank`` starts this node's share of a job started by hand on every node."""
        if self.hostfile:
            raise ConfigError("--node-rank goes without --hostfile (node 0 starts the others)")
        if self.nnodes is None or not 0 <= node_rank < self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank}: needs --nnodes N with "
                              "0 <= node rank < N")
        if not self.master_addr or self.master_port is None:
            raise ConfigError("--node-rank: every node needs the same --master-addr and "
                              "--master-port")


def check_environment(config: LaunchConfig, environ: Mapping[str, str]) -> None:
    """The environment the ranks inherit may not turn on what an option turns off, nor carry
    npu-launch's own variables left from another job (it is read where the job is made, never
    while the config is built)."""
    for key in _LEFT_FROM_A_JOB:
        if key in environ:
            raise ConfigError(f"{key}={shown(environ[key])} in npu-launch's environment: "
                              "npu-launch sets it in the ranks when a job needs it, and this "
                              "value, left from another job (a rank's environment?), would "
                              "reach every rank; unset it")
    if (config.bind_cores or "").strip() == "none" and contract.MSRUN_CPU_LIST in environ:
        raise ConfigError(f"--bind-cores none: {contract.MSRUN_CPU_LIST}="
                          f"{shown(environ[contract.MSRUN_CPU_LIST])} in npu-launch's environment "
                          "binds MindSpore's threads to cores in every rank; unset it (or drop "
                          "--bind-cores none)")
    if config.compile_cache:
        return
    for key in _COMPILE_CACHE_VARIABLES:
        value = environ.get(key)
        if value is not None and _turns_on(key, value) and key not in dict(config.env):
            raise ConfigError(f"--no-compile-cache: {key}={shown(value)} in npu-launch's "
                              "environment turns MindSpore's compile cache on in every rank; "
                              f"unset it (or drop --no-compile-cache)")


_LEFT_FROM_A_JOB = (contract.RESUME_STEP, contract.PROGRESS, contract.PLANNED_WORLD,
                    contract.CPUS, contract.NUMA_NODES, contract.WAIT_FOR_SCHEDULER)
"""Variables a rank reads that the plan sets only when the job needs them: one inherited from
the launcher's environment would hold where the plan leaves it out (``--hang-timeout 0`` with
``NPU_LAUNCH_PROGRESS=1``; a fresh job resuming from ``NPU_LAUNCH_RESUME_STEP``)."""
_COMPILE_CACHE_VARIABLES = (contract.MS_COMPILER_CACHE_ENABLE, contract.MS_COMPILER_CACHE_PATH)


def _turns_on(key: str, value: str) -> bool:
    """MindSpore reads ``MS_COMPILER_CACHE_ENABLE=1`` as on (anything else off), and any
    non-empty ``MS_COMPILER_CACHE_PATH`` as where the cache goes."""
    if key == contract.MS_COMPILER_CACHE_ENABLE:
        return value.strip() == "1"
    return bool(value.strip())


_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ADDRESS = re.compile(r"[A-Za-z0-9_:.%\[\]-]{1,253}")


def _check_range(option: str, value: Optional[int], low: int, high: int, what: str) -> None:
    if value is not None and not low <= value <= high:
        raise ConfigError(f"{option} {value}: expected {low}-{high} ({what})")


def fanout_in_force(value: Optional[int]) -> int:
    """``--fanout`` as given (``ConfigError`` outside 1-``MAX_FANOUT``), else its default."""
    _check_range("--fanout", value, 1, limits.MAX_FANOUT, "ssh connections set up at once")
    return limits.DEFAULT_FANOUT if value is None else value


def _check_text(what: str, value: str) -> None:
    """A NUL byte cannot reach a process (argv and environment are C strings)."""
    if "\0" in value:
        raise ConfigError(f"{what} {shown(value)}: contains a NUL byte")


def check_env_name(key: str) -> None:
    """Refuse what is not a variable name, and the variables npu-launch sets itself."""
    if not limits.ENV_NAME.fullmatch(key):
        raise ConfigError(f"--env {shown(key)}: not a variable name (letters, digits, _; "
                          "not starting with a digit)")
    owner = contract.owner_of(key)
    if owner:
        raise ConfigError(f"--env {key}: npu-launch sets {key} in every rank itself ({owner})")


def parse_env_pairs(pairs: Iterable[str], option: str = "--env") -> tuple[tuple[str, str], ...]:
    """``K=V`` strings to pairs; the value may hold anything, including ``=``."""
    result = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"{option} {pair!r}: expected KEY=VALUE")
        result.append((key, value))
    return tuple(result)
