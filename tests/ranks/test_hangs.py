"""Hangs in plain MindSpore scripts (``tests/plain_scripts``: nothing of npu-launch imported).

Rank 1 sleeps for an hour before its 4th step; rank 0 then waits in the step's all-reduce, and
MindSpore's CPU collective would raise there after about 30 s (on Ascend, HCCL's execution
timeout: 1836 s). The launcher sees progress through the rank hook alone, so it must stop the job
itself once --hang-timeout passed, blame rank 1 (not rank 0, the victim), keep every rank's
stacks, and exit with the hang's exit code. Stopping it through the hang check, not through
MindSpore's timeout, shows in ``summary.json``: a ``stall`` and no ``consequence``.

Wall-clock bounds are not asserted here (the machine is noisy); ``bench/bench_progress.py``
measures hang-to-exit times.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

import pytest
from helpers import (
    TESTS,
    assert_no_job_processes,
    checksums,
    job_pids,
    run_launcher,
    start_job,
    wait_for,
)

from launcher.hangs.stalls import HANG_EXIT_CODE

pytestmark = pytest.mark.mindspore
PLAIN = str(TESTS / "plain_scripts" / "plain_loop.py")
SLEEP_LINE = next(n for n, line in enumerate(Path(PLAIN).read_text().splitlines(), 1)
                  if "time.sleep(3600)" in line)


def _hang(tmp: Path, job: str, *options: str, style: str = "loop",
          env: Optional[dict[str, str]] = None) -> tuple[int, str, dict]:
    proc = start_job(tmp / "logs", job, PLAIN, "--style", style, "--steps", "400",
                     "--hang-rank", "1", "--hang-at-step", "3", options=options, env=env)
    wait_for(lambda: job_pids(job), "the job's processes")
    seen = tuple(job_pids(job))
    out, err = proc.communicate(timeout=600)
    assert_no_job_processes(job, seen)
    summary = json.loads((tmp / "logs" / "summary.json").read_text())
    return proc.returncode, err, summary


@pytest.mark.parametrize("style", ["loop", "model"])
def test_the_sleeping_rank_is_blamed_with_its_stack(weird_tmp: Path, style: str) -> None:
    code, err, summary = _hang(weird_tmp, f"hang-{style}", "--hang-timeout", "6", style=style)
    assert code == HANG_EXIT_CODE, err[-3000:]
    assert "rank 1 on" in err and "hangs: no progress for" in err, err[-3000:]
    assert "while rank(s) 0 wait in MindSpore" in err
    assert "hang_here" in err.split("rank 1 is at")[1].split("rank 0 is at")[0], \
        "the straggler's own frame is in the root-cause block"
    cause = summary["root_cause"]
    assert (cause["outcome"], cause["rank"], cause["ranks"], cause["consequence"]) == (
        "stalled", 1, [0], None)
    assert summary["stall"]["rank"] == 1 and summary["stall"]["others_advanced"] is False
    stacks = weird_tmp / "logs" / "stacks"
    rank1 = (stacks / "rank_1.txt").read_text()
    assert f'plain_loop.py", line {SLEEP_LINE} in hang_here' in rank1, "the sleep itself"
    assert rank1.count("hread 0x") >= 2, "every thread was dumped, not just the main one"
    assert "mindspore" in (stacks / "rank_0.txt").read_text()
    if shutil.which("py-spy"):
        native = (stacks / "rank_0.native.txt").read_text()
        assert "libmindspore" in native, native[:2000]
        assert "time_sleep" in (stacks / "rank_1.native.txt").read_text()


def test_a_communication_timeout_is_the_consequence_of_the_stalled_rank(weird_tmp: Path) -> None:
    """--hang-timeout longer than MindSpore's own communication timeout: rank 0 raises first,
    rank 1 is blamed. That timeout is about 30 s on CPU; ``MS_CPU_COMM_OP_TIMEOUT`` (read by
    MindSpore's CPU collective) brings it to 5 s, and the job from about 50 s to 17 s."""
    env = {**os.environ, "MS_CPU_COMM_OP_TIMEOUT": "5"}
    code, err, summary = _hang(weird_tmp, "hang-victim", "--hang-timeout", "300", env=env)
    assert code == HANG_EXIT_CODE, err[-3000:]
    assert "rank 1 on" in err and "hangs: no progress for" in err, err[-3000:]
    assert "rank 0's failure followed from it (it waited on rank 1)" in err, err[-3000:]
    assert "raised RuntimeError" in err
    cause = summary["root_cause"]
    assert (cause["outcome"], cause["rank"], cause["ranks"]) == ("stalled", 1, [0])
    assert (cause["consequence"]["rank"], cause["consequence"]["exception"]) == (0, "RuntimeError")
    assert summary["stall"] is None, "the hang check itself did not fire"


def test_detection_changes_nothing_the_script_computes(weird_tmp: Path) -> None:
    sums = {}
    for timeout in ("0", "600"):
        result = run_launcher("--device", "cpu", "--cards", "2", "--log-dir",
                              str(weird_tmp / f"logs-{timeout}"), "--hang-timeout", timeout,
                              PLAIN, "--style", "cell", "--steps", "8", "--graph")
        assert result.returncode == 0, result.stderr[-3000:]
        sums[timeout] = set(checksums(result.stdout).values())
        assert len(sums[timeout]) == 1
    assert sums["0"] == sums["600"]
    events = (weird_tmp / "logs-600" / "events" / "rank_0.jsonl").read_text()
    assert '"event": "progress"' in events
    assert '"event": "progress"' not in (weird_tmp / "logs-0" / "events" / "rank_0.jsonl").read_text()
