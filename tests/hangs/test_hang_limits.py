"""Hang limits learnt from the job (``launcher.hangs.hang_limits.Limits``), end to end: with no
``--hang-timeout`` a hang in a job of sub-second steps is named by the learnt limit, which the
message names; a rank that saves or evaluates alone for long, or a slow first compilation, is
no hang. The ranks are plain Python reporting the contract's events themselves
(``tests/plain_scripts/paced_ranks.py``): what is proven is the launcher's judgement, and no
MindSpore process starts (no rank imports it, so no scheduler either). The rank hook's wrappers
of MindSpore's saves and evaluations are checked on MindSpore itself (the one test marked
``mindspore``)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, TESTS, assert_no_job_processes, run_launcher

from launcher.hangs.hang_limits import LEARNT_FILE
from launcher.hangs.stalls import HANG_EXIT_CODE
from launcher.run.restarts import NO_PROGRESS_EXIT_CODE

PACED = str(TESTS / "plain_scripts" / "paced_ranks.py")
CPU = ("--device", "cpu", "--cards", "2")


def _summary(logs: Path) -> dict:
    return json.loads((logs / "summary.json").read_text())


def test_a_hang_is_named_by_the_learnt_limit_with_no_option_given(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--job-id", "learnt", "--log-dir", str(logs), PACED,
                          "--steps", "60", "--step-s", "0.2", "--hang-rank", "1",
                          "--hang-at", "40")
    assert result.returncode == HANG_EXIT_CODE, result.stderr[-3000:]
    head = next(line for line in result.stderr.splitlines() if "stopped: rank" in line)
    assert "rank 1 on " in head and " hangs: no progress for " in head, head
    assert "(limit 10 s learnt: 5 x 0." in head and "s longest interval, floor 10 s)" in head
    summary = _summary(logs)
    assert summary["outcome"] == "stalled" and summary["root_cause"]["rank"] == 1
    assert summary["stall"]["timeout"] == 10.0
    assert summary["stall"]["limit"].startswith("limit 10 s learnt: 5 x 0.")
    assert_no_job_processes("learnt")


def test_one_rank_saving_or_evaluating_long_after_a_slow_compile_is_no_hang(
        weird_tmp: Path) -> None:
    """4 s of 'compilation' before the first step, then rank 0 alone inside its first save for
    5 s while rank 1 waits inside its next step, then rank 1 alone inside an evaluation for 5 s
    while rank 0 waits: each longer than the learnt limit, none a hang. ``--hang-floor 2`` makes
    that limit 2 s (5 x 0.2 s steps, at least the floor): the same judgement as with the default
    floor of 10 s (which the test above names), with episodes of 2.5 limits, not 1.2 limits of
    12 s each (39 s -> 17 s)."""
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--job-id", "healthy", "--log-dir", str(logs), "--hang-floor", "2",
                          PACED, "--steps", "16", "--step-s", "0.2", "--compile-s", "4",
                          "--section", "save:0:8:5", "--section", "eval:1:11:5")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(logs)
    assert summary["outcome"] == "succeeded" and summary["stall"] is None
    sections = json.loads((logs / LEARNT_FILE).read_text())["sections"]
    assert sections.keys() == {"save", "eval"} and min(sections.values()) >= 4.5, sections
    assert_no_job_processes("healthy")


def test_a_rank_whose_script_ended_waits_for_the_others_without_a_hang_or_a_stop(
        weird_tmp: Path) -> None:
    """Rank 1's script ends after step 2 and its exit handlers wait for rank 0's, as MindSpore's
    finalisation waits for the cluster, while rank 0 steps on for 3.6 s: longer than the hang
    limit (2 s) and than ``--exit-timeout`` (1 s). Before, rank 1 was blamed for a hang "while
    other ranks advanced" (exit 124, and a restart with ``--max-restarts``); the exit limit
    counts only once every rank's script ended."""
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--job-id", "ended-early", "--log-dir", str(logs),
                          "--hang-timeout", "2", "--exit-timeout", "1", PACED, "--steps", "20",
                          "--step-s", "0.2", "--end-rank", "1", "--end-at", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "counted as exited 0" not in result.stderr, result.stderr[-3000:]
    summary = _summary(logs)
    assert summary["outcome"] == "succeeded" and summary["stall"] is None
    ranks = {r["rank"]: r for r in summary["ranks"]}
    assert {r: ranks[r]["exit_code"] for r in ranks} == {0: 0, 1: 0}, ranks
    assert_no_job_processes("ended-early")


def test_a_rank_that_left_the_collectives_early_is_named_as_the_cause(weird_tmp: Path) -> None:
    """Uneven data: rank 1's script ends after its third step while rank 0 waits inside its
    fifth for rank 1's share. The block names rank 1 and why, not "every rank waits"."""
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--job-id", "left-early", "--log-dir", str(logs),
                          "--hang-timeout", "2", PACED, "--steps", "20", "--step-s", "0.1",
                          "--end-rank", "1", "--end-at", "2", "--hang-rank", "1", "--hang-at", "4")
    assert result.returncode == HANG_EXIT_CODE, result.stderr[-3000:]
    # The silence named is the one measured: at least the limit, more on a loaded machine.
    said = re.search(r"wait with no progress for (\d+) s \(--hang-timeout 2\), but rank 1 on "
                     + re.escape(socket.gethostname()) + r" ended its script after step 3: it "
                     r"left the job's collectives early", result.stderr)
    assert said and int(said[1]) >= 2, result.stderr[-3000:]
    summary = _summary(logs)
    assert summary["root_cause"]["rank"] == 1 and summary["stall"]["left"] is True
    assert_no_job_processes("left-early")


