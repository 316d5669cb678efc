"""The main job end to end through npu-launch: accuracy, the aggregator's files, the report,
evaluations and the execution mode reaching them, and a diverged replica that is caught. (A
killed rank that resumes to the same parameters: tests/ranks/test_last_words_ranks.py.)"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, REPO, assert_no_job_processes, run_launcher

pytestmark = pytest.mark.mindspore
MAIN = str(REPO / "scripts" / "train_digits.py")
FAULTS = str(RANK_SCRIPTS / "digits_faults.py")
LINE = re.compile(r"rank (\d): held-out accuracy ([\d.]+) after (\d+) steps .*checksum ([\d.]+)")


def _results(stdout: str) -> dict[int, tuple[float, int, str]]:
    return {int(m[1]): (float(m[2]), int(m[3]), m[4]) for m in LINE.finditer(stdout)}


def _records(logs: Path, rank: int, event: str) -> list[dict]:
    lines = (logs / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("rank") == rank and r.get("event") == event]


def _modes(logs: Path, rank: int, event: str) -> list[str]:
    return [r.get("exec_mode") for r in _records(logs, rank, event)]


def test_main_job_trains_to_95_percent_on_two_ranks(weird_tmp: Path) -> None:
    """Accuracy, the aggregator's files, and every evaluation and the execution mode reaching
    summary.json, metrics.jsonl and the report (one job: the evaluations' own test ran a
    second, shorter copy of it)."""
    logs, epochs = weird_tmp / "logs", 3  # 0.9833 on both ranks (10 epochs: 0.9917)
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "digits", "--log-dir",
                          str(logs), MAIN, "--epochs", str(epochs))
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
    steps = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert {e.get("rank") for e in steps if e.get("event") == "step"} == {0, 1}
    _assert_every_evaluation_in_graph_mode(logs, summary, ranks, epochs)
    report = run_launcher("report", str(logs))
    assert report.returncode == 0, report.stderr
    assert (logs / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "execution: graph mode" in report.stdout.splitlines()
    rows = [line.split() for line in report.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [row[6:8] for row in rows] == [["graph", f"{ranks[0][0]:.4f}"],
                                          ["graph", f"{ranks[1][0]:.4f}"]]
    assert_no_job_processes("digits")


def _assert_every_evaluation_in_graph_mode(logs: Path, summary: dict,
                                           printed: dict[int, tuple[float, int, str]],
                                           epochs: int) -> None:
    for rank in summary["ranks"]:
        steps, r = rank["steps"], rank["rank"]
        each = [(epoch, steps * epoch // epochs) for epoch in range(1, epochs + 1)]
        assert [(e["epoch"], e["step"]) for e in _records(logs, r, "eval")] == each
        assert [(e["epoch"], e["step"]) for e in rank["evals"]] == each
        assert rank["eval"] == rank["evals"][-1]
        assert rank["eval"]["accuracy"] == pytest.approx(printed[r][0], abs=6e-5)
        assert rank["eval"]["accuracy"] >= 0.8 and 0 < rank["eval"]["loss"] < 1
        # Without --debug the train step runs in GRAPH_MODE: init() says so, and so does fit().
        assert _modes(logs, r, "initialised") == ["graph"]  # once, by the rank hook
        assert _modes(logs, r, "layout") == ["graph"]  # parallel.init()
        assert _modes(logs, r, "step")[0] == "graph"
        assert _modes(logs, r, "finished") == ["graph"] and rank["exec_mode"] == "graph"
        assert "PyNative mode" not in (logs / f"rank_{r}.log").read_text()


def test_diverged_replica_is_caught_and_named(weird_tmp: Path) -> None:
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "diverged", "--log-dir", str(weird_tmp / "logs"), FAULTS,
                          "--perturb-rank", "1", "--epochs", "2")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "rank(s) 1 disagree" in result.stderr, result.stderr[-3000:]
    assert_no_job_processes("diverged")


def test_debug_runs_the_main_job_in_pynative_and_says_so(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher("--debug", "--device", "cpu", "--job-id", "digits-debug",
                          "--log-dir", str(logs), MAIN, "--epochs", "1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "PyNative mode (chosen by --debug)" in result.stderr  # a foreground rank: no rank log
    assert _modes(logs, 0, "initialised") == []  # no communication init in debug
    assert _modes(logs, 0, "layout") == ["pynative"]
    assert _modes(logs, 0, "finished") == ["pynative"]
    [rank] = json.loads((logs / "summary.json").read_text())["ranks"]
    assert rank["exec_mode"] == "pynative" and rank["eval"]["epoch"] == 1
    assert_no_job_processes("digits-debug")


def test_one_card_is_a_cluster_of_one_in_the_foreground_and_its_switch_to_pynative_is_told(
        weird_tmp: Path) -> None:
    """One card: the rank runs in the foreground (it inherits the terminal: no log file, no
    prefix) and ``init()`` still forms MindSpore's cluster of one (the scheduler's log); a
    switch to PyNative after ``init()`` is reported as what the steps ran in."""
    script = weird_tmp / "switch after init.py"
    script.write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(REPO / "scripts")!r})
        import mindspore as ms
        import train_digits

        trainer, _ = train_digits.build(train_digits.parse_args(["--epochs", "1"]))
        ms.set_context(mode=ms.PYNATIVE_MODE)
        trainer.fit(epochs=1)
        print("rank 0 switched and trained", flush=True)
        """))
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "1", "--job-id", "digits-switch",
                          "--log-dir", str(logs), str(script))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "rank 0 switched and trained" in result.stdout.splitlines()
    assert not (logs / "rank_0.log").exists() and (logs / "scheduler.log").exists()
    assert _modes(logs, 0, "initialised") == ["graph"] and _modes(logs, 0, "layout") == ["graph"]
    assert _modes(logs, 0, "step")[0] == "pynative" and _modes(logs, 0, "finished") == ["pynative"]
    [rank] = json.loads((logs / "summary.json").read_text())["ranks"]
    assert rank["exec_mode"] == "pynative"
    assert_no_job_processes("digits-switch")
