"""``npu-launch SCRIPT``: turn a checked config into a plan, then run it (or print it).

One node: the watch loop (``launcher.watch``) runs the plan's ranks here
(``supervisor.run_local``). Several nodes: a backend (ssh, Slurm, OpenMPI) names the hosts,
preflight checks them, and the same loop runs one node agent per host (``cluster.run_agents``).
By hand (``--nnodes N --node-rank R``): this node's share of the plan, like msrun. Either way
one ``Attempt`` per try carries the ranks' events to the monitor.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import io
import ipaddress
import math
import os
import secrets
import signal
import socket
import time
from typing import Callable, Mapping, Optional, Sequence, TextIO

from launcher import limits, pods, ports
from launcher.agent import payload_for
from launcher.backends import Backend, LauncherKind, TransportOptions, choose_kind
from launcher.backends.mpi import MpiBackend
from launcher.backends.slurm import SlurmBackend
from launcher.backends.ssh import SshBackend
from launcher.backends.ssh_mux import SshMasters
from launcher.binding import bind_node
from launcher.card_checks import check_here, judge_at_start, recheck_before_restart
from launcher.checkpoints import CheckpointLedger, ResumePoint
from launcher.cluster import run_agents
from launcher.collect import launcher_node, mark_storage
from launcher.config import LaunchConfig, check_environment
from launcher.console_lines import RankLines
from launcher.devices import Card, DeviceKind, find_cards, resolve_kind
from launcher.envfile import forwarded_env
from launcher.errors import ConfigError, LaunchError
from launcher.events import prepare_dirs
from launcher.failures import Cause, JobResult, Outcome, stall_cause
from launcher.frameworks import FrameworkNote, mindspore_only
from launcher.hostfile import HostSelection, read_hostfile, select_hosts
from launcher.joblock import LogDirLock, check_log_dir
from launcher.monitor import JobMonitor
from launcher.output import Console
from launcher.payload import serving
from launcher.plan import LaunchPlan, Node, PlanInputs, RankAssignment, build_plan
from launcher.preflight import HostCheck, launch_files, render, run_preflight
from launcher.rank_table_mode import AUTO, GENERATED_NAME, load_or_generate, local_candidates, node_share
from launcher.restarts import (
    BLAMED_IN_A_ROW,
    AttemptRecord,
    FailurePoint,
    Policy,
    blamed_host,
    cannot_help,
    host_to_leave_out,
    shrink_problem,
    stop_restarting,
)
from launcher.stalls import (
    HANG_EXIT_CODE,
    HangCheck,
    Learnt,
    Limits,
    StackSample,
    Stall,
    describe_stall,
    native_path,
    stalled_before,
)
from launcher.supervisor import print_message, run_local
from launcher.watch import wait_unless_signalled
from launcher.workdir_sync import LaunchDir, sync_stale_hosts
from parallel import contract
from parallel.contract import BadInput, Event
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
    """The operator's Kubernetes pod this node's share runs in (``launcher.pods``)."""
    without: Optional[Callable[[str], "Job"]] = None
    """``--min-nodes``: this job without one of its hosts (its ranks renumbered, the same job
    id, log directory and secret); ``ConfigError`` when the layout no longer fits."""


def launch(config: LaunchConfig, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """Plan the job; print the plan (``--dry-run``) or run it. Returns the exit code. One ssh
    handshake per host: preflight's control masters carry the agents too, and end with the
    launch however it ends (``launcher.backends.ssh_mux``)."""
    with SshMasters() as masters:
        job = make_job(config, environ, err, masters)
        if config.dry_run:
            if job.pod is not None and not config.json:
                out.write(f"detected: {job.pod.describe()}\n")
            out.write((job.plan.to_json() if config.json else job.plan.render()) + "\n")
            return 0
        lock = LogDirLock(_own_log_dir(job), job.plan.job_id).acquire()
        try:
            result = _run_monitored(job, config, environ, out, err)
        finally:
            lock.release()
    print_message(result, err)
    return result.exit_code


def _run_monitored(job: Job, config: LaunchConfig, environ: Mapping[str, str], out: TextIO,
                   err: TextIO) -> JobResult:
    monitor = _monitor(job, out, err)
    command = (config.script, *config.script_args)
    limits = Limits(config.hang_timeout, config.hang_grace, Learnt.load(_own_log_dir(job), command))
    hangs = HangCheck(monitor.rank_states, limits) if limits.on else None
    ledger = CheckpointLedger(_own_log_dir(job), job.plan.world_size, job.plan.replicated,
                              job.plan.collect_ranks, monitor.on_collected,
                              agents=job.backend is not None)
    result: Optional[JobResult] = None
    console = _console(job, config, out)
    try:
        result = run_with_restarts(job, config, environ, console,
                                   Attempts(monitor, ledger, hangs,
                                            FrameworkNote(mindspore_only(config), err)), err)
        for note in (monitor.attempts_note(config.max_restarts), monitor.phases_note(),
                     monitor.checkpoint_note()):
            if note is not None:
                result = dataclasses.replace(result, message=f"{result.message}\n{note}".lstrip())
        return result
    finally:
        console.close()
        stall = hangs.first if hangs else None
        if hangs is not None:
            hangs.limits.learnt.save(_own_log_dir(job), command)
        monitor.storage_found(ledger.storage)
        if result is None:
            monitor.close("error", 1, "npu-launch itself failed", stall)
        else:
            monitor.close(result.outcome.value, result.exit_code, result.message, stall,
                          result.cause)


def run_with_restarts(job: Job, config: LaunchConfig, environ: Mapping[str, str],
                      console: Console, attempts: "Attempts", err: TextIO) -> JobResult:
    """Run the job; after a failure or a hang that came once every rank had started (not an
    import error or a bad argument, which would fail again), start it anew, up to
    ``--max-restarts`` times in all, waiting the backoff first (``launcher.restarts``). The
    ranks see the attempt in ``NPU_LAUNCH_RESTART``, and the newest step the ledger knows
    complete in ``NPU_LAUNCH_RESUME_STEP``; the trainer resumes from it. With ``--min-nodes``
    a host blamed for the last two failures is left out (``_leave_out``). Two failures in a
    row at the same step, of the same cause, with no newer complete checkpoint, stop the job
    (``restarts.cannot_help``)."""
    policy = Policy(config.max_restarts, *config.backoff, config.min_nodes)
    blamed: list[Optional[str]] = []
    last: Optional[FailurePoint] = None
    left_out: list[str] = []
    waited = 0.0
    while True:
        attempt = attempts.begin(job.plan)
        started = time.time()
        result = attempt.blame(run_job(job, config, environ, console, attempt, err))
        plan = job.plan
        attempts.monitor.attempt_ended(AttemptRecord.of(
            plan.restart, started, result, plan.resume.step if plan.resume else None,
            plan.hosts, plan.world_size, waited, left_out))
        restartable = result.outcome in (Outcome.FAILED, Outcome.STALLED)
        again = plan.restart + 1
        if not restartable or again > policy.max_restarts or not _started_up(attempt, plan, policy):
            return result
        point = attempt.failure_point(result)
        if last is not None and cannot_help(last, point):
            return stop_restarting(result, point.told(last))
        last = point
        blamed.append(blamed_host(result))
        first_line = result.message.splitlines()[0] if result.message else result.outcome.value
        waited = policy.wait_before(again)
        err.write(f"npu-launch: restart {again} of {policy.max_restarts}"
                  f"{f' in {waited:g} s' if waited else ''} after: "
                  f"{first_line.removeprefix('npu-launch: ')}\n")
        bad = recheck_before_restart(plan, job.backend, blamed[-1], config.card_free_timeout,
                                     environ, err)  # launcher.card_checks
        job, resume, gone = _leave_out(job, [bad.host] * BLAMED_IN_A_ROW if bad else blamed,
                                       policy, attempts, err, bad.why if bad else None)
        if bad is not None and gone is None:
            return bad.stopped(result, plan.job_id)
        if gone is not None:
            left_out.append(gone)
            blamed.clear()
        signum = wait_unless_signalled(waited)
        if signum is not None:
            return _stopped_waiting(result, plan.job_id, signum)
        job = dataclasses.replace(job, plan=job.plan.restarted(again, resume))


def _started_up(attempt: "Attempt", plan: LaunchPlan, policy: Policy) -> bool:
    """Whether a failure may be restarted: every rank had initialised communication; with
    ``--min-nodes``, every rank had called ``init()`` (a rank that fails inside it, where a bad
    card or network shows, may be its host's fault; one that fails before, in its imports or
    arguments, fails again anywhere)."""
    return attempt.all_of(plan) or (policy.min_nodes is not None and attempt.all_called_init(plan))


def _leave_out(job: Job, blamed: Sequence[Optional[str]], policy: Policy,
               attempts: "Attempts", err: TextIO, why: Optional[str] = None
               ) -> tuple[Job, Optional[ResumePoint], Optional[str]]:
    """The job the next attempt runs, the step it resumes from, and the host it runs without
    (None: every host stays). A host leaves when ``restarts.host_to_leave_out`` names it and
    the job can go on without it: the layout still fits and the global batch splits over the
    ranks left; else the attempt runs on every host again, and one line says why. ``why``:
    the reason to tell instead of the failures (a bad card, ``launcher.card_checks``)."""
    plan, ledger = job.plan, attempts.ledger
    resume = ledger.resume_point()
    host = host_to_leave_out(blamed, plan.hosts, policy.min_nodes)
    if host is None or job.without is None:
        return job, resume, None
    after = plan.world_size - sum(1 for spec in plan.ranks if spec.host == host)
    problem = shrink_problem(plan.world_size, after, attempts.monitor.global_batch())
    smaller = None
    if problem is None:
        try:
            smaller = job.without(host)
        except (ConfigError, BadInput) as e:
            problem = str(e)
    because = why or f"its ranks caused the last {BLAMED_IN_A_ROW} failures"
    if smaller is None:
        err.write(f"npu-launch: {host} {why or f'caused the last {BLAMED_IN_A_ROW} failures'} "
                  f"but stays in the job: {problem}\n")
        return job, resume, None
    new = smaller.plan
    err.write(f"npu-launch: leaving {host} out: {because}; "
              f"{new.nnodes} host(s) and {new.world_size} rank(s) go on "
              f"(--min-nodes {policy.min_nodes}), the global batch kept\n")
    ledger.reshape(new.world_size, new.collect_ranks, resume.step if resume else None)
    return smaller, resume.for_world(new.world_size) if resume else None, host


def _stopped_waiting(failed: JobResult, job_id: str, signum: int) -> JobResult:
    name = signal.Signals(signum).name
    return JobResult(Outcome.INTERRUPTED, 128 + signum,
                     f"npu-launch: job {job_id} stopped by {name} while waiting to restart "
                     f"(nothing was running)\n{failed.message}", time.time(),
                     Cause(Outcome.INTERRUPTED, signal=name))


@dataclasses.dataclass(frozen=True)
class Attempts:
    """What outlives one attempt of the job: the monitor, the checkpoint ledger and the hang
    check."""

    monitor: JobMonitor
    ledger: CheckpointLedger
    hangs: Optional[HangCheck] = None
    frameworks: Optional[FrameworkNote] = None

    def begin(self, plan: LaunchPlan) -> "Attempt":
        return Attempt(self.monitor, self.hangs, self.ledger, _stack_paths(plan),
                       {s.rank: s.host for s in plan.ranks if s.rank is not None},
                       self.frameworks)


class Attempt:
    """One attempt of the job, as node 0 sees it (a ``watch.Reporter``): events go to the
    monitor, checkpoint events to the ledger, stack samples to the hang check and to node 0's
    copy of the rank's stack file; which ranks initialised is remembered; ``tick`` redraws the
    display and says whether the job hangs; ``blame`` names a stalled rank as the root cause
    of a failure it caused."""

    def __init__(self, monitor: JobMonitor, hangs: Optional[HangCheck] = None,
                 ledger: Optional[CheckpointLedger] = None,
                 stack_paths: Optional[Mapping[int, str]] = None,
                 ranks: Optional[Mapping[int, str]] = None,
                 frameworks: Optional[FrameworkNote] = None) -> None:
        self.monitor = monitor
        self.hangs = hangs
        self.ledger = ledger
        self._stack_paths = stack_paths or {}
        self._frameworks = frameworks
        self.initialised: set[int] = set()
        self.calling_init: set[int] = set()
        self.steps: dict[int, int] = {}
        """Each rank's last trainer step in this attempt."""
        self.exited: set[int] = set()
        self.savers: set[int] = set()
        """Ranks whose trainer saves a checkpoint when asked to stop (``saves_on_stop``)."""
        self.log_every = 1
        self.step_times: list[tuple[float, int]] = []
        """(when it arrived, step) of the last few step events, for the pace of steps."""
        monitor.begin_attempt(ranks)
        if hangs is not None:
            hangs.begin_attempt()

    def event(self, event: Event) -> None:
        if event.kind == contract.EVENT_INITIALISED:
            self.initialised.add(event.rank)
        elif event.kind == contract.EVENT_INIT_STARTED:
            self.calling_init.add(event.rank)
        elif event.kind == contract.EVENT_CHECKPOINT and self.ledger is not None:
            self.ledger.record(event)
        elif event.kind == contract.EVENT_STACK:
            self._keep_stack(event)
        elif event.kind == contract.EVENT_FRAMEWORK and self._frameworks is not None:
            self._frameworks.see(event)
        elif event.kind == contract.EVENT_STEP and event.step is not None:
            self._stepped(event, event.step)
        elif event.kind == contract.EVENT_EXITED:
            self.exited.add(event.rank)
        self.monitor.on_event(event)

    def ranks_done(self, node_rank: int) -> None:
        pass  # the node's supervisor goes on to its scheduler; the monitor saw every exit

    def tick(self) -> Optional[Stall]:
        self.monitor.tick()
        return self.hangs() if self.hangs is not None else None

    def all_of(self, plan: LaunchPlan) -> bool:
        return {spec.rank for spec in plan.ranks} <= self.initialised

    def all_called_init(self, plan: LaunchPlan) -> bool:
        return {spec.rank for spec in plan.ranks} <= self.calling_init | self.initialised

    def _stepped(self, event: Event, step: int) -> None:
        self.steps[event.rank] = step
        saves = event.record.get("saves_on_stop")
        if isinstance(saves, bool):  # said in a fit's first step event
            (self.savers.add if saves else self.savers.discard)(event.rank)
        every = event.record.get("log_every")
        if isinstance(every, int) and every > 0:
            self.log_every = every
        self.step_times = [*self.step_times[-7:], (time.monotonic(), step)]

    def stop_step(self, ranks: Sequence[int]) -> Optional[int]:
        """The step every rank of ``ranks`` can still reach and save, when all of them save on
        a stop request: past the newest step reported, by the steps between two reports and
        by a second's worth of steps (events arrive late), plus one."""
        if not ranks or not set(ranks) <= self.savers:
            return None
        (t0, s0), (t1, s1) = self.step_times[0], self.step_times[-1]
        per_second = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
        return max(self.steps.values()) + self.log_every + math.ceil(per_second) + 1

    def failure_point(self, result: JobResult) -> FailurePoint:
        """Where this attempt failed (its root-cause rank's last step, else its progress
        count), why, and the newest complete checkpoint now."""
        rank = result.cause.rank if result.cause else None
        where: Optional[tuple[str, int]] = None
        if rank is not None and rank in self.steps:
            where = ("step", self.steps[rank])
        elif rank is not None:
            counts = {s.rank: s.progress.count for s in self.monitor.rank_states()}
            where = ("count", counts[rank]) if counts.get(rank) else None
        resume = self.ledger.resume_point() if self.ledger is not None else None
        return FailurePoint.of(result, where, resume.step if resume else None)

    def blame(self, result: JobResult) -> JobResult:
        """``result``, or, when its failed rank was waiting on one that had stopped making
        progress (a communication timeout, say), the hang of that one, with the failure told
        as its consequence."""
        cause = result.cause
        if result.outcome is not Outcome.FAILED or cause is None or cause.rank is None \
                or cause.process != "rank":
            return result
        stall = stalled_before(self.monitor.rank_states(), cause.rank, cause.time or time.time())
        if stall is None:
            return result
        if self.hangs is not None:  # the failure came first: say which limit it beat
            limits = self.hangs.limits
            stall = dataclasses.replace(stall, timeout=limits.quiet,
                                        limit=f"{limits.why}, not reached")
        block = describe_stall(stall, self.monitor.job_id)
        consequence = "\n".join("  " + line for line in result.message.splitlines()[:12])
        message = (f"{block}\n  rank {cause.rank}'s failure followed from it (it waited on rank "
                   f"{stall.rank}):\n{consequence}")
        return JobResult(Outcome.STALLED, HANG_EXIT_CODE, message, result.ended_at,
                         stall_cause(stall, consequence=cause))

    def _keep_stack(self, event: Event) -> None:
        """A node's stack sample: for the hang check, and in node 0's log directory (the files
        on the rank's own host, when that is this one, already hold the same)."""
        if self.hangs is not None:
            self.hangs.sample(StackSample.of(event))
        path = self._stack_paths.get(event.rank)
        if path is not None:
            for target, field in ((path, "text"), (native_path(path), "native")):
                text = event.record.get(field)
                if isinstance(text, str) and text:
                    _write_if_changed(target, text)


