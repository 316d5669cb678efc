"""Node 0 of a multi-node job: start the node agents, show their lines, end the job as one.

The agents (``launcher.cluster.agent``) supervise their own ranks. Node 0 starts them with at most
``--fanout`` connecting at once (``launcher.cluster.fanout``), and watches the agent processes
(ssh clients, or one srun/mpirun): the first agent that reports a failed job, or exits
non-zero, ends the job everywhere, once the others had ``SETTLE`` seconds to report theirs
(the earliest is the cause); so does SIGINT/SIGTERM/SIGHUP here, at once. Stopping an agent means
closing its stdin (ssh) or signalling srun/mpirun, which pass the signal on; every agent then
stops its ranks and kills what is left of the job id on its host.
"""
from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from typing import BinaryIO, Callable, Mapping, Optional

from launcher.cluster import control
from launcher.cluster.fanout import Admission, open_files_needed, raise_open_files
from launcher.config.launch_config import ConsoleFilter
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec
from launcher.run.failures import Cause, JobResult, Outcome, exit_code_of, last_lines_block
from launcher.run.last_words import Asker
from launcher.run.output import Console, mark_attempt
from launcher.run.process import Exit, ProcessGroup
from launcher.run.watch import FaultHook, Reporter, StopHook, Watch
from parallel.contract import Event

_RANK_PREFIX = re.compile(rb"^\[([^\]\s]+):(\d+)\] ")

SETTLE = 0.15
"""Seconds node 0 waits, after the first failure it hears of, for the other nodes' reports
before it stops the job (at once when every node has reported or ended): a rank whose peer died
fails a moment later (gloo and HCCL see the broken link), and its node's report can arrive
first. The earliest failure by the ranks' own time is the cause."""


@dataclasses.dataclass(frozen=True)
class AgentLaunch:
    """One process node 0 starts: an ssh client for one host, or one srun/mpirun for all."""

    spec: ProcessSpec
    stdin: Optional[bytes]
    fanout: Optional[int] = None
    """At most this many of the job's agents connecting at once (``--fanout``, ssh); None for
    one srun or mpirun, which fans out itself."""
    stdin_nodes: Optional[frozenset[int]] = None
    """The node ranks whose agent reads node 0's control lines on this process's stdin (None:
    every node's it runs; mpirun passes stdin to the first agent only)."""


class StreamedLogs:
    """Node 0's copy of every rank's log, written from the lines the agents stream back; an
    attempt's lines below its mark (``output.mark_attempt``) where the copy has earlier ones."""

    def __init__(self, plan: LaunchPlan) -> None:
        self._plan = plan
        self._files: dict[int, BinaryIO] = {}
        self._lock = threading.Lock()

    def write(self, rank: int, line: bytes) -> None:
        with self._lock:
            f = self._files.get(rank)
            if f is None:
                path = os.path.join(self._plan.log_dir, f"rank_{rank}.log")
                mark_attempt(path, self._plan.job_id, self._plan.restart, time.time())
                f = self._files[rank] = open(path, "ab", buffering=0)
            f.write(line + b"\n")

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


