"""The main job end to end through npu-launch: accuracy, the aggregator's files, the report, a
killed rank that resumes to the same parameters, and a diverged replica that is caught."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, RANK_SCRIPTS, assert_no_job_processes, run_launcher

pytestmark = pytest.mark.mindspore
MAIN = str(REPO / "scripts" / "train_digits.py")
FAULTS = str(RANK_SCRIPTS / "digits_faults.py")
LINE = re.compile(r"rank (\d): held-out accuracy ([\d.]+) after (\d+) steps .*checksum ([\d.]+)")


def _results(stdout: str) -> dict[int, tuple[float, int, str]]:
    return {int(m[1]): (float(m[2]), int(m[3]), m[4]) for m in LINE.finditer(stdout)}


def test_main_job_trains_to_95_percent_on_two_ranks(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "digits", "--log-dir",
                          str(logs), MAIN, "--epochs", "10")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    ranks = _results(result.stdout)
    assert set(ranks) == {0, 1}
    assert all(accuracy >= 0.95 for accuracy, _, _ in ranks.values()), ranks
    assert ranks[0][2] == ranks[1][2], "data-parallel replicas must end equal"
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["outcome"] == "succeeded" and summary["exit_code"] == 0
    assert [r["exit_code"] for r in summary["ranks"]] == [0, 0]
    assert all(r["steps"] == ranks[0][1] for r in summary["ranks"])
    assert summary["checkpoints"], "checkpoint events reach the summary"
    manifests = sorted((logs / "checkpoints").glob("step_*/manifest.json"))
    assert 1 <= len(manifests) <= 3, "keep the last 3 complete checkpoints"
    steps = [json.loads(l) for l in (logs / "metrics.jsonl").read_text().splitlines()]
    assert {e.get("rank") for e in steps if e.get("event") == "step"} == {0, 1}
    report = run_launcher("report", str(logs))
    assert report.returncode == 0, report.stderr
    assert (logs / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_no_job_processes("digits")


def test_killed_rank_restarts_and_resumes_to_the_same_parameters(weird_tmp: Path) -> None:
    straight, resumed = weird_tmp / "straight", weird_tmp / "resumed"
    common = ("--device", "cpu", "--cards", "2", "--console", "none")
    first = run_launcher(*common, "--log-dir", str(straight / "logs"), MAIN, "--epochs", "3",
                         "--save-params", str(straight / "params"))
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((straight / "logs" / "summary.json").read_text())
    steps_per_epoch = summary["ranks"][0]["steps"] // 3
    kill_at = steps_per_epoch + steps_per_epoch // 2  # mid-epoch 2, after epoch 1's checkpoint
    second = run_launcher(*common, "--max-restarts", "1", "--job-id", "resume-job",
                          "--log-dir", str(resumed / "logs"), FAULTS, "--kill-at-step",
                          str(kill_at), "--epochs", "3", "--save-params", str(resumed / "params"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "restart 1 of 1 after: job resume-job failed: rank 1" in second.stderr
    assert "killed by SIGKILL" in second.stderr
    for rank in (0, 1):
        a = np.load(straight / "params" / f"rank{rank}.npz")
        b = np.load(resumed / "params" / f"rank{rank}.npz")
        assert set(a.files) == set(b.files)
        worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files)
        assert worst <= 1e-5, f"rank {rank}: resumed parameters differ by {worst}"
    assert_no_job_processes("resume-job")


def test_diverged_replica_is_caught_and_named(weird_tmp: Path) -> None:
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "diverged", "--log-dir", str(weird_tmp / "logs"), FAULTS,
                          "--perturb-rank", "1", "--epochs", "2")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "rank(s) 1 disagree" in result.stderr, result.stderr[-3000:]
    assert_no_job_processes("diverged")
