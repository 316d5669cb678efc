"""``npu-launch SCRIPT``: the short story of a job. ``launcher.job.make_job`` turns the checked
config into a plan (or ``--dry-run`` prints it); the job runs, one ``launcher.attempt.Attempt``
per try, restarted as ``launcher.run.restart_decision`` decides; ``summary.json`` is written last.

One node: the watch loop (``launcher.run.watch``) runs the plan's ranks here
(``supervisor.run_local``). Several nodes: a backend (ssh, Slurm, OpenMPI) names the hosts,
preflight checks them, and the same loop runs one node agent per host (``cluster.node_agents.run_agents``).
By hand (``--nnodes N --node-rank R``): this node's share of the plan, like msrun. Either way
one ``Attempt`` per try carries the ranks' events to the monitor.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import time
from collections import Counter
from typing import Callable, Mapping, Optional, TextIO

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
from launcher.plan.launch_plan import PLAN_FILE, LaunchPlan
from launcher.plan.rank_table_mode import GENERATED_NAME
from launcher.run import last_words
from launcher.run.console_lines import RankLines
from launcher.run.events import prepare_dirs
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.last_words import LastWordsRequest
from launcher.run.output import Console
from launcher.run.restart_decision import (
    CARDS_FIT,
    AttemptEnd,
    BlameHistory,
    CardVerdict,
    Decision,
    GoesOn,
    JobShape,
    RestartDecision,
    decide,
)
from launcher.run.restarts import AttemptRecord, Policy
from launcher.run.spares import Spares
from launcher.run.supervisor import print_message, run_local
from launcher.run.watch import HeldStopSignals, wait_unless_signalled
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
    newest checkpoints are in its ``{checkpoint}`` and ``NPU_LAUNCH_CHECKPOINT``. What follows
    an attempt is one pure decision (``launcher.run.restart_decision.decide``: stop, restart,
    or restart without a host, ``--min-nodes``); this loop only carries it out: it prints the
    decision's lines, re-checks the blamed host's cards when the decision asks, reshapes the
    ledger for a job left smaller, and waits out the backoff."""
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
    history = BlameHistory()
    left_out: tuple[str, ...] = ()
    waited = 0.0
    with HeldStopSignals() as held:  # while no attempt's watch loop runs (the next one takes them)
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
            end = _end_of(attempt, plan, policy, result)
            smaller = functools.cache(job.without) if job.without is not None else None
            shape = _shape(job, attempts.monitor, smaller)
            decision = decide(end, policy, history, shape)  # launcher.run.restart_decision
            if decision.kind is Decision.CHECK_CARDS:
                verdict = _check_cards(job, config, environ, console, err, decision, held.pending)
                if (signum := held.take()) is not None:  # it ended the wait for the cards
                    return _stopped_waiting(result, plan.job_id, signum)
                decision = decide(end, policy, history, shape, verdict)
            err.write("".join(f"{line}\n" for line in decision.lines))
            if decision.stops:
                held.take()  # the job ends here whatever came
                return decision.result
            resume = attempts.ledger.resume_point()
            if decision.kind is Decision.LEAVE_OUT and decision.host and smaller is not None:
                job, resume = _leave_out(smaller(decision.host), attempts.ledger, resume)
                left_out = (*left_out, decision.host)
            _say_passed_over(attempts.ledger, resume, err)
            history, waited = decision.history, decision.wait_s
            signum = held.take() or wait_unless_signalled(waited)
            if signum is not None:
                return _stopped_waiting(result, plan.job_id, signum)
            plan = job.plan.restarted(decision.attempt, resume)
            saved = newest_paths(plan, attempts.saves) if attempts.saves is not None else {}
            job = dataclasses.replace(job, plan=with_checkpoints(plan, saved))


def _end_of(attempt: "Attempt", plan: LaunchPlan, policy: Policy, result: JobResult) -> AttemptEnd:
    """What the attempt's end says, for the restart decision."""
    likely = tuple(line for line in result.message.splitlines() if line.startswith(LIKELY_CAUSE))
    return AttemptEnd(result, plan.restart, _started_up(attempt, plan, policy, result),
                      attempt.failure_point(result), likely)


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


def _shape(job: Job, monitor: JobMonitor, smaller: Optional[Callable[[str], Job]]) -> JobShape:
    """The job as the restart decision sees it; ``smaller``: ``Job.without``, remembering the
    job it made for the host that leaves."""
    plan = job.plan
    return JobShape(plan.job_id, plan.hosts, plan.world_size, Counter(s.host for s in plan.ranks),
                    monitor.global_batch(), functools.partial(_goes_on, smaller) if smaller else None)


def _goes_on(smaller: Callable[[str], Job], host: str) -> GoesOn:
    """The job without ``host``, as the restart decision needs it: the hosts and ranks left, or
    why its layout cannot go on without it."""
    try:
        plan = smaller(host).plan
    except (ConfigError, BadInput) as e:
        return GoesOn(problem=str(e))
    return GoesOn(plan.nnodes, plan.world_size)


def _check_cards(job: Job, config: LaunchConfig, environ: Mapping[str, str], console: Console,
                 err: TextIO, decision: RestartDecision, stopped: Callable[[], bool]) -> CardVerdict:
    """Say the restart, then check the blamed host's cards again (``launcher.cluster.card_checks``:
    it waits up to ``--card-free-timeout`` for a held card, until ``stopped``): the verdict the
    decision takes."""
    console.begin_attempt(decision.attempt)  # the old attempt's lines before this line, or tagged
    err.write("".join(f"{line}\n" for line in decision.lines))
    bad = recheck_before_restart(job.plan, job.backend, decision.host, config.card_free_timeout,
                                 environ, err, stopped)
    return CardVerdict(bad.host, bad.why) if bad is not None else CARDS_FIT


def _leave_out(smaller: Job, ledger: CheckpointLedger, resume: Optional[ResumePoint]
               ) -> tuple[Job, Optional[ResumePoint]]:
    """The job without the host the decision left out, and the step it resumes from: the
    ledger reshaped for its ranks, the resume step's manifest cut to them."""
    new = smaller.plan
    ledger.reshape(new.world_size, new.collect_ranks, resume.step if resume else None)
    return smaller, resume.for_world(new.world_size) if resume else None


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
    with open(os.path.join(plan.log_dir, PLAN_FILE), "w") as f:
        f.write(plan.to_json())