@pytest.mark.mindspore
def test_the_rank_hook_wraps_mindsporess_saves_evaluations_and_fit(tmp_path: Path) -> None:
    """With the hook installed (as in every rank), ``save_checkpoint`` (also as the checkpoint
    callback and ``mindspore`` bind it) and ``Model.eval`` are sections; a real save shows as
    one in the rank's progress events. Then ``Model.fit`` with a ``ModelCheckpoint`` (``train``'s
    save on a stop is ``ranks/test_preemption.py``'s, over two ranks) reports its steps with their
    loss, each counted as a training step (``trained``), and, with npu-launch's word for step 3
    already there, saves that step through the ``ModelCheckpoint`` and exits 0."""
    events, ckpt = tmp_path / "events.jsonl", tmp_path / "ckpt"
    (tmp_path / "stop_request").write_text("3\n")
    code = (
        "import time, mindspore as ms, numpy as np\n"
        "from mindspore import nn\n"
        "from mindspore.train.callback import _checkpoint, CheckpointConfig, ModelCheckpoint\n"
        "from parallel.hook import progress\n"
        "for f in (ms.save_checkpoint, _checkpoint.save_checkpoint, ms.train.Model.eval,\n"
        "          ms.train.Model.train, ms.train.Model.fit):\n"
        "    assert f.__name__ in ('save_checkpoint', 'eval', 'train', 'fit') and hasattr(f, '__wrapped__'), f\n"
        f"ms.save_checkpoint(nn.Dense(2, 2), {str(tmp_path / 'c.ckpt')!r})\n"
        "assert progress.snapshot()[3:] == ('', 1, 0, False), progress.snapshot()\n"
        "time.sleep(0.7)\n"
        "net = nn.Dense(2, 2)\n"
        "model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))\n"
        "x = np.ones((40, 2), np.float32)\n"
        "data = ms.dataset.NumpySlicesDataset((x, x), ['x', 'y'], shuffle=False).batch(4)\n"
        f"saves = ModelCheckpoint('net', {str(ckpt)!r}, CheckpointConfig(save_checkpoint_steps=100))\n"
        "class Trained(ms.train.Callback):\n"
        "    def on_train_step_end(self, run_context):\n"
        "        step = run_context.original_args().cur_step_num\n"
        "        print(f'trained {progress.snapshot()[5]} at step {step}', flush=True)\n"
        "model.fit(1, data, callbacks=[saves, Trained()])\n"
        "print('fit went on past the stop')\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'parallel' / '_boot'}{os.pathsep}{REPO}",
           "NPU_LAUNCH_EVENTS_FILE": str(events), "NPU_LAUNCH_PROGRESS": "1",
           "NPU_LAUNCH_LOG_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(r["event"] == "progress" and r.get("sections") == 1 for r in records), records
    assert "trained 1 at step 1\ntrained 2 at step 2\n" in done.stdout, \
        "fit's steps are training steps (``trained``: what ends the compile grace)"
    assert "saved step 3 (" in done.stdout and "went on" not in done.stdout, done.stdout[-2000:]
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == ["net-1_3.ckpt"]
    steps = [r for r in records if r["event"] == "step"]
    assert steps[0]["step"] == 1 and steps[0]["saves_on_stop"] is True, steps
    assert steps[0]["last_words"] is False, "it saves on a stop, not last words"
    assert isinstance(steps[0]["loss"], float) and steps[0]["loss"] > 0, steps[0]


def test_a_deterministic_failure_stops_after_two_attempts_with_its_own_exit_code(
        weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher(*CPU, "--max-restarts", "3", "--restart-backoff", "0", "--job-id",
                          "same-failure", "--log-dir", str(logs), PACED, "--steps", "30",
                          "--step-s", "0.05", "--fail-rank", "1", "--fail-at", "12")
    assert result.returncode == NO_PROGRESS_EXIT_CODE == 93, result.stderr[-3000:]
    assert ("npu-launch: not restarting: the last two attempts failed at step 12 with the same "
            "root cause (rank 1, RuntimeError) and no complete checkpoint: a restart cannot "
            "help (exit 93)") in result.stderr, result.stderr[-3000:]
    assert "restart 2 of 3" not in result.stderr
    summary = _summary(logs)
    assert [(a["outcome"], a["exit_code"]) for a in summary["attempts"]] == [
        ("failed", 1), ("failed", 1)], "each attempt failed as itself; the job ends 93"
    assert summary["exit_code"] == 93 and summary["root_cause"]["rank"] == 1
    assert_no_job_processes("same-failure")
