"""Config -> ``Job``: everything that must be true before a process starts is checked here.

``make_job`` picks the backend (this pod's share, by hand, Slurm, ssh with a hostfile, or this
host alone), finds cards and ports, runs preflight and the card checks on every host, reads or
generates the rank table, and builds the ``LaunchPlan``; any problem is a ``LaunchError`` (one
line, exit 2) and nothing has started or been created.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import io
import os
import secrets
import socket
from typing import Callable, Mapping, Optional, Sequence, TextIO

from launcher import limits
from launcher.cluster.backends import Backend, LauncherKind, TransportOptions, choose_kind
from launcher.cluster.backends.mpi import MpiBackend
from launcher.cluster.backends.slurm import SlurmBackend
from launcher.cluster.backends.ssh import SshBackend
from launcher.cluster.backends.ssh_mux import SshMasters
from launcher.cluster.card_checks import check_here
from launcher.cluster.collect import launcher_node
from launcher.cluster.job_preflight import preflight_hosts
from launcher.config.devices import Card, DeviceKind, find_cards, resolve_kind
from launcher.config.envfile import forwarded_env
from launcher.config.hostfile import HostSelection, read_hostfile, select_hosts
from launcher.config.launch_config import LaunchConfig, check_environment
from launcher.errors import ConfigError
from launcher.observe.joblock import check_log_dir
from launcher.plan import pod_waits, pods, ports
from launcher.plan.host_binding import bind_node
from launcher.plan.job_id import batch_job_id, new_job_id
from launcher.plan.launch_plan import LaunchPlan, Node, RankAssignment
from launcher.plan.planner import PlanInputs, build_plan
from launcher.plan.rank_table_mode import AUTO, GENERATED_NAME, load_or_generate, local_candidates, node_share
from parallel import contract
from rank_tables.table import RankTable


@dataclasses.dataclass(frozen=True)
class Job:
    """A plan and how to run it: here (``backend is None``) or through node agents."""

    plan: LaunchPlan
    backend: Optional[Backend]
    node_rank: int
    generated_table: Optional[RankTable] = None
    """``--rank-table auto``: written to the plan's ``RANK_TABLE_FILE`` when the job runs."""
    before_start: Optional[Callable[[], None]] = None
    """Done once every check passed, before anything starts (``--sync-workdir``'s copy)."""
    pod: Optional[pods.Pod] = None
    """The operator's Kubernetes pod this node's share runs in (``launcher.plan.pods``)."""
    without: Optional[Callable[[str], "Job"]] = None
    """``--min-nodes``: this job without one of its hosts (its ranks renumbered, the same job
    id, log directory and secret); ``ConfigError`` when the layout no longer fits."""


def make_job(config: LaunchConfig, environ: Mapping[str, str], err: TextIO,
             masters: Optional[SshMasters] = None) -> Job:
    """Everything that must be true before a process starts is checked here. ``masters``:
    where preflight's ssh connections are kept for the agents."""
    check_environment(config, environ)
    pod = pods.detect(config, environ)  # an operator's pod: this node's share, as it says
    if pod is not None:
        config = pods.node_config(config, pod)
    kind = choose_kind(LauncherKind(config.launcher), environ, bool(config.hostfile))
    _check_for_kind(config, kind)
    notes = io.StringIO()  # said only once the job is known to be good: an error is one line
    if kind is LauncherKind.LOCAL:
        job = _pod_job(config, environ, pod, notes, err) if pod is not None \
            else _local_job(config, environ, notes)
        plan, bound = bind_node(job.plan, job.node_rank)  # agents bind their own host's ranks
        notes.writelines(f"npu-launch: {line}\n" for line in bound)
        job = dataclasses.replace(job, plan=plan)
        if pod is None and not config.rank_table:
            check_here(plan, job.node_rank, environ, notes)
    else:
        job = _cluster_job(config, kind, environ, err, masters)
    check_log_dir(job.plan.log_dir)
    _check_path_lengths(job.plan)
    limits.check_exec_sizes(((spec.label, spec.known_command, spec.env)
                             for spec in job.plan.processes),
                            environ)
    err.write(notes.getvalue())
    if job.before_start is not None:
        job.before_start()  # the job is good: only now may it change other hosts
    return job


_CACHE_DEPTH = 64
"""Bytes MindSpore adds under a rank's compile cache (``rank_N/graph_cache/<graph>``)."""


