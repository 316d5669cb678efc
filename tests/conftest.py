"""Shared fixtures: paths with spaces and quotes, running npu-launch for real, finding the
processes a job left behind (by the job id in their environment, as the launcher does)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
RANK_SCRIPTS = Path(__file__).resolve().parent / "rank_scripts"


@pytest.fixture
def weird_tmp(tmp_path: Path) -> Path:
    """A temporary folder whose path holds a space and both kinds of quote."""
    path = tmp_path / "dir with 'single' and \"double\" quotes"
    path.mkdir()
    return path


def npu_launch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli", *args]


def run_launcher(*args: str, cwd: Optional[Path] = None, env: Optional[dict] = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """Run npu-launch to the end; a generous timeout only guards the test run itself."""
    return subprocess.run(npu_launch_argv(*args), cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def job_pids(job_id: str) -> list[int]:
    """Processes whose environment carries ``NPU_LAUNCH_JOB_ID=job_id``."""
    pids = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("NPU_LAUNCH_JOB_ID") == job_id and proc.status() != "zombie":
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


def alive(pid: int) -> bool:
    """Running (a zombie, or a process gone while we looked, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def assert_no_job_processes(job_id: str, pids: tuple[int, ...] = ()) -> None:
    """Nothing of the job runs: neither by job id nor any pid seen while it ran."""
    left = job_pids(job_id)
    running = [p for p in pids if alive(p)]
    assert not left and not running, f"job {job_id} left processes: {left or running}"


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 120.0) -> object:
    """Poll until ``predicate`` is truthy; the timeout only keeps a broken test from hanging."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read_events(log_dir: Path, rank: int) -> list[dict]:
    path = log_dir / "events" / f"rank_{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def initialised(log_dir: Path, ranks: range) -> bool:
    return all(any(e["event"] == "initialised" for e in read_events(log_dir, r)) for r in ranks)
