"""Watching a running job from the host: metrics.jsonl, a status display, summary.json.

The supervisor hands every rank event to ``JobMonitor.on_event`` (local ranks from their events
files, remote ranks through the same callback) and calls ``tick`` about every 20 ms. The monitor
appends each record to ``<log_dir>/metrics.jsonl``, folds it into per-rank state and, at the end,
writes ``<log_dir>/summary.json``.

Status display. On a terminal (``live``) the table sits in the bottom rows of the screen, below a
scroll region (DECSTBM, as apt's progress bar does) that holds everything else: rank lines scroll
above it and are never overwritten, whoever writes them and whenever, and the table is redrawn in
place at most once a second. ``close`` lifts the region, erases the table and prints its last
state once as ordinary lines. The caller decides ``live`` (a TTY whose ``TERM`` is not ``dumb``).
Elsewhere (a log file, CI) the monitor prints one plain line at most every 10 s, and only once
new step or eval events came in since the last one. Both show the held-out accuracy and loss of
the last evaluation, and the execution mode: the table's title always, the plain line only when it
is not GRAPH_MODE everywhere (PyNative is about 2x slower, worth a look). A rank's mode is the last
one it reported: ``initialised`` says what ``init()`` chose, the trainer's first ``step`` and its
``finished`` what the train step ran in.

The hang check (``stalls.HangCheck``) reads ``rank_states``: each rank's ``progress``
(``hang_limits.RankProgress``) holds the monitor's clock when a record arrived, not the rank's own
``time``, so clock skew between hosts cannot fake or hide a stall. The rank hook's ``progress``
events and the supervisors' ``stack`` samples feed that check only: they are not written to
metrics.jsonl (twice a second per rank, and up to 64 KB each) and are not a rank's last event.

Every method holds one lock, so remote records may arrive from another thread. ``close`` belongs
in the supervisor's ``finally``: until it runs, a terminal keeps the scroll region.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, TextIO, TypeVar

from launcher.console_lines import runs_text
from launcher.failures import Cause
from launcher.hang_limits import RankProgress
from launcher.restarts import AttemptRecord
from launcher.stalls import Stall
from launcher.startup import Marks, describe, job_phases
from parallel import contract
from parallel.config import ExecMode
from parallel.contract import EVENT_ATTEMPT, EVENT_EXITED, EVENT_JOB, METRICS_FILE, SUMMARY_FILE, Event
from parallel.manifest import RankFile, atomic_write_bytes, complete_files

_LIVE_INTERVAL = 1.0
_PLAIN_INTERVAL = 10.0
_MAX_TABLE_ROWS = 8
_LABEL_WIDTH = 22


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation a rank reported (``contract.EVENT_EVAL``); ``time`` is the rank's
    clock, ``epoch`` the epochs completed when it ran."""

    epoch: Optional[int]
    step: Optional[int]
    loss: Optional[float]
    accuracy: Optional[float]
    samples: Optional[int]
    time: Optional[float]

    @classmethod
    def of(cls, event: Event) -> "Evaluation":
        """The evaluation an eval event describes."""
        return cls(epoch=event.epoch, step=event.step, loss=event.loss, accuracy=event.accuracy,
                   samples=event.samples, time=event.time)


def exec_mode_of(value: Any) -> Optional[ExecMode]:
    """``graph``/``pynative`` as an ``ExecMode``; None for anything else (or nothing)."""
    try:
        return ExecMode(value)
    except (ValueError, TypeError):
        return None


@dataclasses.dataclass
class RankState:
    """What one rank has reported so far; it folds that rank's records in arrival order.

    ``*_at`` fields are the monitor's clock when a record arrived; ``last_event_time`` is the
    rank's own clock.
    """

    rank: int
    host: str
    step: Optional[int] = None
    epoch: Optional[int] = None
    loss: Optional[float] = None
    samples_per_s: Optional[float] = None
    final_loss: Optional[float] = None
    exec_mode: Optional[ExecMode] = None
    evals: list[Evaluation] = dataclasses.field(default_factory=list)
    last_event: str = ""
    last_event_time: Optional[float] = None
    seen_at: Optional[float] = None
    progress: RankProgress = dataclasses.field(default_factory=RankProgress)
    marks: Marks = dataclasses.field(default_factory=Marks)
    finished: bool = False
    exited: bool = False
    exit_code: Optional[int] = None

    @property
    def done(self) -> bool:
        """Finished training or gone: no longer expected to make progress."""
        return self.finished or self.exited

    @property
    def last_eval(self) -> Optional[Evaluation]:
        """The most recent evaluation, if any."""
        return self.evals[-1] if self.evals else None

    def to_summary(self) -> dict[str, Any]:
        """This rank's entry in summary.json; without a ``finished`` loss, the last step's."""
        final_loss = self.final_loss if self.final_loss is not None else self.loss
        last = self.last_eval
        return {"rank": self.rank, "host": self.host, "exit_code": self.exit_code,
                "steps": self.step, "final_loss": final_loss, "samples_per_s": self.samples_per_s,
                "exec_mode": self.exec_mode.value if self.exec_mode else None,
                "eval": dataclasses.asdict(last) if last else None,
                "evals": [dataclasses.asdict(e) for e in self.evals],
                "last_event": self.last_event, "last_event_time": self.last_event_time,
                "phases": self.marks.phases()}


