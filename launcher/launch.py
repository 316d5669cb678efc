"""``npu-launch SCRIPT``: the short story of a job. ``launcher.job.make_job`` turns the checked
config into a plan (or ``--dry-run`` prints it); the job runs, one ``launcher.attempt.Attempt``
per try, restarted as ``launcher.run.restarts`` decides; ``summary.json`` is written last.

One node: the watch loop (``launcher.run.watch``) runs the plan's ranks here
(``supervisor.run_local``). Several nodes: a backend (ssh, Slurm, OpenMPI) names the hosts,
preflight checks them, and the same loop runs one node agent per host (``cluster.run_agents``).
By hand (``--nnodes N --node-rank R``): this node's share of the plan, like msrun. Either way
one ``Attempt`` per try carries the ranks' events to the monitor.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from typing import Mapping, Optional, Sequence, TextIO

from launcher import files
from launcher.attempt import Attempt, Attempts, StopRequest
from launcher.checkpoints.ledger import CheckpointLedger
from launcher.checkpoints.resume import MissingCheckpoint, ResumePoint, place_for_resume
from launcher.checkpoints.script_saves import ScriptSaves
from launcher.cluster.agent import payload_for
from launcher.cluster.backends.ssh_mux import SshMasters
from launcher.cluster.card_checks import recheck_before_restart
from launcher.cluster.collect import mark_storage
from launcher.cluster.node_agents import run_agents
from launcher.cluster.payload import serving
from launcher.config.frameworks import FrameworkNote, mindspore_only
from launcher.config.launch_config import LaunchConfig
from launcher.diagnose import LIKELY_CAUSE, diagnosed, diagnosis_last, warm_up
from launcher.errors import ConfigError
from launcher.hangs.hang_limits import Learnt, Limits
from launcher.hangs.stalls import HangCheck
from launcher.job import Job, make_job
from launcher.observe.joblock import LogDirLock
from launcher.observe.monitor import JobMonitor
from launcher.plan.checkpoint_arg import dry_run_note, newest_paths, with_checkpoints
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.rank_table_mode import GENERATED_NAME
from launcher.run import last_words
from launcher.run.console_lines import RankLines
from launcher.run.events import prepare_dirs
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.last_words import LastWordsRequest
from launcher.run.output import Console
from launcher.run.restarts import (
    BLAMED_IN_A_ROW,
    AttemptRecord,
    FailurePoint,
    Policy,
    blamed_host,
    cannot_help,
    host_to_leave_out,
    not_restarted,
    shrink_problem,
    stop_restarting,
)
from launcher.run.spares import Spares
from launcher.run.supervisor import print_message, run_local
from launcher.run.watch import wait_unless_signalled
from parallel import contract
from parallel.contract import BadInput


def launch(config: LaunchConfig, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """Plan the job; print the plan (``--dry-run``) or run it. Returns the exit code. One ssh
    handshake per host: preflight's control masters carry the agents too, and end with the
    launch however it ends (``launcher.cluster.backends.ssh_mux``)."""
    with SshMasters() as masters:
        job = make_job(config, environ, err, masters)
        saves = ScriptSaves(_own_log_dir(job))  # the script's own checkpoints: {checkpoint}
        paths = newest_paths(job.plan, saves)
        job = dataclasses.replace(job, plan=with_checkpoints(job.plan, paths))
        if config.dry_run:
            if job.pod is not None and not config.json:
                out.write(f"detected: {job.pod.describe()}\n")
            note = None if config.json else dry_run_note(job.plan, paths)
            out.write((job.plan.to_json() if config.json else job.plan.render()) + "\n"
                      + (f"{note}\n" if note else ""))
            return 0
        warm_up()  # the knowledge base read while the job runs, not as it fails
        lock = LogDirLock(_own_log_dir(job), job.plan.job_id).acquire()
        try:
            result = _run_monitored(job, config, environ, out, err, saves)
        finally:
            lock.release()
    print_message(result, err)
    return result.exit_code


def _run_monitored(job: Job, config: LaunchConfig, environ: Mapping[str, str], out: TextIO,
                   err: TextIO, saves: Optional[ScriptSaves] = None) -> JobResult:
    monitor = _monitor(job, out, err)
    command = (config.script, *config.script_args)
    limits = Limits(config.hang_timeout, config.hang_grace, Learnt.load(_own_log_dir(job), command),
                    floor=config.hang_floor)
    hangs = HangCheck(monitor.rank_states, limits, on_busy=monitor.busy_alone) if limits.on else None
    ledger = CheckpointLedger(_own_log_dir(job), job.plan.world_size, job.plan.replicated,
                              job.plan.collect_ranks, monitor.on_collected,
                              agents=job.backend is not None)
    result: Optional[JobResult] = None
    console = _console(job, config, out)
    try:
        result = run_with_restarts(job, config, environ, console,
                                   Attempts(monitor, ledger, hangs,
                                            FrameworkNote(mindspore_only(config), err), saves),
                                   err)
        for note in (monitor.teardown_note(), monitor.attempts_note(config.max_restarts),
                     monitor.phases_note(), monitor.checkpoint_note()):
            if note is not None:
                result = dataclasses.replace(result, message=f"{result.message}\n{note}".lstrip())
        return diagnosis_last(result)
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
                          result.cause, result.diagnosis)


def run_with_restarts(job: Job, config: LaunchConfig, environ: Mapping[str, str],
                      console: Console, attempts: "Attempts", err: TextIO) -> JobResult:
    """Run the job; after a failure or a hang that came once every rank had started (not an
    import error or a bad argument, which would fail again), start it anew, up to
    ``--max-restarts`` times in all, waiting the backoff first (``launcher.run.restarts``). The
    ranks see the attempt in ``NPU_LAUNCH_RESTART``, and the newest step the ledger knows
    complete in ``NPU_LAUNCH_RESUME_STEP``; the trainer resumes from it. The script's own
    newest checkpoints are in its ``{checkpoint}`` and ``NPU_LAUNCH_CHECKPOINT``. With ``--min-nodes``
    a host blamed for the last two failures is left out (``_leave_out``). Two failures in a
    row at the same step (or both before any), of the same cause, with no newer complete
    checkpoint, stop the job (``restarts.cannot_help``); a failure before start-up is not
    restarted, and one line says why (``restarts.not_restarted``)."""
    policy = Policy(config.max_restarts, *config.backoff, config.min_nodes,
                    first_at_once=config.restart_backoff is None)
    # Warm spares for the next attempt (``launcher.run.spares``): where this launcher runs ranks.
    spares = Spares(environ, job.plan.workdir, job.node_rank) \
        if policy.max_restarts and job.backend is None else None
    try:
        return _attempts(job, config, environ, console, attempts, err, policy, spares)
    finally:
        if spares is not None:
            spares.close()


def _attempts(job: Job, config: LaunchConfig, environ: Mapping[str, str], console: Console,
              attempts: "Attempts", err: TextIO, policy: Policy,
              spares: Optional[Spares]) -> JobResult:
    blamed: list[Optional[str]] = []
    last: Optional[FailurePoint] = None
    left_out: list[str] = []
    waited = 0.0
    while True:
        attempt = attempts.begin(job.plan)
        started = time.time()
        if spares is not None:
            spares.wanted = job.plan.restart < policy.max_restarts
        result = attempt.blame(run_job(job, config, environ, console, attempt, err, spares))
        result = diagnosed(result, job.plan, started)
        plan = job.plan
        attempts.monitor.attempt_ended(AttemptRecord.of(
            plan.restart, started, result, attempt.resumed_from(plan), plan.hosts,
            plan.world_size, waited, left_out))
        restartable = result.outcome in (Outcome.FAILED, Outcome.STALLED)
        again = plan.restart + 1
        if not restartable or again > policy.max_restarts:
            return result
        if not _started_up(attempt, plan, policy, result):
            line = not_restarted(result, policy.min_nodes)
            return dataclasses.replace(result, message=f"{result.message}\n{line}".lstrip())
        point = attempt.failure_point(result)
        blamed.append(blamed_host(result))
        # Without the host that caused both failures the next attempt differs: it may help.
        leaving = host_to_leave_out(blamed, plan.hosts, policy.min_nodes)
        if last is not None and leaving is None and cannot_help(last, point):
            return stop_restarting(result, point.told(last))
        last = point
        first_line = result.message.splitlines()[0] if result.message else result.outcome.value
        waited = policy.wait_before(again)
        console.begin_attempt(again)  # the old attempt's lines before this line, or tagged
        err.write(f"npu-launch: restart {again} of {policy.max_restarts}"
                  f"{f' in {waited:g} s' if waited else ''} after: "
                  f"{first_line.removeprefix('npu-launch: ')}\n"
                  + "".join(f"{line}\n" for line in result.message.splitlines()
                            if line.startswith(LIKELY_CAUSE)))
        bad = recheck_before_restart(plan, job.backend, blamed[-1], config.card_free_timeout,
                                     environ, err)  # launcher.cluster.card_checks
        job, resume, gone = _leave_out(job, [bad.host] * BLAMED_IN_A_ROW if bad else blamed,
                                       policy, attempts, err, bad.why if bad else None)
        if bad is not None and gone is None:
            return bad.stopped(result, plan.job_id)
        _say_passed_over(attempts.ledger, resume, err)
        if gone is not None:
            left_out.append(gone)
            blamed.clear()
        signum = wait_unless_signalled(waited)
        if signum is not None:
            return _stopped_waiting(result, plan.job_id, signum)
        plan = job.plan.restarted(again, resume)
        saved = newest_paths(plan, attempts.saves) if attempts.saves is not None else {}
        job = dataclasses.replace(job, plan=with_checkpoints(plan, saved))


def _started_up(attempt: "Attempt", plan: LaunchPlan, policy: Policy, result: JobResult) -> bool:
    """Whether a failure may be restarted: every rank had initialised communication; with
    ``--min-nodes``, the rank that caused it had called ``init()`` (every rank had, when no rank
    is named): a rank that fails inside it, where a bad card or network shows, may be its
    host's fault; one that fails before, in its imports or arguments, fails again anywhere.
    The culprit's own events are what decide, as they reach node 0 before its exit does; the
    others' ``init-started`` may come later from another host."""
    if attempt.all_of(plan):
        return True
    if policy.min_nodes is None:
        return False
    rank = result.cause.rank if result.cause else None
    return attempt.called_init(rank) if rank is not None else attempt.all_called_init(plan)


