"""How agents send node 0 the checkpoint files it collects (``launcher.cluster.collect``): which ranks
the plan names, how an agent knows it shares the launcher's storage, and the sending thread.

Real files, real sockets on loopback and a real ledger behind a real payload server; the
multi-node test (tests/multinode/test_collect_private.py) runs it all between private-disk
hosts.
"""
from __future__ import annotations

import hashlib
import io
import json
import socket
import threading
import time
from pathlib import Path
from typing import Optional

import pytest
from helpers import run_launcher

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.checkpoints.uploads import Upload
from launcher.cluster import control
from launcher.cluster.agent import ControlReporter, NodeZero, _uploader
from launcher.cluster.collect import STORAGE_MARKER, Uploader, launcher_node, mark_storage, shares_storage, upload_of
from launcher.cluster.payload import serving
from launcher.config.devices import Card, DeviceKind
from launcher.config.launch_config import LaunchConfig
from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan, Node
from launcher.plan.planner import PlanInputs, build_plan
from launcher.run.output import Console
from parallel.contract import Event


def _checkpoint(rank: int, step: int, path: Path, data: bytes) -> Event:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    event = Event.parse({"event": "checkpoint", "rank": rank, "host": "h", "time": 1.0,
                         "step": step, "path": str(path), "name": path.name, "size": len(data),
                         "sha256": hashlib.sha256(data).hexdigest(), "world_size": 2,
                         "position": {"epoch": 0, "batch_in_epoch": step, "global_step": step}})
    assert event is not None
    return event


# Which ranks the plan collects ------------------------------------------------------------

def _plan(tmp: Path, *, replicated: bool, here: Optional[int], agents: bool = True,
          collect: bool = True) -> LaunchPlan:
    script = tmp / "train.py"
    script.write_text("")
    config = LaunchConfig(script=str(script), python="/usr/bin/python3", workdir=str(tmp),
                          checkpoint_collect=collect)
    cards = (Card(0, 0), Card(1, 1))
    nodes = (Node("a", 0, cards), Node("b", 1, cards), Node("c", 2, cards))
    return build_plan(config, PlanInputs(
        job_id="j", log_dir=str(tmp / "logs"), master_addr="10.0.0.1", master_port=29500,
        device=DeviceKind.CPU, nodes=nodes, agents=agents, replicated=replicated,
        launcher_node=here, token="7" * 32))


def test_a_sliced_layout_collects_every_rank_not_on_the_launchers_host(tmp_path: Path) -> None:
    plan = _plan(tmp_path, replicated=False, here=0)
    assert plan.collect_ranks == (2, 3, 4, 5)
    assert _plan(tmp_path, replicated=False, here=1).collect_ranks == (0, 1, 4, 5)
    assert _plan(tmp_path, replicated=False, here=None).collect_ranks == (0, 1, 2, 3, 4, 5)
    assert LaunchPlan.from_json(plan.to_json()) == plan  # agents get it with the plan


def test_data_parallelism_collects_one_replica_only_when_node_0_runs_no_rank(
        tmp_path: Path) -> None:
    assert _plan(tmp_path, replicated=True, here=0).collect_ranks == ()
    assert _plan(tmp_path, replicated=True, here=2).collect_ranks == ()
    plan = _plan(tmp_path, replicated=True, here=None)
    assert plan.collect_ranks == (0,)
    assert LaunchPlan.from_json(plan.to_json()).collect_ranks == (0,)


def test_collect_off_and_jobs_without_agents_collect_nothing(tmp_path: Path) -> None:
    assert _plan(tmp_path, replicated=False, here=0, collect=False).collect_ranks == ()
    assert _plan(tmp_path, replicated=True, here=None, collect=False).collect_ranks == ()
    assert _plan(tmp_path, replicated=False, here=0, agents=False).collect_ranks == ()