class NodeAgents:
    """The agents of a multi-node ``plan``, as the watch loop (``launcher.run.watch``) supervises
    them: their rank lines go to the console and node 0's copy of each rank's log, their events
    to ``reporter``, and the earliest failure any of them reports is the job's."""

    everything = "every node's processes"

    def __init__(self, plan: LaunchPlan, agents: list[AgentLaunch],
                 console_filter: ConsoleFilter, console: Console, reporter: Reporter) -> None:
        self._plan = plan
        self._agents = agents
        self._filter = console_filter
        self._console = console
        self._reporter = reporter
        self._logs = StreamedLogs(plan)
        self._results: list[JobResult] = []
        self._nodes_done: set[int] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ended: list[Exit] = []
        self._failed_since: Optional[float] = None
        self._finish_sent = False
        self._answers: dict[int, str] = {}
        self._answered = threading.Condition(self._lock)
        bound = min((a.fanout for a in agents if a.fanout is not None), default=len(agents))
        self._admission = Admission(agents, lambda a: a.spec.label, max(bound, 1))

    def start(self, group: ProcessGroup, wake: threading.Event) -> None:
        """Start the first ``--fanout`` agents; ``check`` starts the others as those connect."""
        self._wake = wake
        raise_open_files(open_files_needed(len(self._agents), self._plan.world_size))
        self._start_due(group)

    def _start_due(self, group: ProcessGroup) -> None:
        for agent in self._admission.due():
            group.start(agent.spec, self._line_sink(agent.spec), agent.stdin)

    def check(self, group: ProcessGroup, exits: list[Exit]) -> Optional[Outcome]:
        self._ended += exits
        for exit_ in exits:
            self._admission.ended(exit_.spec.label)
        if not self._finish_sent and len(self._nodes_done) == self._plan.nnodes:
            group.send(control.FINISH)
            self._finish_sent = True
        if self._failed_results() or any(not e.ok for e in self._ended):
            return Outcome.FAILED if self._settled() else None
        self._start_due(group)
        if len(self._ended) == len(self._agents):
            return Outcome.SUCCEEDED
        return None

    def before_close(self, group: ProcessGroup, outcome: Outcome) -> None:
        pass

    def after_close(self, exits: list[Exit]) -> None:
        self._ended += exits
        self._logs.close()

    def conclude(self, outcome: Outcome) -> JobResult:
        """The earliest failure an agent reported, or else an agent that died without one."""
        failed = sorted(self._failed_results(), key=lambda r: r.cause_time)
        if failed:
            return failed[0]
        bad = next(e for e in self._ended if not e.ok)
        return _agent_failure(bad, self._plan.job_id)

    def finished(self, elapsed: float) -> str:
        return (f"npu-launch: job {self._plan.job_id} finished: {self._plan.world_size} rank(s) "
                f"on {self._plan.nnodes} node(s) exited 0 in {elapsed:.1f} s; "
                f"logs in {self._plan.log_dir}")

    def _settled(self) -> bool:
        """Whether the failure heard of may end the job now (``SETTLE``)."""
        now = time.monotonic()
        self._failed_since = self._failed_since or now
        heard = {e.spec.host for e in self._ended} | {
            r.cause.host for r in self._failed_results() if r.cause}
        return now - self._failed_since >= SETTLE or set(self._plan.hosts) <= heard

    def _failed_results(self) -> list[JobResult]:
        with self._lock:
            return [r for r in self._results if r.failed]

    def _line_sink(self, agent: ProcessSpec) -> Callable[[bytes], None]:
        agent_sink = self._console.sink(agent.label, self._plan.restart)

        def sink(line: bytes) -> None:
            if line.startswith(control.MARK):  # an agent's own; a rank's lines start "[host:rank]"
                if self._admission.set_up(agent.label):
                    self._wake.set()  # the next agent may connect
                self._on_control(control.decode(line))  # garbled: dropped, like a bad event
                return
            match = _RANK_PREFIX.match(line)
            if match is None:
                agent_sink(line)  # the agent's own words (a Python error, ssh refusing...)
                return
            rank = int(match.group(2))
            self._logs.write(rank, line[match.end():])
            if self._filter.shows(rank):
                self._console.rank_line(match.group(1).decode(errors="replace"), rank,
                                        line[match.end():], self._plan.restart)
        return sink

    def _on_control(self, message: Optional[control.Message]) -> None:
        if isinstance(message, Event):
            self._reporter.event(message)
        elif isinstance(message, JobResult):
            with self._lock:
                self._results.append(message)
            self._wake.set()
        elif isinstance(message, control.NodeDone):
            self._nodes_done.add(message.node_rank)
            self._wake.set()
        elif isinstance(message, control.LastWords):
            with self._answered:
                self._answers[message.rank] = message.answer
                self._answered.notify_all()

    def failed_hosts(self) -> set[str]:
        """Hosts whose agent reported a failure or ended: their ranks are stopped."""
        with self._lock:
            failed = {r.cause.host for r in self._results if r.failed and r.cause and r.cause.host}
        return failed | {e.spec.host for e in self._ended}

    def deaf_nodes(self) -> set[int]:
        """Node ranks whose agent does not read node 0's stdin: it cannot be asked anything."""
        heard = [a.stdin_nodes for a in self._agents]
        if any(nodes is None for nodes in heard):
            return set()
        return set(range(self._plan.nnodes)) - {n for nodes in heard for n in nodes or ()}

    def answer_of(self, rank: int, wait: float) -> str:
        """``rank``'s last words as its agent relayed them; ``""`` when none came in ``wait`` s."""
        with self._answered:
            self._answered.wait_for(lambda: rank in self._answers, wait)
            return self._answers.pop(rank, "")