def _check_path_lengths(plan: LaunchPlan) -> None:
    """Every file the job writes has a path the kernel takes (PATH_MAX): a log directory deep
    enough to pass it would fail once folders were made."""
    paths = [p + ("x" * _CACHE_DEPTH if p.endswith(os.sep) else "")
             for spec in plan.processes for p in spec.files]
    longest = max(paths, key=lambda p: len(os.fsencode(p)), default=plan.log_dir)
    size = len(os.fsencode(longest))
    if size > limits.MAX_PATH_BYTES:
        raise ConfigError(f"log directory {limits.shown(plan.log_dir)}: the job's files in it "
                          f"reach paths of {size} bytes; the system takes at most "
                          f"{limits.MAX_PATH_BYTES}: give a shorter --log-dir")


def _check_for_kind(config: LaunchConfig, kind: LauncherKind) -> None:
    """Options the chosen way of starting nodes would ignore are refused."""
    if config.launcher_args and kind not in (LauncherKind.SLURM, LauncherKind.MPI):
        raise ConfigError(f"--launcher-args are for srun or mpirun; this job starts "
                          f"{'over ssh' if kind is LauncherKind.SSH else 'on this host'}")
    if (config.ssh_port is not None or config.ssh_options) and \
            kind in (LauncherKind.LOCAL, LauncherKind.SLURM):
        raise ConfigError(f"--ssh-port/--ssh-option: this job starts "
                          f"{'with srun' if kind is LauncherKind.SLURM else 'on this host'}, "
                          "not over ssh")
    if kind is LauncherKind.LOCAL and config.min_nodes is not None:
        raise ConfigError("--min-nodes leaves a failing host out of a multi-node job; this job "
                          "runs on this host only (give a --hostfile, or run in a Slurm "
                          "allocation)")
    if kind is LauncherKind.LOCAL and not config.checkpoint_collect:
        raise ConfigError("--no-checkpoint-collect: this job starts no node agents, so every "
                          "checkpoint is on this host already")
    if kind is LauncherKind.LOCAL and (config.nnodes or 1) > 1 and config.node_rank is None:
        raise ConfigError(f"--nnodes {config.nnodes} without --hostfile: a job started by hand "
                          "needs --node-rank, --master-addr and --master-port on every node "
                          "(or give a --hostfile)")


def _local_job(config: LaunchConfig, environ: Mapping[str, str], err: TextIO) -> Job:
    if config.rank_table:
        return _rank_table_job(config, environ)
    device, cards = _local_cards(config, environ, err)
    nnodes = config.nnodes or 1
    node_rank = config.node_rank or 0
    host = socket.gethostname()
    nodes = tuple(Node(host if i == node_rank else f"node{i}", i, cards) for i in range(nnodes))
    master_addr, name = ports.master_address(config.master_addr)
    port = _master_port(config, master_addr, check=node_rank == 0)
    plan = _plan(config, environ, nodes, device, master_addr, port, {})
    return Job(dataclasses.replace(plan, master_name=name), None, node_rank)


def _pod_job(config: LaunchConfig, environ: Mapping[str, str], pod: pods.Pod, notes: TextIO,
             err: TextIO) -> Job:
    """This pod's share of the job its operator placed (``launcher.plan.pods``), as by hand; the
    scheduler's port is checked only where it runs, and the ranks wait for the operator's
    rank table (``before_start``)."""
    pod = pod_waits.with_master_ip(pod, None if config.dry_run else config.startup_timeout, err)
    if not config.dry_run or config.json:  # a dry run's plan starts with it
        notes.write(f"npu-launch: detected: {pod.describe()}\n")
    if pod.node_rank is None:  # the scheduler's own pod: it needs no cards
        device = resolve_kind(DeviceKind.AUTO, find_cards(environ))
        cards = tuple(Card(i, i) for i in range(config.cards or 1))
    else:
        device, cards = _local_cards(config, environ, notes)
    here = pod.node_rank or 0
    nodes = tuple(Node(socket.gethostname() if i == here else f"node{i}", i, cards)
                  for i in range(pod.nnodes))
    port = _master_port(config, pod.master_addr, check=pod.hosts_scheduler)
    plan = pods.share(_plan(config, environ, nodes, device, pod.master_addr, port, {}), pod)
    plan = dataclasses.replace(plan, master_name=pod.master_name)
    return Job(plan, None, here, before_start=pod_waits.table_wait(pod, config, err), pod=pod)


