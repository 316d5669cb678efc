"""One rank busy alone is no hang; a rank frozen for good is (issue 38), on real MindSpore jobs.

Two CPU ranks of a plain data-parallel script (``tests/plain_scripts/busy_alone.py``: nothing of
npu-launch imported) where, after a step, rank 0 alone writes a file, saves arrays, runs ``tar``
or ``cp``, evaluates or uploads while rank 1 waits for it in the next step's all-reduce; a
recompilation for a new shape, a slow data source, a warm-up of all-reduces before training.
Every job runs with the default options but ``--hang-floor 1``: the learnt limit is then 5 x the
longest interval between progress events, about 1-2 s for these steps of tens of ms, so episodes
of 4 s (several times the limit) prove the point in a short job; with the default floor of 10 s
they would have to last over 10 s each (``bench/bench_hang_limits.py`` runs them for 60 s).
A rank that freezes (sleeps, waits on a lock it holds, reads a pipe nobody writes) is still
named, with its stack, and the job stopped with 124.

Wall-clock bounds are not asserted (the machine is noisy).
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from helpers import TESTS, assert_no_job_processes, checksums, run_launcher

from launcher.hangs.hang_limits import LEARNT_FILE
from launcher.hangs.stalls import HANG_EXIT_CODE

pytestmark = pytest.mark.mindspore
BUSY = str(TESTS / "plain_scripts" / "busy_alone.py")
CPU = ("--device", "cpu", "--cards", "2")
FLOOR = ("--hang-floor", "1")
EPISODE_S = 4
ALONE_ON_RANK_0 = ("write", "npsave", "pickle", "tar", "cp", "eval", "upload")
FIRST = 100
"""The first episode's step: 2 s of GRAPH steps, several intervals to learn the limit from
(progress is reported at most twice a second); until one is seen the limit is 600 s."""


def _busy_job(logs: Path, job: str, *script_args: str, options: tuple[str, ...] = FLOOR) -> dict:
    """Run the script to the end; it must succeed. Returns its ``summary.json``."""
    result = run_launcher(*CPU, "--job-id", job, "--log-dir", str(logs), *options, BUSY,
                          *script_args)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["outcome"] == "succeeded" and summary["stall"] is None, summary["stall"]
    sums = checksums(result.stdout)
    assert len(sums) == 2 and len(set(sums.values())) == 1, sums
    assert_no_job_processes(job)
    return summary


def _episodes() -> list[str]:
    """Rank 0 alone, one kind after the other every 3 steps from ``FIRST``, then every rank's
    recompilation for a new shape, then rank 1's slow data source."""
    alone = [f"{kind}:0:{FIRST + 3 * n}:{EPISODE_S}" for n, kind in enumerate(ALONE_ON_RANK_0)]
    last = FIRST + 3 * len(ALONE_ON_RANK_0)
    alone += [f"shape:0:{last}:0", f"slowdata:1:{last + 3}:{EPISODE_S}"]
    return [arg for spec in alone for arg in ("--alone", spec)]


def test_a_rank_busy_alone_between_steps_is_no_hang(weird_tmp: Path) -> None:
    """A loop in GRAPH mode: each of rank 0's episodes lasts several learnt limits while rank 1
    waits; summary.json keeps rank 0's longest spell of being busy alone. A spell must not be
    learnt as an interval between steps: the limit would then grow to 5 x the spell, and the
    episodes after it would prove nothing."""
    logs = weird_tmp / "logs"
    summary = _busy_job(logs, "busy-loop", "--graph", "--steps", str(FIRST + 35), *_episodes())
    assert "0" in summary["busy_alone"], summary["busy_alone"]
    learnt = json.loads((logs / LEARNT_FILE).read_text())
    assert learnt["intervals"] > 0, "no limit was learnt: the episodes were judged by 600 s"
    # A spell lasts EPISODE_S; a step's interval, even on a loaded machine, well under it.
    assert learnt["longest"] < EPISODE_S - 1, f"a busy spell was learnt as a step interval: {learnt}"


def test_a_model_train_callback_busy_alone_is_no_hang(weird_tmp: Path) -> None:
    """``Model.train`` in PyNative mode (steps of about 70 ms): rank 0's callback writes a file
    after step 25 and evaluates (PyNative) at the end of the first epoch."""
    summary = _busy_job(weird_tmp / "logs", "busy-model", "--style", "model", "--steps", "30",
                        "--epochs", "2", "--alone", f"write:0:25:{EPISODE_S}", "--alone",
                        f"eval:0:29:{EPISODE_S}")
    assert "0" in summary["busy_alone"], summary["busy_alone"]


def test_all_reduces_before_the_first_step_are_no_hang(weird_tmp: Path) -> None:
    """As mindcv starts: two all-reduces after ``init()``, before the training graph is even
    compiled, with the default floor."""
    _busy_job(weird_tmp / "logs", "warm-up", "--graph", "--steps", "20", "--warmup-allreduce",
              "2", options=())


@pytest.mark.parametrize("freeze, mode", [
    ("sleep:1:3", ("--graph",)),
    ("lock:1:5:inside", ()),
    ("pipe:1:100", ("--graph",)),
], ids=["sleep-between-steps", "lock-inside-a-step", "pipe-at-step-100"])
def test_a_frozen_rank_is_named_and_the_job_stopped(weird_tmp: Path, freeze: str,
                                                    mode: tuple[str, ...]) -> None:
    """Rank 1 freezes for good (before step 3, inside step 5's forward pass in PyNative, before
    step 100 of 400: past ``FIRST``'s 2 s of steps, judged by the limit learnt from their
    intervals): named as the rank that hangs, its stack kept, nothing left running."""
    logs, job = weird_tmp / "logs", f"frozen-{freeze.split(':')[0]}"
    result = run_launcher(*CPU, "--job-id", job, "--log-dir", str(logs), *FLOOR, BUSY, *mode,
                          "--steps", "400", "--freeze", freeze)
    assert result.returncode == HANG_EXIT_CODE, result.stderr[-3000:]
    assert "rank 1 freezes at " in result.stdout, result.stdout[-2000:]
    head = next((line for line in result.stderr.splitlines() if " stopped: " in line), "")
    assert f"rank 1 on {socket.gethostname()} hangs" in head, result.stderr[-3000:]
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["root_cause"]["rank"] == 1, summary["root_cause"]
    assert (logs / "stacks" / "rank_1.txt").is_file()
    assert_no_job_processes(job)