def _write_if_changed(path: str, text: str) -> None:
    try:
        with open(path, errors="replace") as f:
            if f.read(len(text) + 1) == text:
                return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _console(job: Job, config: LaunchConfig, out: TextIO) -> Console:
    """Node 0's console: rank lines without MindSpore's chatter, alike lines merged."""
    shown = config.console.ranks
    count = len(shown) if shown is not None else job.plan.world_size
    console = Console(out.buffer)
    console.show_rank_lines(RankLines(console.write_line, count, config.merge_lines,
                                      config.runtime_logs))
    return console


def _stack_paths(plan: LaunchPlan) -> dict[int, str]:
    return {spec.rank: spec.stack_path for spec in plan.ranks
            if spec.rank is not None and spec.stack_path}


def _monitor(job: Job, out: TextIO, err: TextIO) -> JobMonitor:
    """The job's monitor: a live table on a terminal, else plain lines on ``err``. A node of a
    job started by hand on every node watches only its own ranks (see ``_own_log_dir``)."""
    plan = job.plan
    live = out.isatty() and os.environ.get("TERM", "dumb") != "dumb" and not plan.foreground
    specs = plan.on_node(job.node_rank) if _by_hand(job) else plan.processes
    return JobMonitor(_own_log_dir(job), plan.job_id,
                      {s.rank: s.host for s in specs if s.rank is not None},
                      out if live else err, live)


