"""``npu-launch report`` on hostile log directories, through the CLI's ``main`` in this process.

The rule: report what can be read and name, one line each, what could not (``skipped
metrics.jsonl:17: ...``), exit 0; when nothing at all can be read, exit 2 with one line. Never a
traceback or a hang, and no line of output that echoes a huge value or drives the terminal.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from helpers import run_cli_here, sparse, to_dev_zero
from test_report import png_size, write_job

from parallel.contract import METRICS_FILE, SUMMARY_FILE

TIMEOUT_S = 60
LONGEST_LINE = 1000


def a_job(log_dir: Path) -> tuple[dict[str, Any], bytes]:
    """The summary and metrics of the 3-rank job of ``test_report``, written by the real monitor."""
    write_job(log_dir)
    return json.loads((log_dir / SUMMARY_FILE).read_text()), (log_dir / METRICS_FILE).read_bytes()


def summary_changed(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def make(log_dir: Path) -> None:
        summary, _ = a_job(log_dir)
        change(summary)
        (log_dir / SUMMARY_FILE).write_text(json.dumps(summary))
    return make


def summary_is(content: Any, metrics: bool = True) -> Callable[[Path], None]:
    """summary.json replaced by ``content`` (bytes, text, or a function of its path)."""
    def make(log_dir: Path) -> None:
        a_job(log_dir)
        path = log_dir / SUMMARY_FILE
        path.unlink()
        if not metrics:
            (log_dir / METRICS_FILE).unlink()
        if callable(content):
            content(path)
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return make


def metrics_is(content: bytes, keep: bool = True) -> Callable[[Path], None]:
    """No summary.json; metrics.jsonl is ``content``, after the job's own lines if ``keep``."""
    def make(log_dir: Path) -> None:
        _, metrics = a_job(log_dir)
        (log_dir / SUMMARY_FILE).unlink()
        (log_dir / METRICS_FILE).write_bytes((metrics if keep else b"") + content)
    return make


def each_field(summary: dict[str, Any], value: Any) -> None:
    for key in list(summary):
        summary[key] = value



BROKEN_LINES = (b"not json\n" + "\xff\n".encode("latin-1") + b"x" * 3_000_000 + b"\n"
                + b'{"event": "step", "rank": 0, "step": ' + b"9" * 40 + b"}\n"
                + b'{"event": "step", "rank": 1e308, "step": 1}\n'
                + b'{"event": "step", "rank": -1, "step": 1}\n'
                + '{"event": "step", "rank": "\u00b2", "step": 1}\n'.encode()
                + b'{"event": "step", "rank": 0, "step": 41, "loss": "abc", "time": NaN}\n'
                + b"[" * 100_000 + b"\n" + b"[1, 2]\n")

ONLY_BROKEN = b"not json\n\xff\n[1, 2]\n" + b"[" * 100_000 + b'\n{"event": "step", "rank": -1, "step": 1}\n'
"""Lines of which none is a record of a rank: the last one's rank is out of range."""

