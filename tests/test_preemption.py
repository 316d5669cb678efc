"""A save on preemption (issue 24, part 2): SIGTERM to npu-launch while the shared trainer
trains makes every rank finish its step, save the same step and exit within --kill-timeout;
the same command run again resumes from that step. Real MindSpore ranks where what is proven
is the trainer's save and resume; the step chosen, in this process."""
from __future__ import annotations

import io
import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, assert_no_job_processes, npu_launch_argv, run_launcher, wait_for
from launcher.launch import Attempt
from launcher.monitor import JobMonitor
from parallel.contract import Event

MAIN = str(REPO / "scripts" / "train_digits.py")


def _last_step(logs: Path) -> int:
    path = logs / "events" / "rank_0.jsonl"
    if not path.exists():
        return -1
    steps = [json.loads(line).get("step") for line in path.read_text().splitlines()
             if '"event": "step"' in line]
    return max((s for s in steps if isinstance(s, int)), default=-1)


@pytest.mark.mindspore
def test_sigterm_saves_a_step_every_rank_completed_and_the_same_command_resumes(
        weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    argv = ("--device", "cpu", "--cards", "2", "--console", "none", "--job-id", "preempted",
            "--log-dir", str(logs), MAIN, "--epochs", "3")  # a checkpoint only at the end
    proc = subprocess.Popen(npu_launch_argv(*argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _last_step(logs) >= 30, "step 30", timeout=300)
        at_signal = _last_step(logs)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    asked = re.search(r"npu-launch: SIGTERM: every rank saves step (\d+) and stops", err)
    assert asked, err[-3000:]
    saved = int(asked.group(1))
    assert saved > at_signal, (saved, at_signal)
    assert (logs / "checkpoints" / f"step_{saved}" / "manifest.json").exists(), \
        sorted(p.name for p in (logs / "checkpoints").iterdir())
    assert_no_job_processes("preempted")

    again = run_launcher(*argv, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    rank_logs = [(logs / f"rank_{rank}.log").read_text() for rank in (0, 1)]
    assert all(f"resumed from step {saved})" in log for log in rank_logs), rank_logs[0][-2000:]


def _step(rank: int, step: int, **fields) -> Event:
    event = Event.parse({"event": "step", "rank": rank, "host": "h", "step": step, **fields})
    assert event is not None
    return event


def test_the_stop_step_is_past_what_any_rank_can_have_reached(tmp_path: Path) -> None:
    monitor = JobMonitor(str(tmp_path), "j", {0: "h", 1: "h"}, io.StringIO(), False)
    attempt = Attempt(monitor)
    attempt.event(_step(0, 5, log_every=5, saves_on_stop=True))
    assert attempt.stop_step([0, 1]) is None, "rank 1 has not said it saves on a stop"
    attempt.event(_step(1, 5, log_every=5, saves_on_stop=True))
    attempt.event(_step(0, 10))
    attempt.step_times = [(100.0, 5), (101.0, 10)]  # 5 steps a second
    assert attempt.stop_step([0, 1]) == 10 + 5 + 5 + 1
    attempt.event(_step(1, 10, log_every=5, saves_on_stop=False))  # a fit without a ckpt dir
    assert attempt.stop_step([0, 1]) is None, "a rank without a checkpoint dir: stop at once"