def _by_hand(job: Job) -> bool:
    return job.backend is None and job.plan.nnodes > 1


def _own_log_dir(job: Job) -> str:
    """Where this launcher keeps its files: the job's log dir, or, for a node of a job started by
    hand on every node, that node's own folder in it (the log dir may be shared)."""
    if _by_hand(job):
        return os.path.dirname(job.plan.on_node(job.node_rank)[-1].log_path)
    return job.plan.log_dir


def run_job(job: Job, config: LaunchConfig, environ: Mapping[str, str], console: Console,
            attempt: Attempt, err: Optional[TextIO] = None) -> JobResult:
    plan = job.plan
    _clear_stop_request(plan.log_dir)  # an earlier launch's must not stop this one
    if job.generated_table is not None:
        prepare_dirs(plan.log_dir)
        with open(os.path.join(plan.log_dir, GENERATED_NAME), "w") as f:
            f.write(job.generated_table.dumps())
    if job.backend is None:
        prepare_dirs(plan.log_dir, [p for spec in plan.on_node(job.node_rank) for p in spec.files])
        _write_plan(plan)
        stop = StopRequest(plan, attempt, err)
        return run_local(plan, environ, job.node_rank, console, config.console, attempt,
                         on_stop=stop)
    prepare_dirs(plan.log_dir)
    mark_storage(plan.log_dir, plan.token)  # before any agent looks for it
    replicas = plan.resume.replicas if plan.resume else {}
    with serving(b"", plan.master_addr, replicas, attempt.monitor.on_transfer,
                 attempt.ledger) as served:
        payload = payload_for(plan, served)
        served.payload = payload
        agents = job.backend.agent_launches(plan, payload, served)
        prepare_dirs(plan.log_dir, [p for agent in agents for p in agent.spec.files])
        _write_plan(plan)
        return run_agents(plan, agents, config.console, environ, console, attempt)


