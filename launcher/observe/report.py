"""``npu-launch report LOG_DIR``: a finished (or running) job's summary as a table, and a plot.

The summary comes from ``summary.json``; without one (the launcher was killed, or the job still
runs) it is rebuilt from ``metrics.jsonl`` by the same fold the monitor uses, and the report says
so. The table gives every rank's execution mode and its last held-out accuracy and loss. The
plot shows loss and samples/s per rank over steps, and the held-out accuracy and loss of every
evaluation, from the step and eval events in ``metrics.jsonl``.

What the files hold is read by ``launcher.observe.job_files`` (``metrics.jsonl``'s records by
``metrics_records``), which names what it skipped.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import sys
from typing import Any, Iterator, Optional, Sequence, TextIO

import click

from launcher.errors import LaunchError
from launcher.observe.job_files import JobSummary, RankRow, ReportOptions, read_job
from launcher.observe.status_display import describe_modes
from parallel import contract
from rank_tables.bounded import display_name

__all__ = ["report", "run_report", "step_series",
           "eval_series", "EvalSeries", "Series"]

_MAX_LEGEND_RANKS = 16


@click.command("report")
@click.argument("log_dir", type=click.Path())
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Image to write: .png, .pdf, .svg, .jpg; PNG without an extension "
              "[default: LOG_DIR/report.png].")
@click.option("--no-plot", is_flag=True, help="Print the table only.")
def report(log_dir: str, output: Optional[str], no_plot: bool) -> None:
    """Print a job's summary and plot loss, throughput and held-out results per rank."""
    run_report(ReportOptions.build(log_dir, output, no_plot), sys.stdout)


def run_report(options: ReportOptions, out: TextIO) -> None:
    """Print the summary table and, if asked, write the plot."""
    job = read_job(options)
    out.write("".join(f"{line}\n" for line in (job.note, *job.skipped) if line))
    out.write(format_summary(job.summary) + "\n")
    if options.plot_path is None:
        return
    series = step_series(job.events)
    if not any(s.steps for s in series):
        out.write(f"no step events in {display_name(options.metrics_path)}: no plot\n")
        return
    try:
        plot_series(series, eval_series(job.events), options.plot_path, _plot_title(job.summary),
                    options.plot_format)
    except OSError as e:
        raise LaunchError(f"{display_name(options.plot_path)}: cannot write the plot: {e.strerror or e}") from None
    out.write(f"plot: {options.plot_path}\n")


# Plot series -----------------------------------------------------------------------------------

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


def step_series(events: Sequence[contract.Event]) -> list[Series]:
    """Each rank's step events among ``events``, in their order."""
    rows: dict[int, list[tuple[int, Optional[float], Optional[float]]]] = {}
    hosts: dict[int, str] = {}
    for e, step in _events(events, contract.EVENT_STEP):
        hosts.setdefault(e.rank, e.host)
        rows.setdefault(e.rank, []).append((step, e.loss, e.samples_per_s))
    return [Series(r, hosts[r], *map(tuple, zip(*rows[r]))) for r in sorted(rows)]


def eval_series(events: Sequence[contract.Event]) -> list[EvalSeries]:
    """Each rank's eval events among ``events`` that name their step, in their order."""
    rows: dict[int, list[tuple[int, Optional[float], Optional[float]]]] = {}
    for e, step in _events(events, contract.EVENT_EVAL):
        rows.setdefault(e.rank, []).append((step, e.loss, e.accuracy))
    return [EvalSeries(r, *map(tuple, zip(*rows[r]))) for r in sorted(rows)]


def _events(events: Sequence[contract.Event], kind: str) -> Iterator[tuple[contract.Event, int]]:
    """The events of ``kind`` among ``events`` that name their step, with the step."""
    for event in events:
        if event.kind == kind and event.step is not None:
            yield event, event.step


# The table -------------------------------------------------------------------------------------

