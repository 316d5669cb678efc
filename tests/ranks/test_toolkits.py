"""A real toolkit under npu-launch (issue 39): mindcv 0.3.0 (the ``test`` extra) trains a tiny
model on generated images through its public API, as its ``train.py`` does
(``tests/rank_scripts/mindcv_train.py``: nothing of npu-launch imported).

* 2 ranks under npu-launch print the same per-step losses as the same script under msrun
  (MindSpore's own launcher, run here as its users run it). The npu-launch run, uninterrupted,
  is the module's reference: the crash test compares its first attempt with it too.
* Rank 1 raising at step 7 with ``--max-restarts 1`` and ``--ckpt_path '{checkpoint:-}'``:
  the restart loads rank 0's newest epoch checkpoint (mindcv saves on rank 0 alone, beside
  ``optim_<model>.ckpt``), says so in its log, and trains steps 5 to 8, not from step 1.
"""
from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, run_launcher

pytestmark = [
    pytest.mark.mindspore,
    pytest.mark.skipif(importlib.util.find_spec("mindcv") is None,
                       reason="mindcv is not installed (pip install -e '.[test]')"),
]

SCRIPT = RANK_SCRIPTS / "mindcv_train.py"
MODEL = "mobilenet_v1_025"
STEPS_PER_EPOCH, EPOCHS = 4, 2  # 16 images over 2 ranks, batches of 2
_STEP = re.compile(r"^mindcv_train: rank (\d+) step (\d+) loss (\S+)$", re.M)
_ATTEMPT = re.compile(r"^==== npu-launch: job .*, attempt \d+ .*====$", re.M)


def _script_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mindcv_train", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its MindSpore imports are inside main()
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script_args(data: Path, *more: str) -> list[str]:
    return [str(SCRIPT), "--distribute", "True", "--data_dir", str(data), "--model", MODEL,
            "--epoch_size", str(EPOCHS), "--ckpt_save_dir", "ckpt", *more]


def steps(log: str) -> list[tuple[int, str]]:
    """(step, loss) of each step a rank log shows, in order."""
    return [(int(m.group(2)), m.group(3)) for m in _STEP.finditer(log)]


def attempts(log: str) -> list[str]:
    """A rank log cut at npu-launch's lines between attempts."""
    return _ATTEMPT.split(log)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mindcv images") / "data"
    _script_module().write_images(str(root))
    return root


@pytest.fixture(scope="module")
def straight(images: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[tuple[int, str]]]:
    """Each rank's steps of the uninterrupted job under npu-launch."""
    work = tmp_path_factory.mktemp("mindcv straight")
    start = time.monotonic()
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "mindcv-straight", "--console", "none",
                          "--log-dir", str(work / "logs"), *script_args(images), cwd=work, timeout=300)
    print(f"npu-launch, uninterrupted: {time.monotonic() - start:.1f} s")
    assert result.returncode == 0, result.stderr[-3000:]
    found = {rank: steps((work / "logs" / f"rank_{rank}.log").read_text()) for rank in (0, 1)}
    assert [s for s, _ in found[0]] == list(range(1, EPOCHS * STEPS_PER_EPOCH + 1)), found[0]
    assert (work / "ckpt" / f"{MODEL}-{EPOCHS}_{STEPS_PER_EPOCH}.ckpt").exists()
    return found


def test_two_ranks_give_msruns_losses_step_for_step(images: Path, straight: dict, tmp_path: Path) -> None:
    start = time.monotonic()
    result = subprocess.run(["msrun", "--worker_num=2", "--local_worker_num=2", f"--master_port={_free_port()}",
                             "--join=True", "--log_dir=msrun_log", *script_args(images)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    print(f"msrun: {time.monotonic() - start:.1f} s")
    assert result.returncode == 0, result.stdout[-3000:]
    under_msrun = {rank: steps((tmp_path / "msrun_log" / f"worker_{rank}.log").read_text()) for rank in (0, 1)}
    assert under_msrun == straight
    assert straight[0] != straight[1], "each rank prints the loss of its own shard"


def test_a_crash_resumes_from_rank_0s_newest_epoch_checkpoint(images: Path, straight: dict,
                                                              tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "mindcv-crash", "--console", "none",
                          "--log-dir", str(logs), "--max-restarts", "1",
                          *script_args(images, "--ckpt_path", "{checkpoint:-}", "--resume_opt", "True",
                                       "--fail_at_step", "7"),
                          cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "restart 1 of 1 after" in result.stderr, result.stderr[-2000:]
    newest = (tmp_path / "ckpt" / f"{MODEL}-1_{STEPS_PER_EPOCH}.ckpt").resolve()  # epoch 2 never ended
    first, again = {}, {}
    for rank in (0, 1):
        parts = attempts((logs / f"rank_{rank}.log").read_text())
        assert len(parts) == 2, f"rank {rank}: {len(parts)} attempt(s)"
        first[rank], again[rank] = steps(parts[0]), steps(parts[1])
        assert first[rank] == straight[rank][:len(first[rank])], "the first attempt is the uninterrupted job"
        assert [s for s, _ in again[rank]] == list(range(STEPS_PER_EPOCH + 1, EPOCHS * STEPS_PER_EPOCH + 1))
    assert [s for s, _ in first[1]] == list(range(1, 7)), "rank 1 raised as step 7 began"
    assert f"Resume training from {newest}, last step: {STEPS_PER_EPOCH}, last epoch: 1" in \
        attempts((logs / "rank_0.log").read_text())[1]
    saved = json.loads((logs / "checkpoint_ledger" / "saved.json").read_text())["ranks"]
    assert str(newest) in {s["path"] for s in saved["0"]} and "1" not in saved, saved
    assert_no_job_processes("mindcv-crash")
