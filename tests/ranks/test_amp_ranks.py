"""Dynamic loss scaling inside real ranks: a 2-rank AMP O1 job started by npu-launch.

An overflow (on every rank, or on one rank only) halves the scale on every rank alike and skips
that update on every rank alike, so the replicas never drift apart.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, run_launcher

pytestmark = pytest.mark.mindspore
POISON_STEP = 9  # rank 1 alone reads a float16-overflowing batch here (tests/rank_scripts/amp_overflow.py)


def _records(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]


def _halved_and_skipped(before: dict, after: dict) -> bool:
    return after["scale"] == before["scale"] / 2 and after["checksum"] == before["checksum"]


def _updated_at_same_scale(before: dict, after: dict) -> bool:
    return after["scale"] == before["scale"] and after["checksum"] != before["checksum"]


def test_an_overflow_halves_the_scale_and_skips_the_update_on_every_rank_alike(weird_tmp: Path) -> None:
    out = weird_tmp / "steps"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "amp-overflow",
                          "--log-dir", str(weird_tmp / "logs"), str(RANK_SCRIPTS / "amp_overflow.py"),
                          "--out", str(out), "--poison-step", str(POISON_STEP))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert_no_job_processes("amp-overflow")
    rank0, rank1 = _records(out, 0), _records(out, 1)
    assert [r["step"] for r in rank0] == list(range(13)), "fit start and 12 steps"
    assert rank0 == rank1, "scale and parameters must be equal on both ranks after every step"
    steps = list(zip(rank0, rank0[1:]))
    assert _halved_and_skipped(*steps[0]), "2**24 overflows float16 gradients at once"
    assert all(_halved_and_skipped(a, b) or _updated_at_same_scale(a, b) for a, b in steps), \
        "every step either overflows (halve, skip) or updates at an unchanged scale"
    assert _updated_at_same_scale(*steps[POISON_STEP - 2]), "the step before the poisoned one is clean"
    assert _halved_and_skipped(*steps[POISON_STEP - 1]), "rank 1's overflow skips rank 0's update too"
    assert _updated_at_same_scale(*steps[-1]), "training goes on after the overflow"
    skipped = {line for line in result.stdout.splitlines() if "skipped" in line}
    expected = sum(_halved_and_skipped(a, b) for a, b in steps)
    assert {line.split("] ", 1)[1].split(" (pid")[0] for line in skipped} == {
        f"rank 0: skipped {expected} of 12", f"rank 1: skipped {expected} of 12"}