def _leave_out(job: Job, blamed: Sequence[Optional[str]], policy: Policy,
               attempts: "Attempts", err: TextIO, why: Optional[str] = None
               ) -> tuple[Job, Optional[ResumePoint], Optional[str]]:
    """The job the next attempt runs, the step it resumes from, and the host it runs without
    (None: every host stays). A host leaves when ``restarts.host_to_leave_out`` names it and
    the job can go on without it: the layout still fits and the global batch splits over the
    ranks left; else the attempt runs on every host again, and one line says why. ``why``:
    the reason to tell instead of the failures (a bad card, ``launcher.cluster.card_checks``)."""
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


def _say_passed_over(ledger: CheckpointLedger, resume: Optional[ResumePoint],
                     err: TextIO) -> None:
    """One line when the newest complete step is last words whose file did not reach node 0
    (its upload did not end within ``--kill-timeout``, or failed): the console said they were
    saved, and the restart resumes from an older step."""
    step = ledger.last_words_passed_over(resume)
    if step is not None:
        older = f"step {resume.step}" if resume is not None else "the start"
        err.write(f"npu-launch: last words of step {step} did not reach node 0 before the "
                  f"restart: it resumes from {older}\n")


def _stopped_waiting(failed: JobResult, job_id: str, signum: int) -> JobResult:
    name = signal.Signals(signum).name
    return JobResult(Outcome.INTERRUPTED, 128 + signum,
                     f"npu-launch: job {job_id} stopped by {name} while waiting to restart "
                     f"(nothing was running)\n{failed.message}", time.time(),
                     Cause(Outcome.INTERRUPTED, signal=name))


