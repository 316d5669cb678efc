"""Bounded fan-out (``--fanout``), with real processes and no network: at most K agents
connecting at once, an agent's stdin fed from a thread of its own, and the option's bounds.

The same over real ssh, on hosts of their own, is tests/multinode/test_fanout_hosts.py.
"""
from __future__ import annotations

import hashlib
import io
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

import pytest
from helpers import assert_one_line_error, run_cli_here, run_launcher, wait_for

from launcher.cluster.backends.common import agent_spec
from launcher.cluster.fanout import Admission, open_files_needed, raise_open_files, workers
from launcher.cluster.node_agents import AgentLaunch, run_agents
from launcher.config.devices import Card, DeviceKind
from launcher.config.launch_config import ConsoleFilter, LaunchConfig
from launcher.hangs.stalls import Stall
from launcher.plan.launch_plan import LaunchPlan, Node, ProcessSpec, Role
from launcher.plan.planner import PlanInputs, build_plan
from launcher.run.events import prepare_dirs
from launcher.run.failures import Outcome
from launcher.run.output import Console
from launcher.run.process import ProcessGroup
from parallel.contract import Event

PIPE_BYTES = 1 << 20
"""Far more than a pipe holds (64 KiB), as the whole plan is at some hundred ranks."""

# A node agent stand-in: marks when it began and when it said it runs, then behaves as told.
AGENT = """
import os, sys, time
from launcher.cluster import control
log, node, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def mark(word):
    with open(log, "a") as f:  # one short O_APPEND write per line: lines never mix
        f.write(f"{word} {node} {time.time()}\\n")

mark("start")
if mode == "exit":  # ends before its first line: it connects no more
    mark("end")
    sys.exit(0)
time.sleep(0.2)  # widens the window in which it counts as connecting
mark("up")
out = sys.stdout.buffer
out.write(control.agent_up_line() + b"\\n")
out.write(control.node_done_line(node) + b"\\n")
out.flush()
seen = b""
while control.FINISH not in seen:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    seen += chunk
"""

# Reads nothing until told (a file appears), then its stdin up to "finish", whose sha256 it
# records, then waits for the end of its stdin.
LATE_READER = """
import hashlib, os, sys, time
go, read_mark, out = sys.argv[1:4]
for _ in range(6000):  # 60 s at most: a starter that waits for this read shows as a failure
    if os.path.exists(go):
        break
    time.sleep(0.01)
open(read_mark, "w").close()
data = b""
while not data.endswith(b"finish\\n") and (chunk := os.read(0, 65536)):
    data += chunk
with open(out + ".tmp", "w") as f:
    f.write(f"{len(data)} {hashlib.sha256(data).hexdigest()}")
os.rename(out + ".tmp", out)
while os.read(0, 65536):
    pass
"""


class _Quiet:
    """Node 0's reporter, keeping nothing."""

    def event(self, event: Event) -> None:
        pass

    def ranks_done(self, node_rank: int) -> None:
        pass

    def tick(self) -> Optional[Stall]:
        return None

    def exits_overdue(self) -> bool:
        return False


def _spec(tmp: Path, name: str, argv: list[str]) -> ProcessSpec:
    return ProcessSpec(role=Role.AGENT, rank=None, host=name, node_rank=0, local_rank=None,
                       device_id=None, log_path=str(tmp / f"{name}.log"), env={},
                       argv=tuple(argv))


def _plan(tmp: Path, hosts: int) -> LaunchPlan:
    script = tmp / "train.py"
    script.write_text("")
    config = LaunchConfig(script=str(script), python=sys.executable, workdir=str(tmp))
    nodes = tuple(Node(f"h{i}", i, (Card(0, 0),)) for i in range(hosts))
    return build_plan(config, PlanInputs(job_id="j", log_dir=str(tmp / "logs"),
                                         master_addr="127.0.0.1", master_port=29500,
                                         device=DeviceKind.CPU, nodes=nodes, agents=True,
                                         token="7" * 32))


def _run_agents(tmp: Path, hosts: int, fanout: int, modes: list[str]) -> tuple[Outcome, Path]:
    script, log = tmp / "agent.py", tmp / "marks.txt"
    script.write_text(AGENT)
    plan = _plan(tmp, hosts)
    agents = [AgentLaunch(agent_spec(plan, f"h{i}", i, [sys.executable, str(script), str(log),
                                                         str(i), modes[i]]), b"plan\n", fanout)
              for i in range(hosts)]
    prepare_dirs(plan.log_dir, [p for a in agents for p in a.spec.files])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = run_agents(plan, agents, ConsoleFilter(), env, Console(io.BytesIO()), _Quiet())
    return result.outcome, log


def _most_at_once(log: Path) -> int:
    """The most agents between their ``start`` and ``up`` marks at any moment."""
    marks = [line.split() for line in log.read_text().splitlines()]
    began = {node: float(t) for word, node, t in marks if word == "start"}
    up = {node: float(t) for word, node, t in marks if word == "up"}
    return max(sum(began[other] <= began[node] < up[other] for other in up) for node in up)


# ------------------------------------------------------------------ agents: at most K connecting
@pytest.mark.parametrize("fanout", [1, 2])
def test_no_more_than_fanout_agents_connect_at_once(tmp_path: Path, fanout: int) -> None:
    outcome, log = _run_agents(tmp_path, 6, fanout, ["up"] * 6)
    assert outcome is Outcome.SUCCEEDED
    assert {line.split()[1] for line in log.read_text().splitlines()} == {str(i) for i in range(6)}
    assert 1 <= _most_at_once(log) <= fanout, log.read_text()