@pytest.mark.parametrize("config, layout, want", [
    ("", ["--parallel", "semi", "--mp", "2"], [0]),
    ("", [], []),  # data parallelism, and this host runs rank 1: its file is a replica
    ("checkpoint-collect: false\n", ["--parallel", "semi", "--mp", "2"], []),
])
def test_the_dry_run_plan_names_the_ranks_node_0_collects(weird_tmp: Path, config: str,
                                                          layout: list, want: list) -> None:
    # 192.0.2.1 (TEST-NET-1) runs rank 0; 127.0.0.1, this host, rank 1.
    (weird_tmp / "hosts").write_text("192.0.2.1 slots=1\n127.0.0.1 slots=1\n")
    (weird_tmp / "job.yaml").write_text(config)
    (weird_tmp / "train.py").write_text("")
    result = run_launcher("--hostfile", "hosts", "--no-preflight", "--device", "cpu",
                          "--config", "job.yaml", *layout, "--dry-run", "--json", "train.py",
                          cwd=weird_tmp)
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert plan["replicated"] is (not layout) and plan["collect_ranks"] == want


def test_the_launchers_host_is_found_by_its_name_or_an_address_of_its_own() -> None:
    assert launcher_node(["no-such-host.invalid", socket.gethostname()]) == 1
    assert launcher_node(["no-such-host.invalid", "127.0.0.1"]) == 1
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): an address no host here has.
    assert launcher_node(["no-such-host.invalid", "192.0.2.1"]) is None


# Shared storage ---------------------------------------------------------------------------

def test_an_agent_shares_storage_only_where_it_reads_this_launchs_token(tmp_path: Path) -> None:
    token = "f" * 32
    assert not shares_storage(str(tmp_path), token)  # no marker: a host of its own
    mark_storage(str(tmp_path), token)
    assert (tmp_path / STORAGE_MARKER).read_text() == token
    assert shares_storage(str(tmp_path), token)
    assert not shares_storage(str(tmp_path), "e" * 32)  # an earlier launch's log dir
    assert not shares_storage(str(tmp_path), token[:-1])
    assert not shares_storage(str(tmp_path), "")


def test_an_agent_on_shared_storage_sends_nothing_and_says_so_in_one_line(tmp_path: Path) -> None:
    plan = _plan(tmp_path, replicated=False, here=0)
    collected: list = []
    ledger = CheckpointLedger(plan.log_dir, plan.world_size, False, plan.collect_ranks,
                              lambda size, seconds: collected.append(size))
    out = io.BytesIO()
    with serving(b"", "127.0.0.1", receiver=ledger) as server:
        node0 = NodeZero(server.address, server.key)
        uploader = _uploader(plan, plan.on_node(1), node0, Console(out))
        uploader.offer(_checkpoint(2, 5, tmp_path / "r2", b"two"))
        uploader.close(None)
        assert out.getvalue() == b"" and collected == [3]  # a host of its own: it sends

        mark_storage(plan.log_dir, plan.token)
        uploader = _uploader(plan, plan.on_node(1), node0, Console(out))
        uploader.offer(_checkpoint(2, 6, tmp_path / "r2", b"two"))
        uploader.close(None)
    assert collected == [3] and ledger.collected_steps() == [5]
    assert out.getvalue() == (b"checkpoints: this host sees the launcher's log directory (shared "
                              b"storage): its ranks' files stay where they are, none is sent to "
                              b"node 0\n")
    out.truncate(0)
    out.seek(0)
    _uploader(plan, plan.on_node(0), node0, Console(out))  # node 0's own ranks: nothing to say
    assert out.getvalue() == b""


# The sending thread -----------------------------------------------------------------------

def test_the_agent_sends_its_ranks_files_to_node_0s_ledger(tmp_path: Path) -> None:
    collected: list = []
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=False,
                              collect=(1,), on_collected=lambda size, s: collected.append(size))
    with serving(b"", "127.0.0.1", receiver=ledger) as server:
        said: list = []
        uploader = Uploader(NodeZero(server.address, server.key).upload, frozenset({1}),
                            said.append)
        uploader.offer(_checkpoint(1, 7, tmp_path / "b" / "rank 1.ckpt", b"slice one"))
        uploader.offer(_checkpoint(0, 7, tmp_path / "a" / "rank_0.ckpt", b"slice zero"))
        uploader.close(None)
    assert said == [] and collected == [9]
    # "rank 1.ckpt" is no name a request carries (it has a space): node 0 names it.
    assert (tmp_path / "logs" / "checkpoint_ledger" / "step_7" / "rank_1" / "rank_1"
            ).read_bytes() == b"slice one"
    assert ledger.collected_steps() == [7]