def _console(job: Job, config: LaunchConfig, out: TextIO) -> Console:
    """Node 0's console: rank lines without MindSpore's chatter, alike lines merged."""
    shown = config.console.ranks
    count = len(shown) if shown is not None else job.plan.world_size
    console = Console(out.buffer)
    console.show_rank_lines(RankLines(console.write_rank_line, count, config.merge_lines,
                                      config.runtime_logs))
    return console


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
            attempt: Attempt, err: Optional[TextIO] = None,
            spares: Optional[Spares] = None) -> JobResult:
    plan = job.plan
    files.remove(os.path.join(plan.log_dir, contract.STOP_REQUEST_FILE))  # an earlier launch's
    last_words.clear(plan.log_dir)
    if job.generated_table is not None:
        prepare_dirs(plan.log_dir)
        with open(os.path.join(plan.log_dir, GENERATED_NAME), "w") as f:
            f.write(job.generated_table.dumps())
    if job.backend is None:
        prepare_dirs(plan.log_dir, [p for spec in plan.on_node(job.node_rank) for p in spec.files])
        _write_plan(plan)
        missing = _place_here(plan, job.node_rank)
        if missing is not None:
            return missing
        stop = StopRequest(plan, attempt, err)
        return run_local(plan, environ, job.node_rank, console, config.console, attempt,
                         on_stop=stop, on_fault=LastWordsRequest(plan, attempt, err),
                         spares=spares)
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
        return run_agents(plan, agents, config.console, environ, console, attempt,
                          on_stop=lambda send: StopRequest(plan, attempt, err, send),
                          on_fault=lambda asker: LastWordsRequest(plan, attempt, err, asker))


def _place_here(plan: LaunchPlan, node_rank: int) -> Optional[JobResult]:
    """On a restart of ranks run here, the resume step's manifest beside their files (a
    last-words step has one rank's file, which stands for every rank: no rank wrote a manifest
    of it), a damaged or missing file replaced by a replica when the layout has them; the
    failed result when a file cannot be had (nothing is started)."""
    point = plan.resume
    if point is None:
        return None
    specs = [s for s in plan.on_node(node_rank) if s.rank is not None]
    ranks = [s.rank for s in specs if s.rank is not None]
    fetch = (lambda rank, path: shutil.copyfile(point.replicas[rank], path)) \
        if plan.replicated else None
    try:
        place_for_resume(point, ranks, specs[0].host if specs else "?", fetch)
    except (MissingCheckpoint, OSError) as e:
        rank = e.rank if isinstance(e, MissingCheckpoint) else None
        return JobResult(Outcome.FAILED, 1, f"npu-launch: job {plan.job_id} failed before "
                         f"restart {plan.restart}: {e}", time.time(),
                         Cause(Outcome.FAILED, "rank", rank, time=time.time()))
    return None


def _write_plan(plan: LaunchPlan) -> None:
    with open(os.path.join(plan.log_dir, "plan.json"), "w") as f:
        f.write(plan.to_json())
