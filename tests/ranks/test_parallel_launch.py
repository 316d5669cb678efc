"""Real CPU data-parallel runs through npu-launch: parallel.init() plus a sharded MindRecord reader
must end with bit-identical trainable parameters on every rank."""
from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers import REPO, assert_no_job_processes, job_pids, start_job, wait_for

from parallel import contract

SCRIPTS = REPO / "scripts"
DIGITS = 1797
BATCH = 32


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits as two MindRecord files, written by the real preparation script."""
    folder = tmp_path_factory.mktemp("digits data")
    out = folder / "digits set.mindrecord"
    subprocess.run([sys.executable, str(SCRIPTS / "prepare_data.py"), "digits", str(out),
                    "--files", "2"], check=True, capture_output=True, cwd=REPO)
    return Path(f"{out}0")


@pytest.mark.mindspore
def test_data_parallel_ranks_end_with_identical_parameters(digits, weird_tmp):
    """Two ranks. Four (on two cores, 27 s) added nothing of their own: the readers' shards for
    every layout up to 16 ranks are read with MindSpore's datasets in
    ``parallel/data/test_parallel_data.py``, and four ranks on two hosts train to one node's
    parameters in ``multinode/test_launch_ssh.py``."""
    cards = 2
    job, out = f"parallel-dp-{cards}", weird_tmp / "results"
    # With a restart allowed, the next attempt's spares stand by once the ranks trained a step
    # (``launcher.run.spares``); the job succeeds without them, and they end with it.
    proc = start_job(weird_tmp / "logs", job, str(SCRIPTS / "dp_mindrecord.py"), str(digits),
                     "--out", str(out), "--epochs", "1", "--batch", str(BATCH), cards=cards,
                     options=("--console", "none", "--max-restarts", "1"))
    seen: list[int] = []

    def standing() -> bool:
        seen[:] = _spares_of(job)
        return len(seen) == cards + 1 or proc.poll() is not None

    wait_for(standing, "a spare per rank and the scheduler, or the job's end")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert len(seen) == cards + 1, f"a spare per rank and the scheduler while the job ran: {seen}"
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(cards)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(rank, cards) for rank in range(cards)]
    assert {r["steps_per_epoch"] for r in ranks} == {DIGITS // cards // BATCH}
    assert len({r["first_batch"] for r in ranks}) == cards, "ranks must read different shards"
    assert len({r["initial_parameters"] for r in ranks}) == 1, "the common seed must give one init"
    assert len({r["parameters"] for r in ranks}) == 1, "trainable parameters differ between ranks"
    assert ranks[0]["parameters"] != ranks[0]["initial_parameters"]
    _assert_exiting_said_before_mindsporess_exit_handler(weird_tmp / "logs", cards)
    assert_no_job_processes(job)


def _spares_of(job: str) -> list[int]:
    """The warm spares of ``job`` standing by now (their environment names the framework)."""
    spares = []
    for pid in job_pids(job):
        try:
            if contract.SPARE in psutil.Process(pid).environ():
                spares.append(pid)
        except psutil.Error:
            pass
    return spares


def _assert_exiting_said_before_mindsporess_exit_handler(logs: Path, cards: int) -> None:
    """Each rank said ``exiting`` (clean) before MindSpore's own exit handler unregistered it
    from the scheduler: a fault in that handler (seen in CI) comes after the word that the
    script ended cleanly. MindSpore stamps its log lines in local time."""
    said = {}
    for rank in range(cards):
        records = [json.loads(line) for line in (logs / "events" / f"rank_{rank}.jsonl")
                   .read_text().splitlines() if '"exiting"' in line]
        assert [r["clean"] for r in records] == [True], records
        said[rank] = records[0]["time"]
    unregistered = {}
    for line in (logs / "scheduler.log").read_text().splitlines():
        found = re.search(r":(\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d)\.(\d{3})\.(\d{3}) .*Node (\d+) has "
                          r"unregistered", line)
        if found:
            stamp = datetime.datetime.strptime(found.group(1), "%Y-%m-%d-%H:%M:%S").timestamp()
            unregistered[int(found.group(4))] = stamp + int(found.group(2) + found.group(3)) / 1e6
    assert unregistered.keys() == said.keys(), unregistered
    assert all(said[rank] < unregistered[rank] for rank in said), (said, unregistered)
