"""The diagnosis at the end of a failed job: plain-Python ranks that print Ascend's errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from launcher.diagnose import diagnose_files, load
from launcher.diagnose.job import BUDGET
from launcher.diagnose.sources import LogFile

ROOT = Path(__file__).resolve().parents[2]

OOM_RANK = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    print("        [driver interface] halMemAlloc failed: device_id=6, size=32212254720", flush=True)
    sys.exit(1)
time.sleep(60)
"""

PLOG_RANK = """
import os, sys
folder = os.path.join(os.environ["ASCEND_PROCESS_LOG_PATH"], "debug", "plog")
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "plog-1_1.log"), "w") as f:
    f.write("EJ0001: Failed to initialize the HCCP process. Reason: Maybe the last training "
            "process is running.\\n")
print("ASCEND_PROCESS_LOG_PATH=" + os.environ["ASCEND_PROCESS_LOG_PATH"], flush=True)
sys.exit(3)
"""

KEY_ERROR_RANK = "cfg = {}\nprint(cfg['batch_size'])\n"


def _launch(tmp_path, script, *options):
    path = tmp_path / "train job.py"
    path.write_text(script)
    logs = tmp_path / "logs"
    run = subprocess.run([sys.executable, "-m", "launcher.cli", *options, "--log-dir", str(logs),
                          str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return run, logs


def test_a_failed_jobs_block_ends_with_the_likely_cause(tmp_path):
    run, logs = _launch(tmp_path, OOM_RANK, "--cards", "2")
    assert run.returncode == 1
    block = run.stderr.rstrip().splitlines()
    cause = next(i for i, line in enumerate(block) if line.startswith("npu-launch: likely cause:"))
    assert block[cause].startswith("npu-launch: likely cause: rank 1 on ")
    assert "ran out of device memory (EL0004, rank_1.log:1). Fix: Lower the batch size" in block[cause]
    assert [line.split(":")[0] for line in block[cause + 1:]] == ["  why", "  check", "  see"]
    summary = json.loads((logs / "summary.json").read_text())
    (found,) = summary["diagnosis"]
    assert (found["rank"], found["id"], found["evidence"]) == (1, "device-oom", "rank_1.log:1")
    report = subprocess.run([sys.executable, "-m", "launcher.cli", "report", str(logs)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "likely cause: rank 1" in report.stdout


def test_cann_logs_are_kept_per_rank_and_read(tmp_path):
    run, logs = _launch(tmp_path, PLOG_RANK, "--cards", "1")
    assert f"ASCEND_PROCESS_LOG_PATH={logs / 'ascend' / 'rank_0'}" in run.stdout + run.stderr \
        or (logs / "ascend" / "rank_0" / "debug" / "plog" / "plog-1_1.log").exists()
    assert "likely cause: rank 0 on " in run.stderr and "(EJ0001, plog-1_1.log:1)" in run.stderr


def test_a_script_error_says_nothing_more_than_before(tmp_path):
    run, logs = _launch(tmp_path, KEY_ERROR_RANK, "--cards", "1")
    assert run.returncode == 1 and "KeyError" in run.stderr
    assert "likely cause" not in run.stderr
    assert json.loads((logs / "summary.json").read_text())["diagnosis"] == []


def test_the_end_of_a_job_waits_at_most_the_budget(tmp_path):
    load()
    files = []
    for rank in range(8):
        path = tmp_path / f"rank_{rank}.log"
        with open(path, "wb") as f:
            f.write(b"[INFO] ordinary line of a long training run, step 12, loss 0.5\n" * 400_000)
        files.append(LogFile(str(path), rank))
    began = time.monotonic()
    diagnosis = diagnose_files(files, deadline=time.monotonic() + BUDGET)
    assert time.monotonic() - began < 0.2
    assert not diagnosis.named