def test_a_rank_is_never_held_up_and_only_its_newest_file_waits(tmp_path: Path) -> None:
    sending = threading.Event()
    release = threading.Event()
    sent: list[int] = []

    def slow(upload: Upload, path: str) -> None:
        sending.set()
        release.wait(10)
        sent.append(upload.step)

    uploader = Uploader(slow, frozenset({1}), lambda line: None)
    uploader.offer(_checkpoint(1, 1, tmp_path / "s1", b"x"))
    assert sending.wait(10), "step 1 is being sent"
    started = time.monotonic()
    for step in range(2, 6):
        uploader.offer(_checkpoint(1, step, tmp_path / f"s{step}", b"x"))
    assert time.monotonic() - started < 1.0  # offering never waits for a send
    release.set()
    uploader.close(None)
    assert sent == [1, 5]  # 2-4 were overtaken by 5 while 1 went


def test_what_cannot_be_sent_is_said_on_the_agents_console_and_the_rest_goes_on(
        tmp_path: Path) -> None:
    said: list = []
    sent: list = []

    def send(upload: Upload, path: str) -> None:
        if upload.rank == 1:
            raise LaunchError("the launcher at tcp://x:1 did not take it")
        sent.append(upload.rank)

    uploader = Uploader(send, frozenset({1, 2}), said.append)
    uploader.offer(_checkpoint(1, 4, tmp_path / "one", b"1"))
    uploader.offer(_checkpoint(2, 4, tmp_path / "two", b"2"))
    uploader.close(None)
    assert said == ["checkpoints: rank 1's file of step 4 was not sent to node 0: the launcher "
                    "at tcp://x:1 did not take it"]
    assert sent == [2]


def test_close_waits_no_longer_than_it_is_told(tmp_path: Path) -> None:
    stuck = threading.Event()
    uploader = Uploader(lambda upload, path: stuck.wait(30), frozenset({1}), lambda line: None)
    uploader.offer(_checkpoint(1, 1, tmp_path / "f", b"x"))
    started = time.monotonic()
    uploader.close(0.3)
    assert time.monotonic() - started < 2.0
    uploader.offer(_checkpoint(1, 2, tmp_path / "g", b"x"))  # closed: nothing more is queued
    stuck.set()


@pytest.mark.parametrize("record", [
    {"event": "checkpoint", "rank": 1, "step": 3, "path": "/x/rank_1.ckpt"},   # no size, sha
    {"event": "checkpoint", "rank": 1, "step": 3, "path": "rank_1.ckpt", "name": "rank_1.ckpt",
     "size": 1, "sha256": "0" * 64,
     "position": {"epoch": 0, "batch_in_epoch": 3, "global_step": 3}},       # a relative path
])
def test_an_event_that_describes_no_file_is_not_sent(record: dict) -> None:
    event = Event.parse(record)
    assert event is not None and upload_of(event) is None


def test_the_agent_offers_each_event_it_forwards_after_the_control_line(tmp_path: Path) -> None:
    sent: list = []
    out = io.BytesIO()
    uploader = Uploader(lambda upload, path: sent.append((upload.rank, upload.step, path)),
                        frozenset({1}), lambda line: None)
    reporter = ControlReporter(Console(out), uploader)
    event = _checkpoint(1, 9, tmp_path / "b" / "slice.bin", b"nine")
    reporter.event(event)
    uploader.close(None)
    assert out.getvalue().startswith(control.MARK) and b'"checkpoint"' in out.getvalue()
    assert sent == [(1, 9, str(tmp_path / "b" / "slice.bin"))]