class JobState:
    """Every rank's state and the checkpoints written, folded from events."""

    def __init__(self, ranks: Mapping[int, str]) -> None:
        self.ranks: dict[int, RankState] = {r: RankState(r, h) for r, h in sorted(ranks.items())}
        self.checkpoints: list[dict[str, Any]] = []
        self.files: dict[int, dict[int, RankFile]] = {}
        """Each step's checkpoint files by rank, as the ranks described them."""
        self.transferred: dict[str, Any] = {"files": 0, "bytes": 0, "seconds": 0.0}
        """Checkpoint files node 0 sent to hosts that lacked them, for a resume."""
        self.collected: dict[str, Any] = {"files": 0, "bytes": 0, "seconds": 0.0}
        """Checkpoint files the agents sent node 0 (``launcher.collect``)."""
        self.storage: Optional[str] = None
        """``shared`` or ``private``: whether node 0 found every rank's files (the ledger's
        ``storage``)."""
        self.attempts: list[dict[str, Any]] = []
        """Each attempt of the job as it ended (``restarts.AttemptRecord``), in order."""
        self.earlier_attempts: list[dict[str, Any]] = []
        """The attempts of earlier launches into the same log directory (the same command run
        again resumes there): kept ahead of this launch's in summary.json."""
        self.global_batch: Optional[int] = None
        """Every rank's batch together, as the ranks' readers last reported it (``data``)."""

    def reshape(self, ranks: Mapping[int, str]) -> None:
        """The job goes on with these ranks on these hosts (``--min-nodes`` left a host out):
        a rank that no longer exists leaves the table; its records stay in metrics.jsonl."""
        self.ranks = {r: dataclasses.replace(self.ranks[r], host=h) if r in self.ranks
                      else RankState(r, h) for r, h in sorted(ranks.items())}

    def apply(self, event: Event, seen_at: float) -> None:
        """Fold one event in (``exited`` is the supervisor's, not what the rank last said)."""
        state = self._rank(event.rank, event.host)
        state.marks.observe(event)
        if event.kind in _LIVENESS:
            state.progress.observe(event, seen_at)
            return
        if event.kind == EVENT_EXITED:
            state.exited, state.exit_code = True, event.returncode
            return
        state.last_event, state.seen_at = event.kind, seen_at
        state.last_event_time = event.time
        if event.exec_mode is not None:  # few events say; a failed Enum lookup costs an exception
            state.exec_mode = exec_mode_of(event.exec_mode) or state.exec_mode
        state.progress.observe(event, seen_at)
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, state, event, seen_at)

    def summary(self) -> dict[str, Any]:
        """The per-rank and job-wide fields of summary.json."""
        rates = [s.samples_per_s for s in self.ranks.values() if s.samples_per_s is not None]
        steps = [s.step for s in self.ranks.values() if s.step is not None]
        complete = self.complete_steps()
        ranks = [s.to_summary() for s in self.ranks.values()]
        return {"world_size": len(self.ranks),
                "global_samples_per_s": sum(rates) if rates else None,
                "last_step": max(steps, default=None),
                "phases": job_phases({r["rank"]: r["phases"] for r in ranks}),
                "ranks": ranks,
                "checkpoints": [{**c, "complete": c["step"] in complete} for c in self.checkpoints],
                "complete_steps": complete, "checkpoints_sent": dict(self.transferred),
                "checkpoints_collected": dict(self.collected), "checkpoint_storage": self.storage,
                "attempts": self.earlier_attempts + list(self.attempts)}

    def complete_steps(self) -> list[int]:
        """Steps complete by the ledger's one rule (``parallel.manifest.complete_files``): every
        rank of the job reported its file of the step, on whatever host, at one data position."""
        return sorted(step for step, files in self.files.items()
                      if complete_files(files, len(self.ranks)) is not None)

    def _rank(self, rank: int, host: str) -> RankState:
        if rank not in self.ranks:
            self.ranks[rank] = RankState(rank, host)
            self.ranks = dict(sorted(self.ranks.items()))
        return self.ranks[rank]


