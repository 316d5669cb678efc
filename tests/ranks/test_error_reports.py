"""A rank's error report survives what replaces ``sys.excepthook``: MindSpore's graph compilation
puts Python's default hook back (found with the main job: a GRAPH-mode rank that raised was told
as "exited with code 1", its exception lost), so the rank hook restores its own after each
compile, and an exit handler writes the report of an exception the hook missed."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, run_launcher

from launcher.job import boot_dir
from parallel import contract


@pytest.mark.mindspore
def test_the_main_job_s_rank_that_raises_after_compiling_is_reported_with_its_exception(
        weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    host = socket.gethostname()
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "graph-raise",
                          "--log-dir", str(logs), str(RANK_SCRIPTS / "digits_faults.py"),
                          "--fail-on-host", host, "--fail-at-step", "3", "--epochs", "1")
    assert result.returncode == 1, result.stderr[-3000:]
    assert " raised RuntimeError" in result.stderr, result.stderr[-3000:]
    cause = json.loads((logs / "summary.json").read_text())["root_cause"]
    assert cause["exception"] == "RuntimeError", cause
    assert cause["error"] == f"{host} is a bad host: failing at step 3"
    assert_no_job_processes("graph-raise")


def test_an_exception_the_replaced_excepthook_missed_is_reported_at_exit(tmp_path: Path) -> None:
    report = tmp_path / "error.json"
    script = tmp_path / "replaces_hook.py"
    script.write_text("import sys\nsys.excepthook = sys.__excepthook__\n"
                      "raise KeyError('lost by the default hook')\n")
    env = {**os.environ, "PYTHONPATH": boot_dir(), contract.ERROR_FILE: str(report),
           contract.RANK_ID: "3"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "KeyError" in done.stderr
    written = json.loads(report.read_text())
    assert (written["exception"], written["rank"]) == ("KeyError", 3)
    assert "lost by the default hook" in written["message"]
    assert "replaces_hook.py" in written["traceback"]