# name: (make the log directory, words that must appear in stdout, in this order)
REPORTED: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "ranks is an object": (summary_changed(lambda s: s.update(ranks={"a": 1})),
                           ("skipped summary.json:ranks: not a list, got an object", "job job-7: failed")),
    "ranks holds non-objects": (summary_changed(lambda s: s["ranks"].extend([1, "x", None, []])), (
        "skipped summary.json:ranks[3]: not an object, got 1", "skipped summary.json:ranks[6]: not an object, got a list",
        "    2 node b")),
    "strings where numbers belong": (
        summary_changed(lambda s: s.update(exit_code="abc", duration_s="long", world_size=[1], last_step={})), (
            'skipped summary.json:exit_code: not a whole number, got "abc"',
            'skipped summary.json:duration_s: not a number, got "long"',
            "skipped summary.json:world_size: not a whole number, got a list",
            "job job-7: failed, exit code -, -, - rank(s)")),
    "NaN and Infinity times": (
        summary_changed(lambda s: s.update(started_at=float("nan"), ended_at=float("inf"), duration_s=float("nan"))), (
            "skipped summary.json:started_at: not a time (seconds from 0 to 253402300799), got NaN",
            "skipped summary.json:ended_at: not a time", "got Infinity", "exit code 3, nan,", "started -, ended -")),
    "1e308 and negative times": (
        summary_changed(lambda s: s.update(started_at=1e308, ended_at=-1e10, duration_s=1e308,
                                           global_samples_per_s=-1e308)), (
            "skipped summary.json:started_at: not a time", "got 1e+308", "exit code 3, 1e+308,",
            "throughput -1e+308 samples/s")),
    "every rank field of the wrong type": (
        summary_changed(lambda s: s["ranks"][0].update(rank="x", host=5, exit_code=1.5, steps=True, final_loss="abc",
                                                       eval=[1], last_event_time="nan", exec_mode=[1])), (
            'skipped summary.json:ranks[0].rank: not a whole number, got "x"',
            "skipped summary.json:ranks[0].host: not text, got 5",
            "skipped summary.json:ranks[0].steps: not a whole number, got true",
            "skipped summary.json:ranks[0].eval: not an object, got a list",
            "    - ?        ")),
    "checkpoints of the wrong type": (summary_changed(lambda s: s.update(checkpoints=[1, {"step": "x"}])), (
        "skipped summary.json:checkpoints[0]: not an object, got 1",
        'skipped summary.json:checkpoints[1].step: not a whole number, got "x"', "checkpoints: none")),
    "keys missing": (summary_changed(lambda s: [s.pop(k) for k in ("ranks", "job_id", "outcome", "checkpoints")]),
                     ("job ?: ?, exit code 3", "checkpoints: none", "execution: mode not reported")),
    "every field null": (summary_changed(lambda s: each_field(s, None)), (
        "unreadable summary.json: no field of a job summary in it: derived from metrics.jsonl (outcome unknown)",
        "job job-7: unknown")),
    "escape sequences": (summary_changed(lambda s: s.update(job_id="\x1b[2J\x1b[31mred", message="a\nb\x07")),
                         ("job \\x1b[2J\\x1b[31mred: failed", "a\nb\\x07")),
    "a 5 MB job id": (summary_changed(lambda s: s.update(job_id="j" * 5_000_000)), ("...(5000000 chars): failed",)),
    "summary.json is a list": (summary_is("[1, 2]"), (
        "unreadable summary.json: not a JSON object, got a list: derived from metrics.jsonl", "job job-7: unknown")),
    "summary.json nested 100,000 deep": (summary_is("[" * 100_000), (
        "unreadable summary.json:1:33: nested deeper than the 32 levels accepted: derived from metrics.jsonl",)),
    "summary.json has a number of 5000 digits": (summary_is('{"exit_code": ' + "1" * 5000 + "}"), (
        "unreadable summary.json: exit_code: a number of 5000 digits; at most 32 are accepted: derived",)),
    "summary.json is not UTF-8": (summary_is(b'{"job_id": "\xff"}'), (
        "unreadable summary.json:1:13: not UTF-8 text (byte 0xff); a summary.json must be UTF-8: derived",)),
    "summary.json is 40 MiB": (summary_is(sparse(40 << 20)), (
        "unreadable summary.json: a summary.json may be at most 16 MiB; this one is 40.0 MiB: derived",)),
    "summary.json is /dev/zero": (summary_is(to_dev_zero), ("unreadable summary.json: not a regular file: derived",)),
    "summary.json is a directory": (summary_is(Path.mkdir), ("unreadable summary.json: not a regular file: derived",)),
    "summary.json is a FIFO": (summary_is(os.mkfifo), ("unreadable summary.json: not a regular file: derived",)),
    "metrics.jsonl with broken lines": (metrics_is(BROKEN_LINES), (
        "no summary.json: derived from metrics.jsonl (outcome unknown)",
        "skipped metrics.jsonl:139: not JSON (Expecting value at column 1)",
        "skipped metrics.jsonl:140: not UTF-8 (byte 0xff at column 1)",
        "skipped metrics.jsonl:141: longer than 1 MiB",
        "skipped metrics.jsonl:142: step: not a whole number, got a number of 40 digits",
        "skipped metrics.jsonl:143: rank: not a whole number, got 1e+308",
        "skipped metrics.jsonl:144: rank: not a rank (0 to 65535), got -1",
        'skipped metrics.jsonl:145: rank: not a whole number, got "\u00b2"',
        'skipped metrics.jsonl:146: loss: not a number, got "abc"',
        "skipped metrics.jsonl:146: time: not a time (seconds from 0 to 253402300799), got NaN",
        "skipped metrics.jsonl:147: nested too deep",
        "skipped 1 more in metrics.jsonl",
        "job job-7: unknown, exit code -, 41.0 s, 3 rank(s)", "last step 41")),
    "metrics.jsonl ending in 5 MB of NUL": (metrics_is(b"\0" * 5_000_000), (
        "skipped metrics.jsonl:139: longer than 1 MiB", "job job-7: unknown")),
}


def run_report(log_dir: Path, *options: str) -> subprocess.CompletedProcess:
    """``npu-launch report LOG_DIR OPTIONS`` through the CLI's ``main`` in this process."""
    return run_cli_here("report", str(log_dir), *options, cwd=log_dir.parent, guard=TIMEOUT_S)