def test_an_agent_that_exits_before_its_first_line_lets_the_next_start(tmp_path: Path) -> None:
    outcome, log = _run_agents(tmp_path, 4, 1, ["exit"] * 4)
    assert outcome is Outcome.SUCCEEDED
    marks = [line.split() for line in log.read_text().splitlines()]
    assert [(word, node) for word, node, _ in marks] == [
        (word, str(node)) for node in range(4) for word in ("start", "end")]  # one at a time


def test_admission_counts_what_sets_up() -> None:
    admission = Admission(["a", "b", "c", "d"], key=str, bound=2)
    assert admission.due() == ["a", "b"] and admission.due() == []
    assert admission.set_up("a") and not admission.set_up("a")  # counted once
    assert admission.due() == ["c"]
    assert admission.ended("b") and admission.due() == ["d"]
    assert admission.waiting == 0 and admission.setting_up == 2
    with pytest.raises(ValueError):
        Admission([], key=str, bound=0)


def test_short_commands_run_at_most_fanout_at_once() -> None:
    assert workers(32, 64) == 32 and workers(32, 3) == 3 and workers(8, 0) == 1


def test_node_0_may_hold_a_descriptor_per_pipe_and_log_of_every_agent() -> None:
    needed = open_files_needed(agents=1024, ranks=1024 * 16)
    assert needed >= 1024 * 4 + 1024 * 15
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = raise_open_files(64)  # never lowers the limit
    assert soft >= 64 or soft == -1
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == before, "a limit above the need stays"
    # Raised, in a process of its own whose soft limit starts low: to the need, within the hard.
    code = ("import resource; from launcher.cluster.fanout import raise_open_files\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))\n"
            "got = raise_open_files(1000)\n"
            "print(got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got, now, hard = (int(word) for word in out.stdout.split())
    want = 1000 if hard == resource.RLIM_INFINITY else min(1000, hard)
    assert got == now == want, out.stdout


# ------------------------------------------------------------------ an agent's stdin
def test_a_payload_larger_than_a_pipe_does_not_hold_up_the_start(tmp_path: Path) -> None:
    script, go, read, out = (tmp_path / n for n in ("reader.py", "go", "read", "out.txt"))
    script.write_text(LATE_READER)
    payload = os.urandom(PIPE_BYTES)
    group = ProcessGroup("", dict(os.environ), str(tmp_path))
    spec = _spec(tmp_path, "late", [sys.executable, str(script), str(go), str(read), str(out)])
    try:
        group.start(spec, None, payload)
        # start returned while the process had read nothing: it did not wait for the read
        assert not read.exists()
        group.send(b"finish\n")
        go.touch()
        wait_for(out.exists, "the reader to have read everything before finish")
        # Once written, nothing waits: a large job's idle agents cost node 0 no thread for this.
        wait_for(lambda: "stdin late:agent" not in {t.name for t in threading.enumerate()},
                 "the thread writing its stdin to end")
    finally:
        closed = group.close(5.0)  # it exits at the end of its stdin
    data = payload + b"finish\n"
    assert out.read_text() == f"{len(data)} {hashlib.sha256(data).hexdigest()}"
    assert [e.returncode for e in closed] == [0]


def test_close_ends_the_pipe_of_a_process_that_never_reads(tmp_path: Path) -> None:
    group = ProcessGroup("", dict(os.environ), str(tmp_path))
    never = [sys.executable, "-c", "import time; time.sleep(600)"]
    group.start(_spec(tmp_path, "never", never), None, os.urandom(PIPE_BYTES))
    ended = group.close(1.0)  # the pipe ends unread; it sleeps on until the SIGTERM
    assert len(ended) == 1 and ended[0].returncode != 0
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "stdin never:agent"],
             "the thread feeding its stdin to end")


# ------------------------------------------------------------------ the option
@pytest.mark.parametrize("args, needles", [
    (["--fanout", "0"], ["--fanout 0: expected 1-1024 (ssh connections set up at once)"]),
    (["--fanout", "1025"], ["--fanout 1025: expected 1-1024"]),
    (["--fanout", str(10 ** 30)], ["--fanout 1000000000000000000000000000000: expected 1-1024"]),
    (["--fanout", "-3"], ["--fanout -3: expected 1-1024"]),
])
def test_a_fanout_out_of_range_is_refused_in_one_line(tmp_path: Path, args: list[str],
                                                      needles: list[str]) -> None:
    (tmp_path / "hosts").write_text("n1 slots=1\nn2 slots=1\n")
    (tmp_path / "train.py").write_text("")
    result = run_cli_here("--hostfile", "hosts", "--device", "cpu", *args, "train.py",
                          cwd=tmp_path)
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "npu_launch_logs").exists()


def test_fanout_without_a_hostfile_is_refused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    result = run_launcher("--device", "cpu", "--fanout", "4", "train.py", cwd=tmp_path)
    assert_one_line_error(result, "--fanout bounds the ssh connections to the hosts of a "
                          "--hostfile; none given")


def test_preflight_refuses_a_bad_fanout_too(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("n1 slots=1\n")
    result = run_launcher("preflight", "--hostfile", "hosts", "--fanout", "0", cwd=tmp_path)
    assert_one_line_error(result, "--fanout 0: expected 1-1024")


def test_fanout_from_a_config_file_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("n1 slots=1\n")
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text("hostfile: hosts\nfanout: 0\n")
    result = run_launcher("--config", "job.yaml", "--device", "cpu", "train.py", cwd=tmp_path)
    assert_one_line_error(result, "job.yaml:2: --fanout 0: expected 1-1024")