def _rank_table_job(config: LaunchConfig, environ: Mapping[str, str]) -> Job:
    table = load_or_generate(config.rank_table or "", config.cards, environ, config.server_id)
    found = find_cards(environ)
    device = resolve_kind(DeviceKind(config.device), found)
    share = node_share(table, local_candidates(), config.server_id, config.cards, found, device,
                       "this host")
    nodes = (Node(socket.gethostname(), 0, share.cards),)
    layout = TableLayout({0: share.assignments}, table.rank_count, config.rank_table or "")
    master_addr, name = ports.master_address(config.master_addr)
    plan = dataclasses.replace(_plan(config, environ, nodes, device, master_addr, 0, {}, layout),
                               master_name=name)
    generated = table if config.rank_table == AUTO else None
    return Job(plan, None, 0, generated)


def _cluster_job(config: LaunchConfig, kind: LauncherKind, environ: Mapping[str, str],
                 err: TextIO, masters: Optional[SshMasters] = None) -> Job:
    if config.sync_workdir and kind is LauncherKind.SLURM:
        raise ConfigError("--sync-workdir copies over ssh; this job starts with srun, and a "
                          "Slurm job needs its launch directory on every node already (shared "
                          "storage, or sbcast)")
    options = TransportOptions(config.ssh_port, config.ssh_options, config.launcher_args,
                               config.ssh_fanout,
                               masters if kind is LauncherKind.SSH else None)
    hosts = _selected_hosts(config, kind, environ, options)
    _check_min_nodes(config, len(hosts))
    given = ports.master_address(config.master_addr) if config.master_addr else None
    port = config.master_port or ports.free_port("")
    device = resolve_kind(DeviceKind(config.device), find_cards(environ))
    sync = None
    if kind is not LauncherKind.SLURM and config.preflight:
        device, sync, hosts = preflight_hosts(config, hosts, options, device, port, err)
    extra = forwarded_env(environ, config.workdir)

    def on(kept: list[HostSelection], like: Optional[LaunchPlan] = None) -> Job:
        """The job on ``kept`` hosts; like ``like`` (a smaller job of the same plan)."""
        nodes = tuple(Node(h.host, i, _host_cards(config, h, device), h.user)
                      for i, h in enumerate(kept))
        master_addr, name = given if given and like is None \
            else (ports.first_host_address(kept[0].host), kept[0].host)
        told = {**extra, contract.PLANNED_WORLD: str(like.planned_world)} if like else extra
        plan = _plan(config, environ, nodes, device, master_addr, port, told, agents=True,
                     launcher_node=launcher_node([h.host for h in kept]), same_as=like)
        plan = dataclasses.replace(plan, master_name=name if name != master_addr else "")
        backend = _hostfile_backend(config, kind, environ, options, kept)

        def without(host: str) -> Job:
            return on([h for h in kept if h.host != host], plan)
        return Job(plan, backend, 0, before_start=sync if like is None else None,
                   without=without if config.min_nodes is not None else None)
    return on(hosts)


def _check_min_nodes(config: LaunchConfig, hosts: int) -> None:
    if config.min_nodes is None:
        return
    if config.min_nodes > hosts:
        raise ConfigError(f"--min-nodes {config.min_nodes}: the job has {hosts} host(s)")
    layout = config.parallel
    if layout.needs_ascend:
        raise ConfigError(f"--min-nodes: the layout (mode {layout.mode.value}, mp {layout.mp}, "
                          f"pp {layout.pp}) cannot go on with fewer hosts: its checkpoint "
                          "slices belong to their ranks; only data parallelism can")


def _selected_hosts(config: LaunchConfig, kind: LauncherKind, environ: Mapping[str, str],
                    options: TransportOptions) -> list[HostSelection]:
    if kind is LauncherKind.SLURM:
        return _slurm(config, environ, options).hosts()
    if not config.hostfile:
        raise ConfigError(f"--launcher {kind.value}: needs --hostfile")
    return select_hosts(read_hostfile(config.hostfile), config.include, config.exclude,
                        config.nnodes)