@dataclasses.dataclass(frozen=True)
class StopRequest:
    """On a stop signal to a job run here: when every rank's trainer saves on request
    (``saves_on_stop``), the step they all save and stop at goes into the log directory
    (``contract.STOP_REQUEST_FILE``), and they get ``--kill-timeout`` to do it and exit;
    else they are stopped at once, as before."""

    plan: LaunchPlan
    attempt: "Attempt"
    err: Optional[TextIO] = None

    def __call__(self, signum: int) -> float:
        step = self.attempt.stop_step([s.rank for s in self.plan.ranks if s.rank is not None])
        if step is None or self.plan.timeouts.kill <= 0:
            return 0.0
        path = os.path.join(self.plan.log_dir, contract.STOP_REQUEST_FILE)
        try:
            with open(f"{path}.tmp", "w") as f:
                f.write(f"{step}\n")
            os.replace(f"{path}.tmp", path)
        except OSError:
            return 0.0
        if self.err is not None:
            self.err.write(f"npu-launch: {signal.Signals(signum).name}: every rank saves step "
                           f"{step} and stops (--kill-timeout {self.plan.timeouts.kill:g} s; "
                           "again to stop at once)\n")
            self.err.flush()
        return self.plan.timeouts.kill

    def ranks_stopped(self) -> bool:
        return {s.rank for s in self.plan.ranks if s.rank is not None} <= self.attempt.exited


