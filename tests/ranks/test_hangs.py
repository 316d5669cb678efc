"""Hangs in plain MindSpore scripts (``tests/plain_scripts``: nothing of npu-launch imported).

Rank 1 sleeps for an hour before its 4th step; rank 0 then waits in the step's all-reduce, and
MindSpore's CPU collective would raise there after about 30 s (on Ascend, HCCL's execution
timeout: 1836 s). The launcher sees progress through the rank hook alone, so it must stop the job
itself once --hang-timeout passed, blame rank 1 (not rank 0, the victim), keep every rank's
stacks, and exit with the hang's exit code. Stopping it through the hang check, not through
MindSpore's timeout, shows in ``summary.json``: a ``stall`` and no ``consequence``.

The same script with and without the rank hook (re-run with ``python -E``) ends with the same
parameters, and the job without it is not left waiting for its scheduler.

Wall-clock bounds are not asserted here (the machine is noisy); ``bench/bench_progress.py``
measures hang-to-exit times.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Optional

import pytest
from helpers import (
    RANK_SCRIPTS,
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


def test_the_sleeping_rank_is_blamed_with_its_stack(weird_tmp: Path) -> None:
    code, err, summary = _hang(weird_tmp, "hang-loop", "--hang-timeout", "6")
    assert code == HANG_EXIT_CODE, err[-3000:]
    assert "rank 1 on" in err and "hangs: no progress for" in err, err[-3000:]
    assert "while rank(s) 0 wait in MindSpore" in err
    assert "hang_here" in err.split("rank 1 is at")[1].split("rank 0 is at")[0], \
        "the straggler's own frame is in the root-cause block"
    cause = summary["root_cause"]
    assert (cause["outcome"], cause["rank"], cause["ranks"], cause["consequence"]) == (
        "stalled", 1, [0], None)
    assert summary["stall"]["rank"] == 1 and summary["stall"]["waiting"] == [0]
    assert summary["stall"]["how"] == "its stack is outside MindSpore", \
        "--hang-timeout judges progress alone: no reading of the rank's process is quoted"
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
    MindSpore's CPU collective) brings it to 5 s, and the job from about 50 s to 17 s.

    The ranks train with ``Model.train`` (the loop above is a script's own): the rank hook's
    count of its steps is what tells the stalled rank from its victim here. (A hang of
    ``Model.train`` ranks named by the hang check itself was a third job, the test above with
    this style; the check is the same for both styles once the hook counts the steps.)"""
    env = {**os.environ, "MS_CPU_COMM_OP_TIMEOUT": "5"}
    code, err, summary = _hang(weird_tmp, "hang-victim", "--hang-timeout", "300", style="model",
                               env=env)
    assert code == HANG_EXIT_CODE, err[-3000:]
    assert "rank 1 on" in err and "hangs: no progress for" in err, err[-3000:]
    assert "rank 0's failure followed from it (it waited on rank 1)" in err, err[-3000:]
    assert "raised RuntimeError" in err
    cause = summary["root_cause"]
    assert (cause["outcome"], cause["rank"], cause["ranks"]) == ("stalled", 1, [0])
    assert (cause["consequence"]["rank"], cause["consequence"]["exception"]) == (0, "RuntimeError")
    assert summary["stall"] is None, "the hang check itself did not fire"


def test_the_hook_changes_nothing_computed_and_a_rank_without_it_is_found(weird_tmp: Path) -> None:
    """The rank hook with its progress counting (hang detection on) against no hook at all: the
    same parameters. The job without it is the script re-run with ``python -E``
    (``rank_scripts/isolated.py``): its ranks never say they import MindSpore, and npu-launch
    finds them from their processes (``launcher.run.hookless``) and starts the scheduler, with
    one note (before that, such a job waited for its scheduler with no end)."""
    job = (PLAIN, "--style", "cell", "--steps", "8", "--graph")
    hooked = run_launcher("--device", "cpu", "--cards", "2", "--log-dir",
                          str(weird_tmp / "logs-hook"), "--hang-timeout", "600", *job)
    assert hooked.returncode == 0, hooked.stderr[-3000:]
    assert '"event": "progress"' in (weird_tmp / "logs-hook" / "events" / "rank_0.jsonl").read_text()
    bare = start_job(weird_tmp / "logs-bare", "hookless", str(RANK_SCRIPTS / "isolated.py"), *job)
    try:
        out, err = bare.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        bare.send_signal(signal.SIGTERM)
        out, err = bare.communicate(timeout=60)
        pytest.fail(f"the job waited for its scheduler: {err[-3000:]}")
    assert bare.returncode == 0, err[-3000:]
    notes = [line for line in err.splitlines() if "without npu-launch's rank hook" in line]
    assert len(notes) == 1 and notes[0].startswith("npu-launch: note: rank "), err[-3000:]
    assert "MindSpore's scheduler was started when it was found" in notes[0]
    assert '"event": "progress"' not in (weird_tmp / "logs-bare" / "events" /
                                         "rank_0.jsonl").read_text(), "no hook, no counting"
    sums = {"hook": set(checksums(hooked.stdout).values()), "none": set(checksums(out).values())}
    assert len(sums["hook"]) == 1 and sums["hook"] == sums["none"], sums
    assert_no_job_processes("hookless")