def format_summary(summary: JobSummary) -> str:
    """The summary as a few header lines and one table row per rank."""
    lines = [f"job {summary.job_id}: {summary.outcome}, exit code {_shown(summary.exit_code)}, "
             f"{_shown(summary.duration_s, '{:.1f} s')}, {_shown(summary.world_size)} rank(s)",
             f"started {_clock(summary.started_at)}, ended {_clock(summary.ended_at)}",
             f"throughput {_shown(summary.global_samples_per_s, '{:.1f}')} samples/s "
             f"(all ranks), last step {_shown(summary.last_step)}",
             _checkpoint_line(summary), _mode_line(summary.ranks)]
    if summary.message:
        lines.append(summary.message)
    if len(summary.attempts) > 1:  # launch: the same command run again into the log dir
        lines.append("attempts:  launch  attempt  outcome          seconds  resumed from  nodes  "
                     "ranks  waited  cause")
        lines += [f"  {_shown(a.launch):>14}  {_shown(a.attempt):>7}  {a.outcome:<15} "
                  f"{_shown(a.duration_s, '{:.1f}'):>8}  "
                  f"{_shown(a.resumed_from, 'step {}'):>12}  {_shown(a.nodes):>5}  "
                  f"{_shown(a.world_size):>5}  {_shown(a.waited_s, '{:.1f}'):>6}  {a.cause}"
                  for a in summary.attempts]
    if summary.phases:
        lines.append("where the time went:   slowest rank   seconds   median of ranks")
        lines += [f"  {p.shown:<12} {p.rank:>14} {p.seconds:>9.2f} {p.median:>10.2f}"
                  for p in summary.phases]
    lines.append(f"{'rank':>5} {'host':<20} {'exit':>5} {'steps':>7} {'final loss':>11} "
                 f"{'samples/s':>10} {'mode':>8} {'eval acc':>8} {'eval loss':>9}  last event")
    lines += [_rank_row(r) for r in summary.ranks]
    return "\n".join(lines)


def _mode_line(ranks: Sequence[RankRow]) -> str:
    modes = {r.rank: r.exec_mode for r in ranks if r.rank is not None}
    return f"execution: {describe_modes(modes) or 'mode not reported'}"


def _checkpoint_line(summary: JobSummary) -> str:
    steps = sorted(set(summary.checkpoint_steps))
    if not steps:
        return "checkpoints: none"
    last = ", ".join(map(str, steps[-5:]))
    return f"checkpoints: {summary.checkpoint_files} file(s) at {len(steps)} step(s), last {last}"


def _rank_row(rank: RankRow) -> str:
    last = f"{rank.last_event or '-'} at {_clock(rank.last_event_time)}"
    mode = rank.exec_mode.value if rank.exec_mode else None
    return (f"{_shown(rank.rank):>5} {rank.host[:20]:<20} {_shown(rank.exit_code):>5} "
            f"{_shown(rank.steps):>7} {_shown(rank.final_loss, '{:.4g}'):>11} "
            f"{_shown(rank.samples_per_s, '{:.1f}'):>10} {_shown(mode):>8} "
            f"{_shown(rank.eval_accuracy, '{:.4f}'):>8} {_shown(rank.eval_loss, '{:.4g}'):>9}  {last}")


def plot_series(series: list[Series], evals: list[EvalSeries], path: str, title: str,
                image_format: str = "png") -> None:
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
        fig.savefig(path, dpi=100, format=image_format)
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


def _plot_title(summary: JobSummary) -> str:
    return f"job {summary.job_id} ({summary.outcome})"


_PLOTTABLE = 1e30
"""Larger values are drawn as gaps, as missing ones are: matplotlib overflows computing the
ticks of an axis that reaches 1e308 (and infinity has no place on one)."""


def _nan_for_none(values: tuple[Optional[float], ...]) -> list[float]:
    return [v if v is not None and abs(v) <= _PLOTTABLE else math.nan for v in values]


def _clock(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):  # the local zone can push 9999-12-31 past the end
        return "-"


def _shown(value: Any, fmt: str = "{}") -> str:
    """A typed value for the table: "-" for none, and a number past 1e12 in three digits (1e308
    with ``{:.1f}`` is 310 characters)."""
    if value is None:
        return "-"
    if isinstance(value, float) and (not math.isfinite(value) or abs(value) >= 1e12):
        return f"{value:.3g}"
    return fmt.format(value)
