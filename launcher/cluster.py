"""Node 0 of a multi-node job: start the node agents, show their lines, end the job as one.

The agents (``launcher.agent``) supervise their own ranks. Node 0 watches the agent processes
(ssh clients, or one srun/mpirun): the first agent that reports a failed job, or exits
non-zero, ends the job everywhere; so does SIGINT/SIGTERM/SIGHUP here. Stopping an agent means
closing its stdin (ssh) or signalling srun/mpirun, which pass the signal on; every agent then
stops its ranks and kills what is left of the job id on its host.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from typing import Any, Callable, Mapping, Optional

from launcher import control
from parallel import contract
from launcher.config import ConsoleFilter
from launcher.failures import Outcome, last_lines_block
from launcher.stalls import Stall, describe_stall
from launcher.output import Console
from launcher.plan import LaunchPlan, ProcessSpec
from launcher.process import Exit, ProcessGroup
from launcher.supervisor import JobResult, restore_signal_handlers, STOP_SIGNALS

_TICK = 0.02
_RANK_PREFIX = re.compile(rb"^\[([^\]\s]+):(\d+)\] ")
_FAILED = {Outcome.FAILED.value, Outcome.STARTUP_TIMEOUT.value, Outcome.STALLED.value}


@dataclasses.dataclass(frozen=True)
class AgentLaunch:
    """One process node 0 starts: an ssh client for one host, or one srun/mpirun for all."""

    spec: ProcessSpec
    stdin: Optional[bytes]


class StreamedLogs:
    """Node 0's copy of every rank's log, written from the lines the agents stream back."""

    def __init__(self, log_dir: str) -> None:
        self._log_dir = log_dir
        self._files: dict[int, Any] = {}
        self._lock = threading.Lock()

    def write(self, rank: int, line: bytes) -> None:
        with self._lock:
            f = self._files.get(rank)
            if f is None:
                f = self._files[rank] = open(
                    os.path.join(self._log_dir, f"rank_{rank}.log"), "ab", buffering=0)
            f.write(line + b"\n")

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()


class ClusterSupervisor:
    """Runs the agents of ``plan`` and returns one ``JobResult`` for the whole job."""

    def __init__(self, plan: LaunchPlan, agents: list[AgentLaunch], kill_timeout: float,
                 console_filter: ConsoleFilter, base_env: Mapping[str, str], console: Console,
                 on_event: Optional[Callable[[dict], None]] = None,
                 stall_check: Optional[Callable[[], Optional[Stall]]] = None) -> None:
        self._plan = plan
        self._agents = agents
        self._kill_timeout = kill_timeout
        self._filter = console_filter
        self._base_env = base_env
        self._console = console
        self._on_event = on_event
        self._stall_check = stall_check
        self._stall: Optional[Stall] = None
        self._logs = StreamedLogs(plan.log_dir)
        self._results: list[dict[str, Any]] = []
        self._nodes_done: set[int] = set()
        self._lock = threading.Lock()
        self._signal: Optional[int] = None
        self._wake = threading.Event()

    def run(self) -> JobResult:
        started = time.time()
        group = ProcessGroup(self._plan.token, self._base_env, self._plan.workdir)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            for agent in self._agents:
                group.start(agent.spec, self._line_sink(agent.spec), agent.stdin)
            outcome, ended = self._watch(group)
        finally:
            ended_at_close = group.close(self._kill_timeout)
            restore_signal_handlers(previous)
            self._logs.close()
        return self._result(outcome, tuple(ended) + tuple(ended_at_close), started)

    def _watch(self, group: ProcessGroup) -> tuple[Outcome, list[Exit]]:
        ended: list[Exit] = []
        finish_sent = False
        while True:
            if self._signal is not None:
                return Outcome.INTERRUPTED, ended
            ended += group.poll()
            if not finish_sent and len(self._nodes_done) == self._plan.nnodes:
                group.send(control.FINISH)
                finish_sent = True
            if self._failed_results() or any(not e.ok for e in ended):
                return Outcome.FAILED, ended
            if self._stall_check is not None and (stall := self._stall_check()) is not None:
                self._stall = stall
                return Outcome.STALLED, ended
            if len(ended) == len(self._agents):
                return Outcome.SUCCEEDED, ended
            self._wake.wait(_TICK)
            self._wake.clear()

    def _failed_results(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self._results if r.get("outcome") in _FAILED]

    def _line_sink(self, agent: ProcessSpec) -> Callable[[bytes], None]:
        agent_sink = self._console.sink(agent.label)

        def sink(line: bytes) -> None:
            record = control.decode(line)
            if record is not None:
                self._on_control(record)
                return
            match = _RANK_PREFIX.match(line)
            if match is None:
                agent_sink(line)  # the agent's own words (a Python error, ssh refusing...)
                return
            rank = int(match.group(2))
            self._logs.write(rank, line[match.end():])
            if self._filter.shows(rank):
                self._console.write_line(b"", line)
        return sink

    def _on_control(self, record: dict[str, Any]) -> None:
        if record.get("type") == control.RESULT:
            with self._lock:
                self._results.append(record)
            self._wake.set()
        elif record.get("type") == control.EVENT:
            record = {k: v for k, v in record.items() if k != "type"}
            if record.get("event") == contract.EVENT_NODE_DONE:
                self._nodes_done.add(int(record.get("node_rank", -1)))
                self._wake.set()
            elif self._on_event is not None:
                self._on_event(record)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self._signal is None:
            self._signal = signum
        self._wake.set()

    def _result(self, outcome: Outcome, exits: tuple[Exit, ...], started: float) -> JobResult:
        job = self._plan.job_id
        failed = sorted(self._failed_results(), key=lambda r: r.get("cause_time") or 0)
        bad_exits = [e for e in exits if not e.ok]
        if outcome is Outcome.INTERRUPTED:
            code = 128 + (self._signal or 0)
            message = (f"npu-launch: job {job} stopped by {signal.Signals(code - 128).name}: "
                       f"every node's processes ended")
        elif self._stall is not None:
            code, message = 1, describe_stall(self._stall, job)
        elif failed:
            code, message = int(failed[0]["exit_code"]), str(failed[0]["message"])
        elif outcome is Outcome.FAILED and bad_exits:
            code, message = _agent_failure(bad_exits[0], job)
        else:
            code = 0
            message = (f"npu-launch: job {job} finished: {self._plan.world_size} rank(s) on "
                       f"{self._plan.nnodes} node(s) exited 0 in {time.time() - started:.1f} s; "
                       f"logs in {self._plan.log_dir}")
        return JobResult(outcome, code, None, message, time.time())


def _agent_failure(exit_: Exit, job_id: str) -> tuple[int, str]:
    """An agent that died without a result: it never started, or its connection broke."""
    code = 128 - exit_.returncode if exit_.returncode < 0 else exit_.returncode
    lines = [f"npu-launch: job {job_id} failed: the agent for {exit_.spec.host} "
             f"(pid {exit_.pid}) exited with code {exit_.returncode} without a result",
             *last_lines_block(exit_.spec.log_path, 10)]
    return code or 1, "\n".join(lines)