def _on_step(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    state.step = _either(event.step, state.step)
    state.epoch = _either(event.epoch, state.epoch)
    state.loss = _either(event.loss, state.loss)
    state.samples_per_s = _either(event.samples_per_s, state.samples_per_s)


def _on_checkpoint(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    job.checkpoints.append({"rank": state.rank, "step": event.step, "host": event.host,
                            "path": event.path, "time": state.last_event_time})
    file = RankFile.reported(state.rank, event.record)
    if file is not None and event.step is not None and file.position.global_step == event.step:
        job.files.setdefault(event.step, {})[state.rank] = file


def _on_finished(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    state.finished = True
    state.step = _either(event.steps, state.step)
    state.final_loss = _either(event.final_loss, state.final_loss)
    state.samples_per_s = _either(event.samples_per_s, state.samples_per_s)


def _on_eval(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    state.evals.append(Evaluation.of(event))


def _on_data(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    size = event.record.get("global_batch")
    if type(size) is int and size > 0:
        job.global_batch = size


T = TypeVar("T")


def _either(new: Optional[T], old: Optional[T]) -> Optional[T]:
    """What an event says, or what was known when it does not say."""
    return old if new is None else new


_LIVENESS = frozenset((contract.EVENT_PROGRESS, contract.EVENT_STACK))
"""Events for the hang check alone (see the module's docstring)."""

_HANDLERS: dict[str, Callable[[JobState, RankState, Event, float], None]] = {
    contract.EVENT_STEP: _on_step,
    contract.EVENT_CHECKPOINT: _on_checkpoint,
    contract.EVENT_FINISHED: _on_finished,
    contract.EVENT_EVAL: _on_eval,
    contract.EVENT_DATA: _on_data,
}


def status_line(ranks: Iterable[RankState]) -> Optional[str]:
    """``step 120 | loss 0.31 | 1543 samples/s | slowest rank 3 | held-out acc 0.95 loss 0.16
    (epoch 2)``, plus the execution mode unless every rank runs GRAPH_MODE; None before any step.
    """
    states = list(ranks)
    parts = _progress(states)
    if not parts:
        return None
    if {s.exec_mode for s in states} - {None, ExecMode.GRAPH}:
        parts.append(describe_modes({s.rank: s.exec_mode for s in states}) or "")
    return " | ".join(parts)


def _progress(states: list[RankState]) -> list[str]:
    """Steps, mean loss, throughput, slowest rank and the last evaluation; [] before any step."""
    stepped = [s for s in states if s.step is not None]
    if not stepped:
        return []
    steps = sorted(s.step for s in stepped if s.step is not None)
    parts = [f"step {steps[0]}" if steps[0] == steps[-1] else f"step {steps[0]}-{steps[-1]}"]
    losses = [s.loss for s in stepped if s.loss is not None]
    if losses:
        parts.append(f"loss {_number(sum(losses) / len(losses))}")
    rated = {s.rank: s.samples_per_s for s in stepped if s.samples_per_s is not None}
    if rated:
        parts.append(f"{sum(rated.values()):.0f} samples/s")
    if len(rated) > 1:
        parts.append(f"slowest rank {min(rated, key=lambda rank: rated[rank])}")
    held_out = describe_evals([s.last_eval for s in states if s.last_eval is not None])
    return parts + ([held_out] if held_out else [])


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


class _Footer:
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
        _write(self._stream, "".join(out))

    def close(self, final: list[str]) -> None:
        """Give the rows back and leave ``final`` as ordinary lines."""
        if self._size is not None:
            top = self._size[1] - self._height + 1
            _write(self._stream, f"\x1b7\x1b[r\x1b[{top};1H\x1b[J\x1b8")
            self._size = None
        _write(self._stream, "".join(line + "\n" for line in final))

    def _reserve(self, rows: int) -> str:
        # Newlines first push what is on screen up out of the rows the table will take; setting
        # the region homes the cursor, so it is saved and restored around that.
        h = self._height
        return "\n" * h + f"\x1b[{h}A\x1b7\x1b[1;{rows - h}r\x1b8"


class JobMonitor:
    """Per-rank state of a running job, its metrics file and status display (the stall check,
    ``stalls.HangCheck``, reads ``rank_states``)."""

    def __init__(self, log_dir: str, job_id: str, ranks: Mapping[int, str], stream: TextIO,
                 live: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self._log_dir = log_dir
        self._job_id = job_id
        self._stream = stream
        self._clock = clock
        self._state = JobState(ranks)
        self._lock = threading.Lock()
        self._started = clock()
        self._footer = _Footer(stream, table_height(len(ranks))) if live else None
        self._next_status = self._started
        self._news_since_status = False
        self._dirty = False
        self._summary: Optional[dict[str, Any]] = None
        os.makedirs(log_dir, exist_ok=True)
        self._state.earlier_attempts = earlier_attempts(log_dir)
        self._launch = 1 + max((a.get("launch", 0) for a in self._state.earlier_attempts),
                               default=-1)
        # Appended to: a launch into a finished or stopped job's directory continues its history.
        self._metrics: Optional[TextIO] = open(os.path.join(log_dir, METRICS_FILE), "a")
        self._append({"event": EVENT_JOB, "job_id": job_id, "time": self._started,
                      "ranks": {str(r): h for r, h in sorted(ranks.items())}})

    @property
    def job_id(self) -> str:
        return self._job_id

    def on_event(self, event: Event) -> None:
        """Append the event's record to metrics.jsonl and fold it into the rank's state."""
        with self._lock:
            self._state.apply(event, self._clock())
            if event.kind == EVENT_EXITED:  # progress events are not kept: say when the last was
                last = self._state.ranks[event.rank].marks.last_progress
                self._append({**event.record, "last_progress": last})
            elif event.kind not in _LIVENESS:
                self._append(event.record)
            if event.kind in (contract.EVENT_STEP, contract.EVENT_EVAL):
                self._news_since_status = True

    def tick(self) -> None:
        """Flush metrics and redraw the status when due."""
        with self._lock:
            now = self._clock()
            if self._dirty and self._metrics is not None:
                self._metrics.flush()
                self._dirty = False
            if now >= self._next_status:
                self._show_status(now)

    def begin_attempt(self, ranks: Optional[Mapping[int, str]] = None) -> None:
        """A (restarted) job begins: no rank has made progress, finished or exited in it yet;
        what it reported before (steps, losses, evaluations) stays for the summary. ``ranks``:
        the attempt's ranks and hosts, when they changed (``--min-nodes``)."""
        with self._lock:
            if ranks is not None and ranks != {r: s.host for r, s in self._state.ranks.items()}:
                self._state.reshape(ranks)
            for state in self._state.ranks.values():
                state.progress = RankProgress()
                state.marks = Marks()
                state.finished = state.exited = False
                state.exit_code = None

    def attempt_ended(self, record: AttemptRecord) -> None:
        """One attempt of the job ended: an ``attempt`` record in metrics.jsonl, an entry of
        summary.json's ``attempts``."""
        entry = {**record.to_json(), "launch": self._launch}
        with self._lock:
            self._state.attempts.append(entry)
            self._append({"event": EVENT_ATTEMPT, "time": record.ended_at, **entry})
            if self._metrics is not None:  # a backoff follows: no tick flushes it
                self._metrics.flush()
                self._dirty = False

    def global_batch(self) -> Optional[int]:
        """The job's global batch, as its ranks' readers reported it; None before any did."""
        with self._lock:
            return self._state.global_batch

    def on_transfer(self, size: int, seconds: float) -> None:
        """Node 0 sent ``size`` bytes of checkpoint to a node that lacked them (any thread)."""
        with self._lock:
            _count(self._state.transferred, size, seconds)

    def on_collected(self, size: int, seconds: float) -> None:
        """An agent sent node 0 a checkpoint file of ``size`` bytes, in place after
        ``seconds`` (any thread)."""
        with self._lock:
            _count(self._state.collected, size, seconds)

    def storage_found(self, storage: Optional[str]) -> None:
        """What the ledger found of node 0's view of the ranks' files (``shared``,
        ``private``, or None: no step of several hosts completed)."""
        with self._lock:
            self._state.storage = storage

    def phases_note(self) -> Optional[str]:
        """The line that says where the ranks' time went (``launcher.startup``)."""
        with self._lock:
            return describe(job_phases({r: state.marks.phases()
                                        for r, state in self._state.ranks.items()}))

    def attempts_note(self, max_restarts: int) -> Optional[str]:
        """A line for a job that was restarted: each attempt's end, the last five at most."""
        with self._lock:
            attempts = list(self._state.attempts)
        if len(attempts) < 2:
            return None
        shown = [_attempt_text(a) for a in attempts[-5:]]
        more = f"{len(attempts) - 5} earlier, " if len(attempts) > 5 else ""
        return (f"npu-launch: {len(attempts)} attempts ({len(attempts) - 1} restart(s) of "
                f"{max_restarts}): {more}{'; '.join(shown)}")

    def checkpoint_note(self) -> Optional[str]:
        """A line for a job that wrote checkpoints but completed none, else None."""
        with self._lock:
            written = sorted({c["step"] for c in self._state.checkpoints if c["step"] is not None})
            if not written or self._state.complete_steps():
                return None
        shown = ", ".join(map(str, written[-5:]))
        return (f"npu-launch: checkpoints were written (step {shown}) but no step by every rank: "
                "none is complete to resume from")

    def rank_states(self) -> list[RankState]:
        """A copy of every rank's state, for the stall check (``stalls.HangCheck``)."""
        with self._lock:
            return [dataclasses.replace(s, progress=dataclasses.replace(s.progress))
                    for s in self._state.ranks.values()]

    def close(self, outcome: str, exit_code: int, message: str = "",
              stall: Optional[Stall] = None, cause: Optional[Cause] = None) -> dict:
        """Finish the display, close metrics.jsonl, write summary.json atomically; return it.

        Closing again returns the first summary unchanged."""
        with self._lock:
            if self._summary is None:
                self._finish_display()
                if self._metrics is not None:
                    self._metrics.close()
                    self._metrics = None
                self._summary = build_summary(self._job_id, self._state, self._started,
                                              self._clock(), str(getattr(outcome, "value", outcome)),
                                              exit_code, message, stall, cause)
                text = json.dumps(self._summary, indent=2, default=str) + "\n"
                atomic_write_bytes(os.path.join(self._log_dir, SUMMARY_FILE), text.encode())
            return self._summary

    def _append(self, record: Mapping[str, Any]) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(record, default=str) + "\n")
            self._dirty = True

    def _show_status(self, now: float) -> None:
        if self._footer is not None:
            self._next_status = now + _LIVE_INTERVAL
            self._footer.draw(status_table(self._job_id, self._state.ranks, now, self._started))
        elif self._news_since_status:
            line = status_line(self._state.ranks.values())
            if line is not None:
                self._next_status = now + _PLAIN_INTERVAL
                self._news_since_status = False
                _write(self._stream, f"npu-launch: {line}\n")

    def _finish_display(self) -> None:
        if self._footer is not None:
            now = self._clock()
            self._footer.close(status_table(self._job_id, self._state.ranks, now, self._started))

def _attempt_text(attempt: Mapping[str, Any]) -> str:
    cause = attempt.get("cause") or {}
    who = f" (rank {cause['rank']} on {cause.get('host')})" if cause.get("rank") is not None \
        else (f" ({cause['process']} on {cause.get('host')})" if cause.get("process") else "")
    left = attempt.get("left_out") or []
    without = f" without {', '.join(left)}" if left else ""
    return f"{attempt['outcome']}{who} after {attempt['duration_s']:.1f} s{without}"


def build_summary(job_id: str, state: JobState, started: Optional[float], ended: Optional[float],
                  outcome: str, exit_code: Optional[int], message: str = "",
                  stall: Optional[Stall] = None, cause: Optional[Cause] = None) -> dict[str, Any]:
    """The summary.json document: the one place that builds it, for the monitor at the end of a
    job and for ``npu-launch report`` rebuilding it from metrics.jsonl. ``root_cause`` is what
    ended the job, structured (``failures.Cause``); ``stall`` the first rank seen falling
    behind, whether or not it ended the job."""
    duration = ended - started if started is not None and ended is not None else None
    return {"job_id": job_id, "outcome": outcome, "exit_code": exit_code, "message": message,
            "root_cause": cause.to_json() if cause else None,
            "started_at": started, "ended_at": ended, "duration_s": duration,
            "stall": dataclasses.asdict(stall) if stall else None, **state.summary()}


def _count(moved: dict[str, Any], size: int, seconds: float) -> None:
    moved["files"] += 1
    moved["bytes"] += size
    moved["seconds"] += seconds


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed or broken console must not take the job down with it


def _terminal_size(stream: TextIO) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(stream.fileno())
        return size.columns, size.lines
    except (AttributeError, OSError, ValueError):
        return 80, 24


def _number(value: float) -> str:
    return f"{value:.4g}"


def earlier_attempts(log_dir: str) -> list[dict[str, Any]]:
    """The ``attempts`` of the summary.json an earlier launch left in ``log_dir`` (each with its
    ``launch``: 0 for the first); none when there is none or it cannot be read."""
    try:
        with open(os.path.join(log_dir, SUMMARY_FILE)) as f:
            attempts = json.load(f).get("attempts")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(attempts, list):
        return []
    return [{**a, "launch": a.get("launch", 0) if isinstance(a.get("launch"), int) else 0}
            for a in attempts if isinstance(a, dict)]
