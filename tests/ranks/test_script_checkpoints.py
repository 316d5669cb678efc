"""The script's own checkpoints handed back to it (issue 39, points 1 and 2): a seed-style
``Model.train`` script (``tests/rank_scripts/model_train_epochs.py``: rank 0 alone saves with
``ModelCheckpoint``; it resumes the tutorials' way, ``--ckpt_path FILE`` and ``initial_epoch``
parsed from the name) gets ``--ckpt_path {checkpoint:-}`` replaced by its newest checkpoint on
a restart after a crash and on the same command run again after a SIGTERM; resumed from a save
made mid-epoch, it trains the rest of that epoch, so every step of the run is trained and the
parameters after each step are those of the run never stopped. Real 2-rank MindSpore jobs of
2 epochs of 10 steps."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, run_launcher
from test_preemption import _preempted

SCRIPT = str(RANK_SCRIPTS / "model_train_epochs.py")
EPOCH = 10
STEPS = 2 * EPOCH


def _argv(logs: Path, ckpt: Path, job: str, *more: str) -> tuple[str, ...]:
    return ("--device", "cpu", "--cards", "2", "--console", "none", "--job-id", job,
            "--log-dir", str(logs), *more, SCRIPT, str(ckpt), "--ckpt_path", "{checkpoint:-}",
            "--epochs", "2", "--steps", str(EPOCH))


def _params(log: str) -> list[tuple[int, str]]:
    """Every ``params`` line, in order: (step, digest)."""
    return [(int(m.group(1)), m.group(2)) for m in re.finditer(r"^params (\d+) (\w+)$", log, re.M)]


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """The digest after each step of the run that was never stopped."""
    root = tmp_path_factory.mktemp("straight")
    done = run_launcher(*_argv(root / "logs", root / "ckpt", "mt-straight"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = dict(_params((root / "logs" / "rank_0.log").read_text()))
    assert sorted(steps) == list(range(1, STEPS + 1))
    return steps


@pytest.mark.mindspore
def test_a_restart_after_a_crash_gets_the_newest_checkpoint_and_loses_no_step(
        weird_tmp: Path, never_stopped: dict[int, str]) -> None:
    """Rank 1 raises as step 14 begins (first attempt only); rank 0 saved every 3 steps
    (net-1_3 ... net-2_2: mid-epoch). The restart runs with ``--ckpt_path .../net-2_2.ckpt``:
    the script asks for ``initial_epoch=2`` and trains steps 13 to 20 (step 13 redone, none
    skipped), each to the parameters of the run never stopped."""
    logs, ckpt = weird_tmp / "logs", weird_tmp / "ckpt"
    done = run_launcher(*_argv(logs, ckpt, "mt-crash", "--max-restarts", "1"),
                        "--save-every", "3", "--fail-at", "14", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restart 1 of 1 after" in done.stderr, done.stderr[-3000:]
    log = (logs / "rank_0.log").read_text()
    first, _, second = log.partition("resumed net-2_2.ckpt initial_epoch=2")
    assert second, log[-3000:]
    assert "other 8 step(s) first" in second, second[:2000]
    trained = _params(second)
    assert [s for s, _ in trained] == list(range(13, STEPS + 1)), trained
    assert all(digest == never_stopped[step] for step, digest in trained), "not the same run"
    ranks = json.loads((logs / "plan.json").read_text())["ranks"]
    assert {r["argv"][r["argv"].index("--ckpt_path") + 1] for r in ranks} \
        == {str(ckpt / "net-2_2.ckpt")}, "the restart's plan"
    assert {r["env"]["NPU_LAUNCH_CHECKPOINT"] for r in ranks} == {str(ckpt / "net-2_2.ckpt")}
    assert_no_job_processes("mt-crash")


@pytest.mark.mindspore
def test_the_same_command_after_a_sigterm_resumes_mid_epoch_exactly(
        weird_tmp: Path, never_stopped: dict[int, str]) -> None:
    """SIGTERM once step 11 is trained: rank 0 saves the step node 0 names (mid-epoch 2, say
    net-2_6.ckpt) and every rank stops there. The same command again gets that file in
    ``{checkpoint}``; the script asks for ``initial_epoch=2``, and the rest of epoch 2 is
    trained before epoch 3: both launches together train steps 1 to 15 once each, to the
    parameters of the run never stopped."""
    logs, ckpt = weird_tmp / "logs", weird_tmp / "ckpt"
    argv = _argv(logs, ckpt, "mt-term")
    rank_log = logs / "rank_0.log"
    stop = _preempted((*argv, "--step-time", "0.3"), logs,
                      lambda: rank_log.exists() and len(_params(rank_log.read_text())) >= 11,
                      r"rank 0 saves step (\d+) and every rank stops there")
    assert EPOCH < stop < STEPS, f"step {stop}: not in epoch 2, mid-epoch"
    first = _params(rank_log.read_text())
    assert [s for s, _ in first] == list(range(1, stop + 1))
    saved = f"net-2_{stop - EPOCH}.ckpt"
    assert (ckpt / saved).exists(), sorted(p.name for p in ckpt.iterdir())
    assert_no_job_processes("mt-term")

    again = run_launcher(*argv, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    log = rank_log.read_text()
    assert f"resumed {saved} initial_epoch=2" in log, log[-3000:]
    second = _params(log)[len(first):]
    steps = [s for s, _ in first + second]
    assert steps == list(range(1, STEPS + 1)), f"steps trained over both launches: {steps}"
    assert all(digest == never_stopped[step] for step, digest in first + second)
    assert f"trained {STEPS - stop} steps" in log
