"""A save on preemption (issue 24, part 2): SIGTERM to npu-launch while the shared trainer
trains makes every rank finish its step, save the same step and exit within --kill-timeout;
the same command run again resumes from that step. Real MindSpore ranks where what is proven
is the trainer's save and resume; the step chosen, in this process."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from helpers import REPO, assert_no_job_processes, npu_launch_argv, run_launcher, wait_for

from launcher.attempt import Attempt
from launcher.observe.monitor import JobMonitor
from parallel.contract import Event

MAIN = str(REPO / "scripts" / "train_digits.py")


def _last_step(logs: Path) -> int:
    path = logs / "events" / "rank_0.jsonl"
    if not path.exists():
        return -1
    steps = [json.loads(line).get("step") for line in path.read_text().splitlines()
             if '"event": "step"' in line]
    return max((s for s in steps if isinstance(s, int)), default=-1)


def _rank_pids(logs: Path) -> list[int]:
    return [json.loads((logs / "events" / f"rank_{r}.jsonl").read_text().splitlines()[0])["pid"]
            for r in (0, 1)]


@pytest.mark.mindspore
def test_sigterm_saves_a_step_every_rank_completed_and_the_same_command_resumes(
        weird_tmp: Path) -> None:
    """SIGTERM to npu-launch and to every rank at once, as Slurm's preemption signals every
    process of the job: each rank, signalled inside MindSpore's training, waits for npu-launch's
    word and trains on to the step named. SIGTERM to npu-launch alone (Ctrl-C, Kubernetes,
    Slurm's batch-shell signal) is this without the ranks' own signal: the ranks find the word
    in the same per-step look (``preemption.StopStep``), which runs whether or not a rank was
    signalled; that variant was a second copy of this 30 s job and was dropped."""
    logs = weird_tmp / "logs"
    argv = ("--device", "cpu", "--cards", "2", "--console", "none", "--job-id", "preempted",
            "--log-dir", str(logs), MAIN, "--epochs", "3")  # a checkpoint only at the end
    at_signal = [-1]  # the newest step seen as the signal goes out

    def thirty_steps() -> bool:
        at_signal[0] = _last_step(logs)
        return at_signal[0] >= 30

    saved = _preempted(argv, logs, thirty_steps)
    assert saved > at_signal[0], (saved, at_signal[0])
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
    attempt.event(_step(1, 10, log_every=5, saves_on_stop=False))  # rank 0 alone saves
    attempt.step_times = [(100.0, 5), (101.0, 10)]
    assert attempt.stop_step([0, 1]) == 21, "rank 1 stops at the step rank 0 saves"
    attempt.event(_step(0, 10, log_every=5, saves_on_stop=False))
    assert attempt.stop_step([0, 1]) is None, "no rank saves: stop at once"


def test_model_train_ranks_save_on_a_stop_but_are_not_asked_for_last_words(tmp_path: Path) -> None:
    """``Model.train``'s callback says ``last_words: false``: node 0 still picks a stop step for
    it, but does not wait on it for last words after a fault (nobody would answer)."""
    monitor = JobMonitor(str(tmp_path), "j", {0: "h", 1: "h"}, io.StringIO(), False)
    attempt = Attempt(monitor)
    for rank in (0, 1):
        attempt.event(_step(rank, 1, log_every=1, saves_on_stop=True, last_words=False))
    assert attempt.stop_step([0, 1]) is not None and attempt.savers == set()
    trainer = Attempt(JobMonitor(str(tmp_path / "t"), "t", {0: "h", 1: "h"}, io.StringIO(), False))
    for rank in (0, 1):
        trainer.event(_step(rank, 1, log_every=1, saves_on_stop=True))
    assert trainer.savers == {0, 1}


_BLOCKED = """
import os, sys, time
from parallel.hook import preemption
with preemption.deferred_sigterm(sys.argv[1]):
    print("ready", flush=True)
    r, w = os.pipe()
    if sys.argv[2] == "blocked":
        os.read(r, 1)  # as a rank blocked in a collective: the main thread runs no Python
    time.sleep(3)
print("went on", flush=True)
"""


@pytest.mark.parametrize("word, how, dies", [
    (None, "blocked", True), ("none", "blocked", True), ("44", "sleeping", False)])
def test_a_rank_signalled_itself_waits_for_the_launchers_word(
        tmp_path: Path, word, how, dies) -> None:
    """SIGTERM to a fitting rank (as Slurm sends every process of a job): it dies of it at once
    when npu-launch says no save comes (or says nothing within ``WAIT``), even blocked outside
    Python; it goes on when a save step is named."""
    path = tmp_path / "stop_request"
    if word is not None:
        path.write_text(word + "\n")
    proc = subprocess.Popen([sys.executable, "-c", _BLOCKED, str(path), how],
                            stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    if dies:
        assert proc.returncode == -signal.SIGTERM and out == "", (proc.returncode, out)
    else:
        assert proc.returncode == 0 and out == "went on\n", (proc.returncode, out)


_FORKS = """
import os, signal, sys, time
from parallel.hook import preemption
with preemption.deferred_sigterm(sys.argv[1]):
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    time.sleep(0.2)
    os.kill(child, signal.SIGTERM)  # as a pool's terminate() ends its forked workers
    _, status = os.waitpid(child, 0)
    time.sleep(1)  # past preemption.WAIT: a rank that took it for its own is dead by now
print("went on", os.WTERMSIG(status) if os.WIFSIGNALED(status) else status, flush=True)
"""


def test_a_sigterm_to_a_child_forked_while_waiting_is_the_childs_alone(tmp_path: Path) -> None:
    """A child forked inside the block (MindSpore's summary writer, a dataset worker) has
    SIGTERM's default again, and no wakeup descriptor into the rank's pipe: its SIGTERM ends
    it, not the rank (mindcv's ``SummaryRecord`` closing its pool killed a finished rank 0)."""
    proc = subprocess.run([sys.executable, "-c", _FORKS, str(tmp_path / "stop_request")],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (proc.returncode, proc.stdout) == (0, f"went on {int(signal.SIGTERM)}\n"), proc


def _preempted(argv: tuple[str, ...], logs: Path, far_enough: Callable[[], bool],
               said: str = r"every rank saves step (\d+) and stops") -> int:
    """Run npu-launch with ``argv`` until ``far_enough``, then SIGTERM it and every rank at once,
    as Slurm's preemption signals every process of the job; the step it asked the ranks to save
    and stop at, as its line ``said`` names it (it exits 143)."""
    proc = subprocess.Popen(npu_launch_argv(*argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(far_enough, "training under way", timeout=300)
        proc.send_signal(signal.SIGTERM)
        for pid in _rank_pids(logs):
            os.kill(pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    asked = re.search(rf"npu-launch: SIGTERM: {said} \(--kill-timeout", err)
    assert asked, err[-3000:]
    return int(asked.group(1))


def _params(log: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^params (\d+) (\w+)$", log, re.M)}


@pytest.mark.mindspore
def test_sigterm_to_a_model_train_script_saves_through_its_own_model_checkpoint(
        weird_tmp: Path) -> None:
    """A plain ``Model.train`` script whose rank 0 alone has a ``ModelCheckpoint``, saving only at
    the end: SIGTERM to npu-launch and to every rank makes rank 0 save the step node 0 names,
    under its own name for that step, holding the parameters and optimizer moments it had after
    it, and rank 1 stop at the same step; the same command run again (every rank loads the
    newest checkpoint) starts from exactly those on both."""
    logs, ckpt = weird_tmp / "logs", weird_tmp / "ckpt"
    argv = ("--device", "cpu", "--cards", "2", "--console", "none", "--job-id", "mt-preempted",
            "--log-dir", str(logs), str(REPO / "tests" / "rank_scripts" / "model_train_ckpt.py"),
            str(ckpt), "--steps", "60", "--step-time", "0.2")
    rank_log = logs / "rank_0.log"
    step = _preempted(argv, logs,
                      lambda: rank_log.exists() and len(_params(rank_log.read_text())) >= 8,
                      r"rank 0 saves step (\d+) and every rank stops there")
    first = [(logs / f"rank_{rank}.log").read_text() for rank in (0, 1)]
    assert f"npu-launch: rank 0 saved step {step} (" in first[0], first[0][-2000:]
    assert f"npu-launch: rank 1 stops at step {step}, as asked" in first[1], first[1][-2000:]
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == [f"net-1_{step}.ckpt"]
    for log in first:
        assert max(_params(log)) == step, "no step after the one saved"
    assert_no_job_processes("mt-preempted")

    again = run_launcher(*argv[:-2], timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    for rank in (0, 1):
        log = (logs / f"rank_{rank}.log").read_text()
        assert f"resumed net-1_{step}.ckpt {_params(first[rank])[step]}\n" in log, log[-2000:]
        assert f"rank {rank} trained to step 60" in log
