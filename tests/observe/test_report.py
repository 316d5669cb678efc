"""``npu-launch report``: the summary table and the PNG, from files the real monitor wrote."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from helpers import exited, feed

from launcher.observe.job_files import summary_from_metrics
from launcher.observe.metrics_records import events_of, read_records
from launcher.observe.monitor import JobMonitor
from launcher.observe.report import EvalSeries, eval_series, report
from parallel import contract
from parallel.contract import METRICS_FILE, SUMMARY_FILE

HOSTS = {0: "node-a", 1: "node-a", 2: "node b"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_job(log_dir: Path, close: bool = True, evals: bool = True) -> None:
    """A 3-rank job of 40 steps through the real monitor; rank 2 is slower and lags, and its train
    step ran in PyNative although init() chose graph. Each 20-step epoch ends with an evaluation
    (accuracy 0.5 then 0.9, plus 0.01 per rank; loss 1.0 then 0.25)."""
    now = [500.0]
    monitor = JobMonitor(str(log_dir), "job-7", HOSTS, open(os.devnull, "w"), live=False,
                         clock=lambda: now[0])
    for rank in HOSTS:
        feed(monitor, {"event": "initialised", "rank": rank, "host": HOSTS[rank], "time": 500.0,
                          "exec_mode": "graph"})
    for n in range(1, 41):
        now[0] = 500.0 + n
        for rank in HOSTS:
            feed(monitor, {"event": "step", "rank": rank, "host": HOSTS[rank], "pid": 1,
                              "time": 500.0 + n, "step": n, "epoch": n // 20,
                              "loss": 2.0 / n + 0.01 * rank, "samples_per_s": 300.0 - 80 * (rank == 2)})
        if n % 20 == 0 and evals:
            for rank in HOSTS:
                feed(monitor, {"event": contract.EVENT_EVAL, "rank": rank, "host": HOSTS[rank],
                                  "time": 500.0 + n, "epoch": n // 20, "step": n,
                                  "loss": 1.0 if n == 20 else 0.25, "samples": 360,
                                  "accuracy": (0.5 if n == 20 else 0.9) + 0.01 * rank})
        if n % 20 == 0:
            feed(monitor, {"event": "checkpoint", "rank": 0, "host": "node-a", "time": 500.0 + n,
                              "step": n, "path": f"/ckpt/step_{n}/rank_0.ckpt"})
    now[0] = 541.0
    for rank in HOSTS:
        feed(monitor, {"event": "finished", "rank": rank, "host": HOSTS[rank], "time": 541.0,
                          "steps": 40, "final_loss": 0.06, "samples_per_s": 290.0,
                          "exec_mode": "pynative" if rank == 2 else "graph"})
        exited(monitor, rank, 0 if rank != 2 else 3, HOSTS, at=541.0)
    if close:
        monitor.close("failed", 3, "npu-launch: job job-7 failed: rank 2 on node b exited with code 3")
    else:
        monitor.tick()  # flushes metrics.jsonl, as the running supervisor would


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def invoke(*args: str):
    return CliRunner().invoke(report, [*args], catch_exceptions=False)


def test_report_prints_the_summary_and_writes_the_plot(weird_tmp: Path) -> None:
    write_job(weird_tmp)
    result = invoke(str(weird_tmp))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "job job-7: failed, exit code 3, 41.0 s, 3 rank(s)"
    assert "throughput 870.0 samples/s (all ranks), last step 40" in result.output
    assert "checkpoints: 2 file(s) at 2 step(s), last 20, 40" in result.output
    assert "npu-launch: job job-7 failed: rank 2 on node b exited with code 3" in result.output
    assert "execution: graph on ranks 0-1, pynative on rank 2" in lines
    header = next(line for line in lines if line.lstrip().startswith("rank"))
    assert header.split() == ["rank", "host", "exit", "steps", "final", "loss", "samples/s", "mode",
                              "eval", "acc", "eval", "loss", "last", "event"]
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["0"], ["2"])}
    assert rows["2"][:10] == ["2", "node", "b", "3", "40", "0.06", "290.0", "pynative", "0.9200",
                              "0.25"]
    assert rows["0"][:9] == ["0", "node-a", "0", "40", "0.06", "290.0", "graph", "0.9000", "0.25"]
    png = weird_tmp / "report.png"
    assert f"plot: {png}" in result.output
    assert png_size(png) == (900, 900)


def test_report_without_summary_derives_it_from_metrics(weird_tmp: Path) -> None:
    write_job(weird_tmp, close=False)
    assert not (weird_tmp / SUMMARY_FILE).exists()
    out = weird_tmp / "elsewhere.png"
    result = invoke(str(weird_tmp), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"no {SUMMARY_FILE}: derived from {METRICS_FILE} "
                                    "(outcome unknown)\njob job-7: unknown, exit code -, 41.0 s, "
                                    "3 rank(s)\n")
    row = next(line.split() for line in result.output.splitlines() if line.split()[:1] == ["2"])
    assert row[:7] == ["2", "node", "b", "3", "40", "0.06", "290.0"]  # exit code from 'exited'
    assert row[7:10] == ["pynative", "0.9200", "0.25"]
    assert png_size(out)[0] == 900 and not (weird_tmp / "report.png").exists()


def test_summary_from_metrics_has_the_evaluations_and_modes_summary_json_has(
        weird_tmp: Path) -> None:
    write_job(weird_tmp)
    written = json.loads((weird_tmp / SUMMARY_FILE).read_text())["ranks"]
    derived = summary_from_metrics(str(weird_tmp / METRICS_FILE))["ranks"]
    keys = ("rank", "exec_mode", "eval", "evals")
    assert [{k: r[k] for k in keys} for r in derived] == [{k: r[k] for k in keys} for r in written]
    assert [(e["epoch"], e["step"], e["accuracy"]) for e in derived[1]["evals"]] == [
        (1, 20, 0.51), (2, 40, 0.91)]
    assert [r["exec_mode"] for r in derived] == ["graph", "graph", "pynative"]


def test_eval_series_per_rank_and_the_held_out_panel(weird_tmp: Path) -> None:
    import matplotlib.image

    for name in ("with", "without"):
        (weird_tmp / name).mkdir()
        write_job(weird_tmp / name, evals=name == "with")
    series = eval_series(events_of(read_records(str(weird_tmp / "with" / METRICS_FILE))))
    assert series[2] == EvalSeries(2, (20, 40), (1.0, 0.25), (0.52, 0.92))
    assert [s.rank for s in series] == [0, 1, 2]

    def rank0_pixels_in_bottom_panel(log_dir: Path) -> int:
        assert invoke(str(log_dir)).exit_code == 0
        image = matplotlib.image.imread(str(log_dir / "report.png"))[:, :, :3]
        bottom = image[int(image.shape[0] * 0.68):]
        return int(np.all(np.abs(bottom - np.array([0x1f, 0x77, 0xb4]) / 255) < 0.01,
                          axis=-1).sum())  # matplotlib's C0, rank 0's colour
    assert rank0_pixels_in_bottom_panel(weird_tmp / "with") > 50
    assert rank0_pixels_in_bottom_panel(weird_tmp / "without") == 0


def test_unreadable_summary_falls_back_to_metrics(weird_tmp: Path) -> None:
    write_job(weird_tmp)
    (weird_tmp / SUMMARY_FILE).write_text('{"job_id": "job-7", "outc')
    result = invoke(str(weird_tmp), "--no-plot")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].endswith(f"derived from {METRICS_FILE} (outcome unknown)")
    assert "unreadable" in result.output.splitlines()[0]


def test_no_plot_writes_no_png(weird_tmp: Path) -> None:
    write_job(weird_tmp)
    result = invoke(str(weird_tmp), "--no-plot")
    assert result.exit_code == 0 and "plot:" not in result.output
    assert not (weird_tmp / "report.png").exists()


def test_a_job_without_step_events_gets_a_table_and_no_plot(weird_tmp: Path) -> None:
    monitor = JobMonitor(str(weird_tmp), "job-8", {0: "h"}, open(os.devnull, "w"), live=False)
    feed(monitor, {"event": "initialised", "rank": 0, "host": "h", "time": 1.0})
    monitor.close("startup-timeout", 1)
    result = invoke(str(weird_tmp))
    assert result.exit_code == 0, result.output
    assert "job job-8: startup-timeout, exit code 1" in result.output
    assert "no step events" in result.output and not (weird_tmp / "report.png").exists()


def test_bad_log_dirs_are_one_line_errors_exit_2(weird_tmp: Path) -> None:
    missing = invoke(str(weird_tmp / "nope"))
    assert missing.exit_code == 2
    assert missing.output == f"Error: {weird_tmp / 'nope'}: no such log directory\n"

    empty = invoke(str(weird_tmp))
    assert empty.exit_code == 2
    assert empty.output.startswith(f"Error: {weird_tmp}: no {SUMMARY_FILE} and no {METRICS_FILE}")
    assert empty.output.count("\n") == 1

    (weird_tmp / METRICS_FILE).write_text("")
    bad_output = invoke(str(weird_tmp), "-o", str(weird_tmp / "no dir" / "r.png"))
    assert bad_output.exit_code == 2 and "its folder does not exist" in bad_output.output


def test_importing_report_does_not_import_matplotlib() -> None:
    code = "import sys, launcher.observe.report; print(sorted(m for m in sys.modules if 'matplotlib' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

