"""Where a rank's time goes (``launcher.observe.startup``): real ranks of a plain MindSpore script, whose
phases must add up to the rank's life as the kernel and the supervisor saw it; and the folding
of events, the job's slowest ranks, the report's reading of a hand-edited summary."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil
from helpers import TESTS, assert_no_job_processes, job_pids, npu_launch_argv, run_launcher, wait_for

from launcher.observe.startup import PHASES, describe, job_phases, slowest_ranks
from launcher.ranks.record import RankRecord
from parallel.contract import Event

PLAIN = str(TESTS / "rank_scripts" / "plain_job.py")
JOB = "phases-of-plain-ranks"


def test_phases_add_up_to_each_ranks_life(weird_tmp: Path) -> None:
    """The phases the launcher folds from a rank's events add up to its process's life. The
    ranks are plain Python writing the contract's events (``plain_job.py``): the fold is the
    launcher's; that MindSpore's own ranks write those events is shown by the rank hook's tests
    (``test_hang_limits.py``, ``test_hangs.py``)."""
    logs = weird_tmp / "logs"
    argv = npu_launch_argv("--device", "cpu", "--cards", "2", "--job-id", JOB, "--log-dir",
                           str(logs), PLAIN, "--steps", "30", "--sleep-after-init", "0.5")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(job_pids(JOB)) >= 2 or proc.poll() is not None, "the ranks")
    created = {}
    for pid in job_pids(JOB):
        try:
            p = psutil.Process(pid)
            rank = p.environ().get("RANK_ID")
            if rank is not None and "plain_job.py" in " ".join(p.cmdline()):
                created[int(rank)] = p.create_time()
        except psutil.Error:
            continue
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "where the time went (slowest rank): process" in err
    summary = json.loads((logs / "summary.json").read_text())
    exits = {r["rank"]: r["time"] for r in map(json.loads, (logs / "metrics.jsonl").open())
             if r.get("event") == "exited"}
    assert set(created) == {0, 1}
    for row in summary["ranks"]:
        phases = row["phases"]
        assert all(phases[name] is not None and phases[name] >= 0 for name in PHASES), phases
        assert phases["first_step"] > 0 and phases["init"] > 0
        life = exits[row["rank"]] - created[row["rank"]]
        assert abs(sum(phases.values()) - life) < 0.05, (phases, life)
    for name in PHASES:
        job = summary["phases"][name]
        per_rank = {r["rank"]: r["phases"][name] for r in summary["ranks"]}
        assert job["seconds"] == max(per_rank.values())
        assert per_rank[job["slowest_rank"]] == job["seconds"]
    report = run_launcher("report", str(logs), "--no-plot")
    assert report.returncode == 0, report.stderr
    assert "where the time went:" in report.stdout and "first step" in report.stdout
    assert_no_job_processes(JOB)


def event(kind: str, at: float, **fields) -> Event:
    parsed = Event.parse({"event": kind, "rank": 0, "time": at, **fields})
    assert parsed is not None
    return parsed


def test_marks_fold_the_events_and_leave_unknown_phases_out() -> None:
    marks = RankRecord()
    for e in (event("started", 10.5, process_start=10.0), event("init-started", 12.0),
              event("initialised", 13.0), event("first-step", 15.0), event("progress", 16.0),
              event("progress", 20.0), event("exited", 21.0, returncode=0)):
        marks.observe(e)
    assert marks.phases() == {"process": 0.5, "imports": 1.5, "init": 1.0, "first_step": 2.0,
                              "training": 5.0, "exit": 1.0}
    no_init = RankRecord()
    for e in (event("started", 10.5, process_start="soon"), event("progress", 11.0),
              event("exited", 12.0, returncode=0)):
        no_init.observe(e)
    assert set(no_init.phases().values()) == {None}, "progress before a first step is not one"
    rebuilt = RankRecord()
    for e in (event("initialised", 1.0), event("first-step", 2.0),
              event("exited", 9.0, last_progress=8.0)):
        rebuilt.observe(e)  # from metrics.jsonl, which keeps no progress events
    assert (rebuilt.phases()["training"], rebuilt.phases()["exit"]) == (6.0, 1.0)


def test_the_slowest_rank_of_each_phase_is_named() -> None:
    ranks = {0: {"init": 1.0, "imports": 2.0}, 1: {"init": 3.0, "imports": None},
             2: {"init": 2.0, "imports": 1.0}}
    phases = job_phases(ranks)
    assert phases["init"] == {"slowest_rank": 1, "seconds": 3.0, "median": 2.0}
    assert phases["imports"] == {"slowest_rank": 0, "seconds": 2.0, "median": 1.5}
    assert phases["process"] is None
    assert describe(slowest_ranks(ranks)) == ("npu-launch: where the time went (slowest rank): "
                                              "imports 2.0 s (rank 0), init() 3.0 s (rank 1)")


def test_the_report_skips_phases_that_are_not_as_written(tmp_path: Path) -> None:
    summary = {"job_id": "j", "outcome": "succeeded", "exit_code": 0, "ranks": [],
               "phases": {"init": {"slowest_rank": 1, "seconds": 2.5, "median": 2.0},
                          "imports": {"slowest_rank": "x", "seconds": 1.0, "median": 1.0},
                          "exit": {"slowest_rank": 0, "seconds": float("nan"), "median": 0},
                          "training": [1, 2]}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    result = run_launcher("report", str(tmp_path), "--no-plot")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("  ")]
    assert [line.split()[0] for line in lines] == ["init()"], result.stdout