def _clear_stop_request(log_dir: str) -> None:
    try:
        os.remove(os.path.join(log_dir, contract.STOP_REQUEST_FILE))
    except OSError:
        pass


def _write_plan(plan: LaunchPlan) -> None:
    with open(os.path.join(plan.log_dir, "plan.json"), "w") as f:
        f.write(plan.to_json())


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
    master_addr, name = master_address(config.master_addr)
    port = _master_port(config, master_addr, check=node_rank == 0)
    plan = _plan(config, environ, nodes, device, master_addr, port, {})
    return Job(dataclasses.replace(plan, master_name=name), None, node_rank)


def _pod_job(config: LaunchConfig, environ: Mapping[str, str], pod: pods.Pod, notes: TextIO,
             err: TextIO) -> Job:
    """This pod's share of the job its operator placed (``launcher.pods``), as by hand; the
    scheduler's port is checked only where it runs, and the ranks wait for the operator's
    rank table (``before_start``)."""
    pod = pods.with_master_ip(pod, None if config.dry_run else config.startup_timeout, err)
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
    return Job(plan, None, here, before_start=pods.table_wait(pod, config, err), pod=pod)


def _rank_table_job(config: LaunchConfig, environ: Mapping[str, str]) -> Job:
    table = load_or_generate(config.rank_table or "", config.cards, environ, config.server_id)
    found = find_cards(environ)
    device = resolve_kind(DeviceKind(config.device), found)
    share = node_share(table, local_candidates(), config.server_id, config.cards, found, device,
                       "this host")
    nodes = (Node(socket.gethostname(), 0, share.cards),)
    layout = TableLayout({0: share.assignments}, table.rank_count, config.rank_table or "")
    master_addr, name = master_address(config.master_addr)
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
    given = master_address(config.master_addr) if config.master_addr else None
    port = config.master_port or ports.free_port("")
    device = resolve_kind(DeviceKind(config.device), find_cards(environ))
    sync = None
    if kind is not LauncherKind.SLURM and config.preflight:
        device, sync, hosts = _preflight(config, hosts, options, device, port, err)
    extra = forwarded_env(environ, config.workdir)

    def on(kept: list[HostSelection], like: Optional[LaunchPlan] = None) -> Job:
        """The job on ``kept`` hosts; like ``like`` (a smaller job of the same plan)."""
        nodes = tuple(Node(h.host, i, _host_cards(config, h, device), h.user)
                      for i, h in enumerate(kept))
        master_addr, name = given if given and like is None \
            else (_address_of(kept[0].host), kept[0].host)
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


