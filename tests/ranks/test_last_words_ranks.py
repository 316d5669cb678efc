"""Last words with real MindSpore ranks (issue 24 part 1): what only they prove. The healthy
replica's save of the last completed step, made by a thread while the main thread is blocked
in the step's all-reduce, is byte for byte the periodic checkpoint of that step; a crash or a
hang at step 33 (mid-epoch) resumes from step 33 to the uninterrupted job's parameters; and a
peer lost in the middle of a step's gradient exchange leaves that step unapplied, not half.
The main digits job, 3 epochs of 22 steps, 2 CPU ranks (``tests/rank_scripts/digits_last_words.py``)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, run_launcher

from parallel.manifest import sha256_file

pytestmark = pytest.mark.mindspore
SCRIPT = str(RANK_SCRIPTS / "digits_last_words.py")
AT = 33  # mid-epoch 2: no periodic checkpoint of it (every 5 epochs, and at the end)
"""Rank 1 dies or stops right after step ``AT``. Rank 0's last completed step is ``AT``, or
``AT - 1`` when rank 1 was gone before rank 0's share of step ``AT``'s all-reduce arrived: the
issue's "step 49 or 50"."""
COMMON = ("--device", "cpu", "--cards", "2", "--console", "none")


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted job, with periodic checkpoints of steps ``AT - 1`` and ``AT`` to compare
    with."""
    root = tmp_path_factory.mktemp("straight")
    done = run_launcher(*COMMON, "--log-dir", str(root / "logs"), SCRIPT, "--epochs", "3",
                        "--ckpt-at-steps", f"{AT - 1},{AT}", "--save-params", str(root / "params"),
                        timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def _faulty(root: Path, job: str, fault: tuple[str, str], *options: str) -> str:
    """The job with ``fault`` (the script's option and step), ``options`` to npu-launch."""
    done = run_launcher(*COMMON, "--max-restarts", "1", "--restart-backoff", "0", "--job-id", job,
                        "--log-dir", str(root / "logs"), *options, SCRIPT, *fault,
                        "--epochs", "3", "--save-params", str(root / "params"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_no_job_processes(job)
    return done.stderr


def _saved_step(err: str) -> int:
    """The step last words saved, which must be ``AT - 1`` or ``AT``."""
    for step in (AT - 1, AT):
        if f"npu-launch: last words: rank 0 saved step {step} for every rank" in err:
            return step
    raise AssertionError(err[-3000:])


def _assert_resumed_to_the_same_parameters(straight: Path, root: Path, step: int) -> None:
    for rank in (0, 1):
        log = (root / "logs" / f"rank_{rank}.log").read_text()
        assert f"resumed from step {step});" in log, log[-2000:]
        a = np.load(straight / "params" / f"rank{rank}.npz")
        b = np.load(root / "params" / f"rank{rank}.npz")
        assert set(a.files) == set(b.files)
        differ = [k for k in a.files if not np.array_equal(a[k], b[k])]
        assert not differ, f"rank {rank}: resumed parameters differ: {differ}"


def test_a_crash_leaves_the_periodic_checkpoint_of_the_last_step_bit_for_bit(
        straight: Path, weird_tmp: Path) -> None:
    err = _faulty(weird_tmp, "lw-crash", ("--kill-at-step", str(AT)))
    assert "restart 1 of 1 after: job lw-crash failed: rank 1" in err and "killed by SIGKILL" in err
    step = _saved_step(err)
    saved = weird_tmp / "logs" / "checkpoints" / f"step_{step}" / "rank_0.ckpt"
    periodic = straight / "logs" / "checkpoints" / f"step_{step}" / "rank_0.ckpt"
    # Digests, not the bytes: pytest's diff of two 40 KB byte strings took 330 s in CI.
    assert sha256_file(saved) == sha256_file(periodic), \
        "last words hold exactly what the periodic checkpoint of the step holds"
    ledger = json.loads((weird_tmp / "logs" / "checkpoint_ledger" / f"step_{step}" /
                         "manifest.json").read_text())
    assert [f["name"] for f in ledger["files"]] == ["rank_0.ckpt", "rank_0.ckpt"]
    assert ledger["position"]["global_step"] == step
    _assert_resumed_to_the_same_parameters(straight, weird_tmp, step)


def test_a_hang_likewise_resumes_from_the_step_it_hung_after(straight: Path,
                                                            weird_tmp: Path) -> None:
    err = _faulty(weird_tmp, "lw-hang", ("--hang-at-step", str(AT)), "--hang-timeout", "5")
    assert "hang" in err.lower(), err[-3000:]
    _assert_resumed_to_the_same_parameters(straight, weird_tmp, _saved_step(err))


def test_a_peer_lost_mid_exchange_leaves_the_step_unapplied(tmp_path: Path) -> None:
    """Rank 1 joins 3 of step 2's 6 gradient all-reduces and exits: rank 0, blocked in the 4th,
    must hold step 1's weights, every one (what last words save as step 1). Without the barrier
    in ``Update.update`` one weight held step 2's value here."""
    shared = tmp_path / "shared"
    shared.mkdir()
    done = run_launcher(*COMMON, "--job-id", "lw-half", "--log-dir", str(tmp_path / "logs"),
                        str(RANK_SCRIPTS / "half_step.py"), str(shared), "3", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (shared / "rank1-gone").read_text() == "3"
    log = (tmp_path / "logs" / "rank_0.log").read_text()
    assert "changed: []" in log, log[-2000:]
    assert_no_job_processes("lw-half")