def assert_in_order(text: str, words: tuple[str, ...]) -> None:
    at = 0
    for word in words:
        found = text.find(word, at)
        assert found >= 0, (word, text[:4000])
        at = found + len(word)


@pytest.mark.parametrize("name", list(REPORTED))
def test_what_can_be_read_is_reported_and_the_rest_named(weird_tmp: Path, name: str) -> None:
    make, words = REPORTED[name]
    make(weird_tmp)
    result = run_report(weird_tmp, "--no-plot")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    assert_in_order(result.stdout, words)
    assert " rank host " in result.stdout
    assert max(map(len, result.stdout.splitlines())) <= LONGEST_LINE
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout


def dir_with(summary: Any = None, metrics: Any = None) -> Callable[[Path], None]:
    def make(log_dir: Path) -> None:
        for name, content in ((SUMMARY_FILE, summary), (METRICS_FILE, metrics)):
            if callable(content):
                content(log_dir / name)
            elif content is not None:
                (log_dir / name).write_bytes(content)
    return make


# name: (make the log directory, words of the one error line; "{d}" is the directory)
NOTHING_READ: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "an empty directory": (dir_with(), ("{d}: no summary.json and no metrics.jsonl: not an npu-launch log directory?",)),
    "only broken lines": (dir_with(metrics=ONLY_BROKEN), (
        "{d}: no summary.json; no readable record of a rank in metrics.jsonl (metrics.jsonl:1: not JSON",)),
    "a summary of something else": (dir_with(summary=b'{"foo": 1}'), (
        "{d}: unreadable summary.json: no field of a job summary in it; no metrics.jsonl",)),
    "both empty": (dir_with(summary=b"", metrics=b""), (
        "unreadable summary.json:1:1: not valid JSON: Expecting value; no readable record of a rank in metrics.jsonl",)),
    "both /dev/zero": (dir_with(to_dev_zero, to_dev_zero), (
        "unreadable summary.json: not a regular file; unreadable metrics.jsonl: not a regular file",)),
    "both FIFOs": (dir_with(os.mkfifo, os.mkfifo), (
        "unreadable summary.json: not a regular file; unreadable metrics.jsonl: not a regular file",)),
}


@pytest.mark.parametrize("name", list(NOTHING_READ))
def test_a_directory_with_nothing_readable_is_one_error_line(weird_tmp: Path, name: str) -> None:
    make, words = NOTHING_READ[name]
    log_dir = weird_tmp / "logs"
    log_dir.mkdir()
    make(log_dir)
    assert_error(run_report(log_dir), *(w.replace("{d}", str(log_dir)) for w in words))


def test_a_file_or_nothing_as_log_dir_is_one_error_line(weird_tmp: Path) -> None:
    (weird_tmp / "a file").write_text("x")
    assert_error(run_report(weird_tmp / "a file"), f"{weird_tmp / 'a file'}: not a directory")
    assert_error(run_report(weird_tmp / "nothing"), f"{weird_tmp / 'nothing'}: no such log directory")
    long_name = weird_tmp / ("d" * 1000)
    assert_error(run_report(long_name), "...(", "chars): no such log directory")


def assert_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("npu-launch: error: "), result.stderr[:3000]
    assert len(lines[0]) <= LONGEST_LINE
    for word in words:
        assert word in lines[0], lines[0]


def test_the_plot_survives_infinite_huge_and_nan_values(weird_tmp: Path) -> None:
    records = [{"event": "job", "job_id": "j", "ranks": {"0": "h"}, "time": 100.0}]
    values = [(1.0, 10.0), (float("inf"), 1e308), (float("nan"), -1e308), (1e308, float("-inf")), (2.0, "abc")]
    for step, (loss, rate) in enumerate(values, 1):
        records.append({"event": "step", "rank": 0, "host": "h", "step": step, "loss": loss, "samples_per_s": rate,
                        "time": 100.0 + step})
    records.append({"event": "eval", "rank": 0, "step": 3, "loss": float("inf"), "accuracy": float("nan"),
                    "time": 105.0})
    records.append({"event": "step", "rank": 1, "step": 2 ** 53, "loss": 1, "time": 1e11})
    (weird_tmp / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    result = run_report(weird_tmp)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert 'skipped metrics.jsonl:6: samples_per_s: not a number, got "abc"' in result.stdout
    assert f"plot: {weird_tmp / 'report.png'}" in result.stdout
    assert png_size(weird_tmp / "report.png") == (900, 900)


def test_a_plot_that_cannot_be_written_is_one_error_line(weird_tmp: Path) -> None:
    a_job(weird_tmp)
    assert_error(run_report(weird_tmp, "-o", "/proc/report.png"), "/proc/report.png: cannot write the plot:")