@dataclasses.dataclass(frozen=True)
class AskThroughAgents:
    """Last words in a job of node agents (``launcher.run.last_words.Asker``): the request goes
    down every agent's stdin, the rank's agent asks it and relays its answer."""

    plan: LaunchPlan
    agents: NodeAgents

    def lost(self, ranks: Mapping[int, ProcessSpec]) -> set[int]:
        """The ranks of hosts whose agent reported a failure or ended: it stopped them."""
        failed = self.agents.failed_hosts()
        return {r for r, spec in ranks.items() if spec.host in failed}

    def unreachable(self, ranks: Mapping[int, ProcessSpec]) -> tuple[set[int], str]:
        deaf = self.agents.deaf_nodes()
        return ({r for r, spec in ranks.items() if spec.node_rank in deaf},
                "mpirun passes node 0's requests to the first host's agent only")

    def ask(self, group: ProcessGroup, rank: int, spec: ProcessSpec, since: float,
            wait: float) -> str:
        started = time.monotonic()
        group.send(control.words_line(rank, self.plan.restart, time.time() - since))
        return self.agents.answer_of(rank, wait - (time.monotonic() - started))


def run_agents(plan: LaunchPlan, agents: list[AgentLaunch], console_filter: ConsoleFilter,
               base_env: Mapping[str, str], console: Console, reporter: Reporter,
               on_stop: Optional[Callable[[Callable[[bytes], None]], StopHook]] = None,
               on_fault: Optional[Callable[[Asker], FaultHook]] = None) -> JobResult:
    """Run the job's node agents from here until the job ends everywhere. ``on_stop``: given
    how to write to every agent's stdin, what a stop signal does first; ``on_fault``: given
    how to ask a rank through its agent, what a failure or a hang does first (``Watch``)."""
    group = ProcessGroup(plan.token, base_env, plan.workdir)
    source = NodeAgents(plan, agents, console_filter, console, reporter)
    hook = on_stop(group.send) if on_stop is not None else None
    fault = on_fault(AskThroughAgents(plan, source)) if on_fault is not None else None
    return Watch(plan, source, group, reporter.tick, on_stop=hook, on_fault=fault,
                 exits_overdue=reporter.exits_overdue).run()


def _agent_failure(exit_: Exit, job_id: str) -> JobResult:
    """An agent that died without a result: it never started, or its connection broke."""
    lines = [f"npu-launch: job {job_id} failed: the agent for {exit_.spec.host} "
             f"(pid {exit_.pid}) exited with code {exit_.returncode} without a result",
             *last_lines_block(exit_.spec.log_path, 10)]
    cause = Cause(Outcome.FAILED, "agent", host=exit_.spec.host, pid=exit_.pid,
                  returncode=exit_.returncode, time=exit_.time)
    return JobResult(Outcome.FAILED, exit_code_of(exit_.returncode) or 1, "\n".join(lines),
                     time.time(), cause)