def _preflight(config: LaunchConfig, hosts: list[HostSelection], options: TransportOptions,
               device: DeviceKind, port: int, err: TextIO
               ) -> tuple[DeviceKind, Optional[Callable[[], None]], list[HostSelection]]:
    """The device the hosts have, once every host passed; with ``--sync-workdir`` and
    hosts that lack the launch directory or differ, the copy to make (and check) once the rest
    of the job is known to be good: a refused job changes no host; and the hosts the job runs
    on (``--min-nodes`` leaves out those with a bad card, ``card_checks.judge_at_start``)."""
    workdir = os.path.abspath(config.workdir or ".")
    files = launch_files(workdir, config.script, config.script_args)

    def check() -> list[HostCheck]:
        return run_preflight(hosts, options, workdir, DeviceKind(config.device), port, files,
                             config.cards)

    source = LaunchDir.of(workdir, config.log_dir) if config.sync_workdir else None
    if source is not None:
        source.measure()  # over the cap: refused before any host is asked
    checks = check()
    verdict = judge_at_start(checks, config.min_nodes)
    err.writelines(note + "\n" for note in verdict.notes)
    hosts = [h for h in hosts if h.host not in verdict.left_out]
    checks = [c for c in checks if c.host not in verdict.left_out]
    sync = None
    if source is not None:
        judged = sync_stale_hosts(source, hosts, checks, options, check,
                                  err if config.dry_run else io.StringIO(), dry_run=True)
        if not config.dry_run and judged != checks:
            sync = functools.partial(_sync_then_check, source, hosts, checks, options, check, err)
        checks = judged
    _require_passed(checks, err)
    if DeviceKind(config.device) is DeviceKind.AUTO:
        # A host that lacked the launch directory (copied once the job is good) said nothing
        # of its cards: the others speak for it.
        known = [c.facts.get("cards", 0) for c in checks if c.facts is not None]
        with_cards = bool(known) and all(cards > 0 for cards in known)
        return (DeviceKind.NPU if with_cards else DeviceKind.CPU), sync, hosts
    return device, sync, hosts


