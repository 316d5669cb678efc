"""``npu-launch report LOG_DIR``: a finished (or running) job's summary as a table, and a plot.

The summary comes from ``summary.json``; without one (the launcher was killed, or the job still
runs) it is rebuilt from ``metrics.jsonl`` by the same fold the monitor uses, and the report says
so. The table gives every rank's execution mode and its last held-out accuracy and loss. The
plot shows loss and samples/s per rank over steps, and the held-out accuracy and loss of every
evaluation, from the step and eval events in ``metrics.jsonl``.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
from typing import Any, Iterator, Optional, TextIO

import click

from launcher.events import parse_records
from launcher import contract
from launcher.errors import LaunchError
from launcher.monitor import (EVENT_JOB, METRICS_FILE, SUMMARY_FILE, Evaluation, JobState, as_float,
                              as_int, describe_modes, exec_mode_of)

_MAX_LEGEND_RANKS = 16


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """What to report on and where the plot goes (None: no plot)."""

    log_dir: str
    plot_path: Optional[str]

    @classmethod
    def build(cls, log_dir: str, output: Optional[str], no_plot: bool) -> "ReportOptions":
        if not os.path.isdir(log_dir):
            raise LaunchError(f"{log_dir}: no such log directory")
        plot = None if no_plot else (output or os.path.join(log_dir, "report.png"))
        if plot is not None and not os.path.isdir(os.path.dirname(os.path.abspath(plot))):
            raise LaunchError(f"{plot}: its folder does not exist")
        return cls(log_dir, plot)

    @property
    def summary_path(self) -> str:
        return os.path.join(self.log_dir, SUMMARY_FILE)

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.log_dir, METRICS_FILE)


@dataclasses.dataclass(frozen=True)
class Series:
    """One rank's step events as parallel lists (None where a step lacked the value)."""

    rank: int
    host: str
    steps: tuple[int, ...]
    losses: tuple[Optional[float], ...]
    rates: tuple[Optional[float], ...]


@dataclasses.dataclass(frozen=True)
class EvalSeries:
    """One rank's evaluations as parallel lists (None where one lacked the value)."""

    rank: int
    steps: tuple[int, ...]
    losses: tuple[Optional[float], ...]
    accuracies: tuple[Optional[float], ...]


@click.command("report")
@click.argument("log_dir", type=click.Path())
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="PNG to write [default: LOG_DIR/report.png].")
@click.option("--no-plot", is_flag=True, help="Print the table only.")
def report(log_dir: str, output: Optional[str], no_plot: bool) -> None:
    """Print a job's summary and plot loss, throughput and held-out results per rank."""
    run_report(ReportOptions.build(log_dir, output, no_plot), sys.stdout)


def run_report(options: ReportOptions, out: TextIO) -> None:
    """Print the summary table and, if asked, write the plot."""
    summary, note = load_summary(options)
    if note:
        out.write(note + "\n")
    out.write(format_summary(summary) + "\n")
    if options.plot_path is None:
        return
    records = list(read_records(options.metrics_path)) if os.path.isfile(options.metrics_path) else []
    series = step_series(records)
    if not any(s.steps for s in series):
        out.write(f"no step events in {options.metrics_path}: no plot\n")
        return
    plot_series(series, eval_series(records), options.plot_path, _plot_title(summary))
    out.write(f"plot: {options.plot_path}\n")


def load_summary(options: ReportOptions) -> tuple[dict[str, Any], str]:
    """summary.json, or one rebuilt from metrics.jsonl with a note saying so."""
    problem = _summary_problem(options.summary_path)
    if problem is None:
        with open(options.summary_path) as f:
            return json.load(f), ""
    if not os.path.isfile(options.metrics_path):
        raise LaunchError(f"{options.log_dir}: {problem} and no {METRICS_FILE}: "
                          "not an npu-launch log directory?")
    return (summary_from_metrics(options.metrics_path),
            f"{problem}: derived from {METRICS_FILE} (outcome unknown)")


