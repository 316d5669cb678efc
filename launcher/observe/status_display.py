"""What a person watching the job sees: the live table on a terminal (``status_table``), the
plain progress line elsewhere (``status_line``), and the lines that describe evaluations and
execution modes; all read from ``job_state``."""
from __future__ import annotations

import math
import os
from typing import Iterable, Mapping, Optional, TextIO

from launcher.observe.job_state import Evaluation, RankState, StatusLoss
from launcher.ranks.ranges import runs_text
from parallel.config import ExecMode

_MAX_TABLE_ROWS = 8


_LABEL_WIDTH = 22


def status_line(ranks: Iterable[RankState]) -> Optional[str]:
    """``step 120 | loss 0.31 (rank 0) | 1543 samples/s | slowest rank 3 | held-out acc 0.95
    loss 0.16 (epoch 2)``, plus the execution mode unless every rank runs GRAPH_MODE; None
    before any step. The loss is one rank's (``job_state.StatusLoss``)."""
    states = list(ranks)
    parts = _progress(states)
    if not parts:
        return None
    if {s.exec_mode for s in states} - {None, ExecMode.GRAPH}:
        parts.append(describe_modes({s.rank: s.exec_mode for s in states}) or "")
    return " | ".join(parts)


def _progress(states: list[RankState]) -> list[str]:
    """Steps, rank 0's loss, throughput, slowest rank and the last evaluation; [] before any
    step."""
    stepped = [s for s in states if s.step is not None]
    if not stepped:
        return []
    steps = sorted(s.step for s in stepped if s.step is not None)
    parts = [f"step {steps[0]}" if steps[0] == steps[-1] else f"step {steps[0]}-{steps[-1]}"]
    loss = StatusLoss.of(stepped)
    if loss is not None:
        parts.append(describe_loss(loss, steps[0] if steps[0] == steps[-1] else None))
    rated = {s.rank: s.samples_per_s for s in stepped if s.samples_per_s is not None}
    if rated:
        parts.append(f"{sum(rated.values()):.0f} samples/s")
    if len(rated) > 1:
        parts.append(f"slowest rank {min(rated, key=lambda rank: rated[rank])}")
    held_out = describe_evals([s.last_eval for s in states if s.last_eval is not None])
    return parts + ([held_out] if held_out else [])


def describe_loss(loss: StatusLoss, step: Optional[int]) -> str:
    """``loss 0.31 (rank 0)``, with ``, step 119`` when that is not ``step``, the one step every
    rank is at (None: they are at several)."""
    at = f", step {loss.step}" if loss.step is not None and loss.step != step else ""
    return f"loss {_number(loss.value)} (rank {loss.rank}{at})"


def describe_evals(evals: list[Evaluation]) -> Optional[str]:
    """``held-out acc 0.95 loss 0.16 (epoch 2)``: the mean over ranks of their last evaluation."""
    accuracies = [e.accuracy for e in evals if e.accuracy is not None]
    losses = [e.loss for e in evals if e.loss is not None]
    if not accuracies and not losses:
        return None
    text = "held-out"
    if accuracies:
        text += f" acc {_number(sum(accuracies) / len(accuracies))}"
    if losses:
        text += f" loss {_number(sum(losses) / len(losses))}"
    epochs = sorted({e.epoch for e in evals if e.epoch is not None})
    if epochs:
        text += f" (epoch {epochs[0]})" if len(epochs) == 1 else f" (epochs {epochs[0]}-{epochs[-1]})"
    return text


def describe_modes(modes: Mapping[int, Optional[ExecMode]]) -> Optional[str]:
    """``graph mode`` when every rank that said agrees, else ``graph on ranks 0-2, pynative on
    rank 3``; None when no rank said."""
    by_mode: dict[ExecMode, list[int]] = {}
    for rank, mode in sorted(modes.items()):
        if mode is not None:
            by_mode.setdefault(mode, []).append(rank)
    if len(by_mode) <= 1:
        return next((f"{mode.value} mode" for mode in by_mode), None)
    return ", ".join(f"{mode.value} on {_ranks_text(ranks)}" for mode, ranks in by_mode.items())


