"""A MindSpore rank whose Python never loaded the rank hook (``launcher.run.hookless``) still gets
its scheduler: found from its processes' memory maps, named in one note, the job runs. Real
MindSpore ranks: what is found is MindSpore's own library in a real rank's maps."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, start_job


@pytest.mark.mindspore
def test_a_mindspore_rank_without_the_hook_is_found_and_its_scheduler_started(
        weird_tmp: Path) -> None:
    job = start_job(weird_tmp / "logs", "hookless", str(RANK_SCRIPTS / "isolated_ms.py"))
    try:
        out, err = job.communicate(timeout=180)  # before: the ranks waited for a scheduler
    except subprocess.TimeoutExpired:
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=60)
        pytest.fail(f"the job waited for its scheduler: {err[-3000:]}")
    assert job.returncode == 0, err[-3000:]
    assert {line.split("] ", 1)[-1] for line in out.splitlines() if " up, " in line} == {
        "rank 0 up, hook loaded: False", "rank 1 up, hook loaded: False"}, out[-2000:]
    notes = [line for line in err.splitlines() if "without npu-launch's rank hook" in line]
    assert len(notes) == 1 and notes[0].startswith("npu-launch: note: rank "), err[-3000:]
    assert "MindSpore's scheduler was started when it was found" in notes[0]
    assert_no_job_processes("hookless")