def _sync_then_check(source: LaunchDir, hosts: list[HostSelection], checks: list[HostCheck],
                     options: TransportOptions, check: Callable[[], list[HostCheck]],
                     err: TextIO) -> None:
    _require_passed(sync_stale_hosts(source, hosts, checks, options, check, err), err)


def _require_passed(checks: list[HostCheck], err: TextIO) -> None:
    failed = [c.host for c in checks if not c.ok]
    if failed:
        err.write(render(checks) + "\n")
        raise LaunchError(f"preflight failed on {', '.join(failed)}: nothing was started")


def _host_cards(config: LaunchConfig, host: HostSelection, device: DeviceKind) -> tuple[Card, ...]:
    count = config.cards or len(host.cards)
    if count > len(host.cards):
        raise ConfigError(f"--cards {count}: host {host.host} has {len(host.cards)} slot(s) "
                          f"in {config.hostfile}")
    ids = host.cards[:count] if device is DeviceKind.NPU else tuple(range(count))
    return tuple(Card(i, i) for i in ids)


def _address_of(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ConfigError(f"cannot resolve {host} (the first host, where the scheduler runs); "
                          "give --master-addr") from None


def master_address(given: Optional[str]) -> tuple[str, str]:
    """The scheduler's address as MindSpore takes it (an IP: it cannot parse a host name), and
    the name it was given as ("" for an address). A name is resolved here, once, on node 0 (or
    on each node of a job started by hand), to its IPv4 address, as msrun resolves
    ``--master_addr``; every rank then gets that address."""
    if not given:
        return "127.0.0.1", ""
    try:
        ipaddress.ip_address(given.strip("[]"))
        return given, ""
    except ValueError:
        pass
    try:
        return socket.gethostbyname(given), given
    except (OSError, UnicodeError) as e:
        raise ConfigError(f"--master-addr {given}: cannot resolve the name "
                          f"({getattr(e, 'strerror', None) or e}); give the scheduler host's "
                          "IP address") from None


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
    job_id = same_as.job_id if same_as else config.job_id or new_job_id()
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


def new_job_id() -> str:
    """Sortable and unique enough across one cluster: ``20261130-101500-3fa2``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def boot_dir() -> str:
    """The folder whose ``sitecustomize`` installs the rank hook in every rank."""
    spec = importlib.util.find_spec("parallel")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(list(spec.submodule_search_locations)[0], "_boot")