def _ranks_text(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2, 5``, from sorted ranks."""
    text = runs_text(ranks, ", ")
    return f"rank {text}" if len(ranks) == 1 else f"ranks {text}"


def status_table(job_id: str, ranks: Mapping[int, RankState], now: float,
                 started: float) -> list[str]:
    """The live table: a title, a header and one row per rank (the furthest behind if many)."""
    shown = _rows_to_show(ranks.values(), now)
    modes = describe_modes({s.rank: s.exec_mode for s in ranks.values()})
    title = f"npu-launch job {job_id}  {now - started:.0f} s" + (f"  {modes}" if modes else "")
    progress = _progress(list(ranks.values()))
    lines = [title + (f"  |  {' | '.join(progress)}" if progress else ""),
             f"{'rank':<{_LABEL_WIDTH}} {'step':>7} {'loss':>9} {'samples/s':>9} "
             f"{'eval acc':>8} {'last event':>12} {'ago':>6}"]
    lines += [_table_row(s, now) for s in shown]
    if len(ranks) > len(shown):
        lines.append(f"... and {len(ranks) - len(shown)} more ranks (showing the furthest behind)")
    return lines


def table_height(nranks: int) -> int:
    """Lines ``status_table`` draws for ``nranks`` ranks."""
    return 2 + min(nranks, _MAX_TABLE_ROWS) + (1 if nranks > _MAX_TABLE_ROWS else 0)


def _rows_to_show(states: Iterable[RankState], now: float) -> list[RankState]:
    states = list(states)
    if len(states) <= _MAX_TABLE_ROWS:
        return states
    behind = sorted(states, key=lambda s: (s.step if s.step is not None else -1,
                                           -(now - s.seen_at) if s.seen_at is not None else -math.inf))
    return sorted(behind[:_MAX_TABLE_ROWS], key=lambda s: s.rank)


def _table_row(s: RankState, now: float) -> str:
    label = f"{s.host}:{s.rank}"[-_LABEL_WIDTH:]
    step = "-" if s.step is None else str(s.step)
    loss = "-" if s.loss is None else _number(s.loss)
    rate = "-" if s.samples_per_s is None else f"{s.samples_per_s:.1f}"
    accuracy = s.last_eval.accuracy if s.last_eval else None
    held_out = "-" if accuracy is None else f"{accuracy:.4f}"
    event = f"exit {s.exit_code}" if s.exited else (s.last_event[:12] or "-")
    ago = "-" if s.seen_at is None else f"{max(now - s.seen_at, 0.0):.0f} s"
    return (f"{label:<{_LABEL_WIDTH}} {step:>7} {loss:>9} {rate:>9} {held_out:>8} {event:>12} "
            f"{ago:>6}")


class Footer:
    """A block of lines pinned to the bottom of a terminal, below a scroll region."""

    def __init__(self, stream: TextIO, height: int) -> None:
        self._stream = stream
        self._height = height
        self._size: Optional[tuple[int, int]] = None

    def draw(self, lines: list[str]) -> None:
        columns, rows = _terminal_size(self._stream)
        if rows < self._height + 3:
            return  # too small a terminal to give up the rows; rank lines matter more
        out = []
        if self._size != (columns, rows):
            out.append(self._reserve(rows))
            self._size = (columns, rows)
        top = rows - self._height + 1
        body = "".join(f"\x1b[{top + i};1H\x1b[2K{line[:columns - 1]}"
                       for i, line in enumerate(lines[:self._height]))
        out.append(f"\x1b7{body}\x1b8")
        write_console(self._stream, "".join(out))

    def close(self, final: list[str]) -> None:
        """Give the rows back and leave ``final`` as ordinary lines."""
        if self._size is not None:
            top = self._size[1] - self._height + 1
            write_console(self._stream, f"\x1b7\x1b[r\x1b[{top};1H\x1b[J\x1b8")
            self._size = None
        write_console(self._stream, "".join(line + "\n" for line in final))

    def _reserve(self, rows: int) -> str:
        # Newlines first push what is on screen up out of the rows the table will take; setting
        # the region homes the cursor, so it is saved and restored around that.
        h = self._height
        return "\n" * h + f"\x1b[{h}A\x1b7\x1b[1;{rows - h}r\x1b8"


def _terminal_size(stream: TextIO) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(stream.fileno())
        return size.columns, size.lines
    except (AttributeError, OSError, ValueError):
        return 80, 24


def _number(value: float) -> str:
    return f"{value:.4g}"


def write_console(stream: TextIO, text: str) -> None:
    """Write and flush; a console that is gone is not the job's failure."""
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed or broken console must not take the job down with it