def _summary_problem(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return f"no {SUMMARY_FILE}"
    except (OSError, ValueError) as e:
        return f"{path}: unreadable ({e})"
    return None if isinstance(data, dict) else f"{path}: not a JSON object"


def summary_from_metrics(path: str) -> dict[str, Any]:
    """What summary.json would say, as far as the records show (no outcome, no exit code)."""
    records = list(read_records(path))
    job = next((r for r in records if r.get("event") == EVENT_JOB), {})
    state = JobState(_job_ranks(job))
    times = [t for t in (as_float(r.get("time")) for r in records) if t is not None]
    for record in records:
        state.apply(record, as_float(record.get("time"), 0.0))  # type: ignore[arg-type]
    return {"job_id": job.get("job_id", "?"), "outcome": "unknown", "exit_code": None,
            "message": "", "started_at": min(times, default=None),
            "ended_at": max(times, default=None),
            "duration_s": max(times) - min(times) if times else None, "stall": None,
            **state.summary()}


def _job_ranks(job: dict[str, Any]) -> dict[int, str]:
    ranks = job.get("ranks")
    if not isinstance(ranks, dict):
        return {}
    return {r: str(h) for r, h in ((as_int(k), v) for k, v in ranks.items()) if r is not None}


def read_records(path: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, skipping lines that are not one."""
    with open(path, "rb") as f:
        yield from parse_records(f)


def step_series(records: list[dict[str, Any]]) -> list[Series]:
    """Each rank's step events among ``records``, in their order."""
    rows: dict[int, list[tuple[int, Optional[float], Optional[float]]]] = {}
    hosts: dict[int, str] = {}
    for record in records:
        rank, step = as_int(record.get("rank")), as_int(record.get("step"))
        if record.get("event") != contract.EVENT_STEP or rank is None or step is None:
            continue
        hosts.setdefault(rank, str(record.get("host", "?")))
        rows.setdefault(rank, []).append((step, as_float(record.get("loss")),
                                          as_float(record.get("samples_per_s"))))
    return [Series(r, hosts[r], *map(tuple, zip(*rows[r]))) for r in sorted(rows)]  # type: ignore[arg-type]


def eval_series(records: list[dict[str, Any]]) -> list[EvalSeries]:
    """Each rank's eval events among ``records`` that name their step, in their order."""
    rows: dict[int, list[Evaluation]] = {}
    for record in records:
        rank = as_int(record.get("rank"))
        if record.get("event") != contract.EVENT_EVAL or rank is None:
            continue
        evaluation = Evaluation.from_record(record)
        if evaluation.step is not None:
            rows.setdefault(rank, []).append(evaluation)
    return [EvalSeries(r, tuple(e.step for e in rows[r]), tuple(e.loss for e in rows[r]),  # type: ignore[misc]
                       tuple(e.accuracy for e in rows[r])) for r in sorted(rows)]


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a few header lines and one table row per rank."""
    lines = [f"job {summary.get('job_id', '?')}: {summary.get('outcome', '?')}, "
             f"exit code {_text(summary.get('exit_code'))}, "
             f"{_text(summary.get('duration_s'), '{:.1f} s')}, "
             f"{_text(summary.get('world_size'))} rank(s)",
             f"started {_clock(summary.get('started_at'))}, ended {_clock(summary.get('ended_at'))}",
             f"throughput {_text(summary.get('global_samples_per_s'), '{:.1f}')} samples/s "
             f"(all ranks), last step {_text(summary.get('last_step'))}",
             _checkpoint_line(summary.get("checkpoints") or [])]
    ranks = [r for r in summary.get("ranks") or [] if isinstance(r, dict)]
    lines.append(_mode_line(ranks))
    if summary.get("message"):
        lines.append(str(summary["message"]))
    lines.append(f"{'rank':>5} {'host':<20} {'exit':>5} {'steps':>7} {'final loss':>11} "
                 f"{'samples/s':>10} {'mode':>8} {'eval acc':>8} {'eval loss':>9}  last event")
    lines += [_rank_row(r) for r in ranks]
    return "\n".join(lines)


def _mode_line(ranks: list[dict[str, Any]]) -> str:
    modes = {rank: exec_mode_of(r.get("exec_mode")) for rank, r in
             ((as_int(r.get("rank")), r) for r in ranks) if rank is not None}
    return f"execution: {describe_modes(modes) or 'mode not reported'}"


def _checkpoint_line(checkpoints: list[Any]) -> str:
    steps = sorted({c.get("step") for c in checkpoints if isinstance(c, dict)
                    and c.get("step") is not None})
    if not steps:
        return "checkpoints: none"
    shown = ", ".join(map(str, steps[-5:]))
    return f"checkpoints: {len(checkpoints)} file(s) at {len(steps)} step(s), last {shown}"


def _rank_row(rank: dict[str, Any]) -> str:
    last = f"{rank.get('last_event') or '-'} at {_clock(rank.get('last_event_time'))}"
    held_out = rank.get("eval") if isinstance(rank.get("eval"), dict) else {}
    return (f"{_text(rank.get('rank')):>5} {str(rank.get('host', '?'))[:20]:<20} "
            f"{_text(rank.get('exit_code')):>5} {_text(rank.get('steps')):>7} "
            f"{_text(rank.get('final_loss'), '{:.4g}'):>11} "
            f"{_text(rank.get('samples_per_s'), '{:.1f}'):>10} "
            f"{_text(rank.get('exec_mode')):>8} {_text(held_out.get('accuracy'), '{:.4f}'):>8} "
            f"{_text(held_out.get('loss'), '{:.4g}'):>9}  {last}")


def plot_series(series: list[Series], evals: list[EvalSeries], path: str, title: str) -> None:
    """Training loss, samples/s and held-out accuracy (solid) and loss (dashed) per rank against
    the step, top to bottom, as a PNG; a rank keeps its colour in every panel."""
    import matplotlib  # lazily: the launcher's start-up must not pay for it

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (loss_ax, rate_ax, eval_ax) = plt.subplots(3, 1, sharex=True, figsize=(9, 9))
    try:
        for s in series:
            style = {"label": f"{s.host}:{s.rank}", "color": _colour(s.rank), "linewidth": 1.2}
            loss_ax.plot(s.steps, _nan_for_none(s.losses), **style)
            rate_ax.plot(s.steps, _nan_for_none(s.rates), **style)
        _plot_evals(eval_ax, evals)
        _label_axes(fig, (loss_ax, rate_ax, eval_ax), title, len(series))
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _plot_evals(ax: Any, evals: list[EvalSeries]) -> None:
    ax.set_ylabel("held-out accuracy (solid)")
    if not evals:
        ax.text(0.5, 0.5, "no eval events", transform=ax.transAxes, ha="center", va="center")
        return
    loss_ax = ax.twinx()
    loss_ax.set_ylabel("held-out loss (dashed)")
    for e in evals:
        ax.plot(e.steps, _nan_for_none(e.accuracies), color=_colour(e.rank), marker="o",
                linewidth=1.2)
        loss_ax.plot(e.steps, _nan_for_none(e.losses), color=_colour(e.rank), marker="x",
                     linestyle="--", linewidth=1.0)


def _colour(rank: int) -> str:
    return f"C{rank % 10}"


def _label_axes(fig: Any, axes: tuple[Any, Any, Any], title: str, nseries: int) -> None:
    loss_ax, rate_ax, eval_ax = axes
    loss_ax.set_ylabel("loss")
    rate_ax.set_ylabel("samples/s (per rank)")
    eval_ax.set_xlabel("step")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    if nseries <= _MAX_LEGEND_RANKS:
        loss_ax.legend(title="host:rank", fontsize="small", ncol=min(nseries, 4))
    fig.suptitle(title)
    fig.tight_layout()


def _plot_title(summary: dict[str, Any]) -> str:
    return f"job {summary.get('job_id', '?')} ({summary.get('outcome', '?')})"


def _nan_for_none(values: tuple[Optional[float], ...]) -> list[float]:
    return [math.nan if v is None else v for v in values]


def _clock(when: Any) -> str:
    seconds = as_float(when)
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _text(value: Any, fmt: str = "{}") -> str:
    if value is None:
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)