def _hostfile_backend(config: LaunchConfig, kind: LauncherKind, environ: Mapping[str, str],
                      options: TransportOptions, hosts: list[HostSelection]) -> Backend:
    if kind is LauncherKind.SLURM:
        return _slurm(config, environ, options).only(hosts)
    return SshBackend(hosts, options) if kind is LauncherKind.SSH else MpiBackend(hosts, options)


def _slurm(config: LaunchConfig, environ: Mapping[str, str],
           options: TransportOptions) -> SlurmBackend:
    return SlurmBackend(environ, config.cards or 1, config.nnodes, options)


def _host_cards(config: LaunchConfig, host: HostSelection, device: DeviceKind) -> tuple[Card, ...]:
    count = config.cards or len(host.cards)
    if count > len(host.cards):
        raise ConfigError(f"--cards {count}: host {host.host} has {len(host.cards)} slot(s) "
                          f"in {config.hostfile}")
    ids = host.cards[:count] if device is DeviceKind.NPU else tuple(range(count))
    return tuple(Card(i, i) for i in ids)


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """What a rank table decides: each node's assignments, the world size, the file."""

    assignments: Mapping[int, Sequence[RankAssignment]]
    world_size: int
    path: str


def _plan(config: LaunchConfig, environ: Mapping[str, str], nodes: tuple[Node, ...],
          device: DeviceKind, master_addr: str, port: int, extra: Mapping[str, str],
          table: Optional[TableLayout] = None, agents: bool = False,
          launcher_node: Optional[int] = None, same_as: Optional[LaunchPlan] = None) -> LaunchPlan:
    """The job's plan; ``same_as``: a plan of the same job on other hosts (its id, log
    directory and secret kept)."""
    world = table.world_size if table else sum(len(n.cards) for n in nodes)
    config.console.check_world(world)
    parallel = config.parallel.validate(world, len(nodes))
    extra = {**extra, contract.PARALLEL: parallel.to_json()}
    job_id = same_as.job_id if same_as else config.job_id \
        or batch_job_id(environ, config.script, config.script_args) or new_job_id()
    log_dir = same_as.log_dir if same_as else \
        os.path.abspath(config.log_dir or os.path.join("npu_launch_logs", job_id))
    table_path = table.path if table else None
    if table_path == AUTO:
        table_path = os.path.join(log_dir, GENERATED_NAME)
    inputs = PlanInputs(
        job_id=job_id, log_dir=log_dir, master_addr=master_addr, master_port=port,
        device=device, nodes=nodes, base_pythonpath=environ.get("PYTHONPATH", ""),
        boot_dir=boot_dir(), extra_env=dict(extra), inherited=frozenset(environ),
        assignments=table.assignments if table else None, rank_table_path=table_path,
        world_size=world, agents=agents,
        token=same_as.token if same_as else secrets.token_hex(16),
        replicated=not parallel.needs_ascend, launcher_node=launcher_node,
    )
    return build_plan(config, inputs)


def _local_cards(config: LaunchConfig, environ: Mapping[str, str],
                 err: TextIO) -> tuple[DeviceKind, tuple[Card, ...]]:
    found = find_cards(environ)
    kind = resolve_kind(DeviceKind(config.device), found)
    if kind is DeviceKind.CPU:
        count = 1 if config.debug else (config.cards or 1)
        if config.device is DeviceKind.AUTO:
            err.write(f"npu-launch: no Ascend cards found: running {count} CPU rank(s)\n")
        return kind, tuple(Card(i, i) for i in range(count))
    count = 1 if config.debug else (config.cards or len(found))
    if count > len(found):
        ids = ",".join(str(c.physical) for c in found)
        raise ConfigError(f"--cards {count}: this host has {len(found)} Ascend card(s) ({ids})")
    if config.device is DeviceKind.AUTO:
        err.write(f"npu-launch: found {len(found)} Ascend card(s): running {count} rank(s) "
                  "on npu\n")
    return kind, found[:count]


def _master_port(config: LaunchConfig, master_addr: str, check: bool) -> int:
    if config.master_port is None:
        return ports.free_port(master_addr)
    if check:
        ports.require_free(master_addr, config.master_port)
    return config.master_port


def boot_dir() -> str:
    """The folder whose ``sitecustomize`` installs the rank hook in every rank."""
    spec = importlib.util.find_spec("parallel")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(list(spec.submodule_search_locations)[0], "_boot")
