"""Node 0's view of its agents (``launcher.cluster.node_agents.NodeAgents``), in this process:
the agents' control lines are fed by hand through the sinks node 0 gives them, and nothing is
started. What is proven is which failure ends the job, and when."""
from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional, cast

from launcher.cluster import control
from launcher.cluster.node_agents import SETTLE, AgentLaunch, NodeAgents
from launcher.config.launch_config import ConsoleFilter
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec, Role
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.output import Console
from launcher.run.process import ProcessGroup

HOSTS = ("node-a", "node-b")


class Started:
    """A process group that starts nothing and keeps the line sink each agent was given."""

    def __init__(self) -> None:
        self.sinks: dict[str, Callable[[bytes], None]] = {}

    def start(self, spec: ProcessSpec, sink: Callable[[bytes], None],
              stdin: Optional[bytes] = None) -> None:
        self.sinks[spec.host] = sink


class Quiet:
    def event(self, event) -> None:
        pass

    def ranks_done(self, node_rank: int) -> None:
        pass

    def tick(self) -> None:
        return None


def agents(tmp_path: Path) -> tuple[NodeAgents, Started]:
    plan = cast(LaunchPlan, SimpleNamespace(job_id="j", hosts=HOSTS, nnodes=2, world_size=2,
                                            restart=0, log_dir=str(tmp_path)))
    launches = [AgentLaunch(ProcessSpec(Role.AGENT, None, host, n, None, None,
                                        str(tmp_path / f"{host}.log"), {}, ("agent",)),
                            None, fanout=2) for n, host in enumerate(HOSTS)]
    node0 = NodeAgents(plan, launches, ConsoleFilter(), Console(io.BytesIO()), Quiet())
    group = Started()
    node0.start(cast(ProcessGroup, group), threading.Event())
    assert group.sinks.keys() == set(HOSTS)
    return node0, group


def failed(rank: int, host: str, at: float) -> bytes:
    cause = Cause(Outcome.FAILED, "rank", rank=rank, host=host, time=at, exception="RuntimeError")
    return control.result_line(JobResult(Outcome.FAILED, 1, f"rank {rank} failed", at, cause))


def test_a_victims_report_that_arrives_first_does_not_hide_the_culprit(tmp_path: Path) -> None:
    """Rank 1 died at t; rank 0 (another host) lost its peer and failed 0.05 s later, and its
    node's report reached node 0 first. Node 0 waits for the other node's report, and the
    culprit is the cause."""
    node0, group = agents(tmp_path)
    t = time.time()
    group.sinks["node-a"](failed(0, "node-a", t + 0.05))
    assert node0.check(cast(ProcessGroup, group), []) is None, "the other node may yet report"
    group.sinks["node-b"](failed(1, "node-b", t))
    assert node0.check(cast(ProcessGroup, group), []) is Outcome.FAILED, "every node reported"
    cause = node0.conclude(Outcome.FAILED).cause
    assert cause is not None and (cause.rank, cause.host) == (1, "node-b")


def test_a_failure_alone_ends_the_job_once_the_others_had_their_moment(tmp_path: Path) -> None:
    node0, group = agents(tmp_path)
    group.sinks["node-b"](failed(1, "node-b", time.time()))
    began = time.monotonic()
    while node0.check(cast(ProcessGroup, group), []) is None:
        assert time.monotonic() - began < 60, "never ended"
        time.sleep(0.01)
    assert time.monotonic() - began >= SETTLE
    cause = node0.conclude(Outcome.FAILED).cause
    assert cause is not None and cause.rank == 1


def test_words_lines_carry_an_age_and_refuse_what_is_not_one() -> None:
    line = control.words_line(0, 2, 1.25)
    assert line == b"words 0 2 1.250\n"
    assert control.words_request(line.rstrip(b"\n")) == control.WordsRequest(0, 2, 1.25)
    assert control.words_line(3, 0, -5.0) == b"words 3 0 0.000\n", "a clock step back is no age"
    for bad in (b"words 0 2", b"words -1 2 1", b"words 0 x 1", b"words 0 2 nan", b"words 0 2 inf",
                b"words 0 2 1e12", b"words " + b"9" * 40 + b" 0 1", b"save 3", b"finish"):
        assert control.words_request(bad) is None, bad


def test_a_relayed_answer_reaches_the_asker_and_hosts_that_failed_are_not_asked(
        tmp_path: Path) -> None:
    node0, group = agents(tmp_path)
    group.sinks["node-b"](failed(1, "node-b", time.time()))
    assert node0.failed_hosts() == {"node-b"}
    assert node0.answer_of(0, 0.05) == "", "nothing relayed yet"
    threading.Timer(0.1, group.sinks["node-a"],
                    [control.last_words_line(0, "saved 50")]).start()
    assert node0.answer_of(0, 10.0) == "saved 50"
    group.sinks["node-a"](control.encode(control.LAST_WORDS, {"rank": 0, "answer": ["saved"]}))
    assert node0.answer_of(0, 0.05) == "", "a garbled answer is dropped"


def test_only_the_first_agent_of_mpirun_can_be_asked(tmp_path: Path) -> None:
    node0, _ = agents(tmp_path)
    assert node0.deaf_nodes() == set(), "ssh: every agent reads its stdin"
    plan = cast(LaunchPlan, SimpleNamespace(job_id="j", hosts=HOSTS, nnodes=2, world_size=2,
                                            restart=0, log_dir=str(tmp_path)))
    mpirun = AgentLaunch(ProcessSpec(Role.AGENT, None, "mpirun", 0, None, None,
                                     str(tmp_path / "mpirun.log"), {}, ("mpirun",)),
                         None, stdin_nodes=frozenset({0}))
    one = NodeAgents(plan, [mpirun], ConsoleFilter(), Console(io.BytesIO()), Quiet())
    assert one.deaf_nodes() == {1}
