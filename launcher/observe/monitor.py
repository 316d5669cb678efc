"""Watching a running job from the host: metrics.jsonl, a status display, summary.json.
The per-rank state lives in ``launcher.observe.job_state``, the table and lines in
``launcher.observe.status_display``; the monitor feeds one and drives the other.

Node 0's ``Attempt`` (``launcher.attempt``) hands every rank event to ``JobMonitor.on_event``
(local ranks from their events files, remote ranks as their agents send them) and the watch
loop calls ``tick`` about every 20 ms. The monitor appends each record to
``<log_dir>/metrics.jsonl``, folds it into per-rank state and, at the end, writes
``<log_dir>/summary.json``.

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

The hang check (``stalls.HangCheck``) reads ``rank_states``: each rank's ``progress`` (its
``launcher.ranks.RankRecord``, folded once here for the hang check, the phases and node 0's
attempt) holds the monitor's clock when a record arrived, not the rank's own ``time``, so clock
skew between hosts cannot fake or hide a stall. The rank hook's ``progress`` events and the
supervisors' ``stack`` samples feed that check only: they are not written to metrics.jsonl
(twice a second per rank, and up to 64 KB each) and are not a rank's last event.

Every method holds one lock, so remote records may arrive from another thread. ``close`` belongs
in the supervisor's ``finally``: until it runs, a terminal keeps the scroll region.
"""
from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO

from launcher.files import read_json
from launcher.hangs.stalls import Busy, Stall
from launcher.observe.job_state import LIVENESS, JobState, RankState
from launcher.observe.startup import describe, slowest_ranks
from launcher.observe.status_display import Footer, status_line, status_table, table_height, write_console
from launcher.observe.summary_records import AttemptEntry
from launcher.ranks.record import FRAMEWORK_STOP, RankRecord
from launcher.run.failures import Cause
from launcher.run.restarts import AttemptRecord
from parallel import contract
from parallel.checkpoints.manifest import atomic_write_bytes
from parallel.contract import EVENT_ATTEMPT, EVENT_EXITED, EVENT_JOB, METRICS_FILE, SUMMARY_FILE, Event
from parallel.record_fields import JsonObject

_LIVE_INTERVAL = 1.0


_PLAIN_INTERVAL = 10.0
_BUSY_EVERY = 30.0
"""Seconds between two lines saying that a rank is still busy alone."""


_FAULT_IN_TEARDOWN = ("died in its exit handlers after its script ended cleanly (a fault in the "
                      "framework's teardown; the stacks are at the end of its log)")
_STOPPED_BY_FRAMEWORK = ("killed in its exit handlers after its script ended cleanly, by a "
                         "signal npu-launch did not send (MindSpore's cluster ends a rank so "
                         "once a peer left it first: 'Kill this process with SIGTERM' in its log)")


def _counted(crashes: Sequence[tuple[int, str, str]], why: str) -> str:
    """One line for ranks (rank, host, signal) that died in their exit handlers, not failed."""
    said = "; ".join(f"rank {rank} on {host} ({name})" for rank, host, name in crashes)
    return f"npu-launch: counted as exited 0: {said}: {why}"


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
        self._footer = Footer(stream, table_height(len(ranks))) if live else None
        self._next_status = self._started
        self._news_since_status = False
        self._dirty = False
        self._summary: Optional[dict[str, Any]] = None
        self._busy: dict[int, Busy] = {}
        """The ranks busy alone now (``stalls.busy_alone``), as the hang check last said."""
        self._next_busy_line = 0.0
        self._lingered: tuple[tuple[int, ...], float] = ((), 0.0)
        """Ranks stopped in their exit handlers in this attempt, and the limit they passed."""
        os.makedirs(log_dir, exist_ok=True)
        self._state.earlier_attempts = earlier_attempts(log_dir)
        self._launch = 1 + max((a.launch for a in self._state.earlier_attempts), default=-1)
        # Appended to: a launch into a finished or stopped job's directory continues its history.
        self._metrics: Optional[TextIO] = open(os.path.join(log_dir, METRICS_FILE), "a")
        self._append({"event": EVENT_JOB, "job_id": job_id, "time": self._started,
                      "ranks": {str(r): h for r, h in sorted(ranks.items())}})

    @property
    def job_id(self) -> str:
        return self._job_id

    def now(self) -> float:
        """The monitor's clock, which the records' times of arrival are on."""
        return self._clock()

    def on_event(self, event: Event) -> None:
        """Append the event's record to metrics.jsonl and fold it into the rank's state."""
        with self._lock:
            self._state.apply(event, self._clock())
            if event.kind == EVENT_EXITED:  # progress events are not kept: say when the last was
                last = self._state.ranks[event.rank].progress.last_progress
                self._append({**event.record, "last_progress": last})
            elif event.kind not in LIVENESS:
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
                state.begin_attempt()
            self._lingered = ((), 0.0)

    def attempt_ended(self, record: AttemptRecord) -> None:
        """One attempt of the job ended: an ``attempt`` record in metrics.jsonl, an entry of
        summary.json's ``attempts``."""
        entry = AttemptEntry.of(record, self._launch)
        with self._lock:
            self._state.attempts.append(entry)
            self._append({"event": EVENT_ATTEMPT, "time": record.ended_at, **entry.to_json()})
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
            self._state.transferred = self._state.transferred.plus(size, seconds)

    def on_collected(self, size: int, seconds: float) -> None:
        """An agent sent node 0 a checkpoint file of ``size`` bytes, in place after
        ``seconds`` (any thread)."""
        with self._lock:
            self._state.collected = self._state.collected.plus(size, seconds)

    def storage_found(self, storage: Optional[str]) -> None:
        """What the ledger found of node 0's view of the ranks' files (``shared``,
        ``private``, or None: no step of several hosts completed)."""
        with self._lock:
            self._state.storage = storage

    def phases_note(self) -> Optional[str]:
        """The line that says where the ranks' time went (``launcher.observe.startup``)."""
        with self._lock:
            return describe(slowest_ranks({r: state.progress.phases()
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
            written = sorted({c.step for c in self._state.checkpoints if c.step is not None})
            if not written or self._state.complete_steps():
                return None
        shown = ", ".join(map(str, written[-5:]))
        return (f"npu-launch: checkpoints were written (step {shown}) but no step by every rank: "
                "none is complete to resume from")

    def busy_alone(self, busy: Sequence[Busy]) -> None:
        """The hang check's word on who is busy alone now (each check, twice a second): a line
        when a spell begins and every ``_BUSY_EVERY`` seconds while it lasts; a ``busy-alone``
        record in metrics.jsonl for each spell that ended."""
        with self._lock:
            now = self._clock()
            ended = [spell for rank, spell in self._busy.items()
                     if rank not in {b.rank for b in busy}]
            self._busy = {b.rank: b for b in busy}
            self._record_busy(ended)
            if not busy:
                self._next_busy_line = 0.0
            elif now >= self._next_busy_line and self._footer is None:
                self._next_busy_line = now + _BUSY_EVERY
                write_console(self._stream, f"npu-launch: {self._busy_text()}\n")

    def _busy_text(self) -> str:
        spells = sorted(self._busy.values(), key=lambda b: b.rank)
        return "; ".join(b.text() for b in spells[:3]) + \
            (f"; {len(spells) - 3} more ranks busy alone" if len(spells) > 3 else "")

    def _record_busy(self, spells: Sequence[Busy]) -> None:
        for spell in spells:
            record = {"event": contract.EVENT_BUSY_ALONE, "rank": spell.rank, "host": spell.host,
                      "time": self._clock(), **spell.to_json()}
            self._append(record)
            event = Event.parse(record)
            if event is not None:
                self._state.apply(event, self._clock())

    def stopped_in_exit(self, ranks: Sequence[int], limit: float) -> None:
        """``ranks`` were still in their exit handlers ``limit`` seconds after every rank's
        script ended well (``attempt.lingering``): npu-launch stops them, not a failure."""
        with self._lock:
            self._lingered = (tuple(ranks), limit)

    def teardown_note(self) -> Optional[str]:
        """Lines for ranks of this attempt that died of a fault, or of a SIGTERM npu-launch did
        not send, in their exit handlers after a clean end of their script
        (``RankRecord.teardown_crash``), or were stopped there
        (``stopped_in_exit``): not failures; else None."""
        with self._lock:
            crashes = [(rank, state.host, name) for rank, state in sorted(self._state.ranks.items())
                       if (name := state.progress.teardown_crash())]
            stuck, limit = self._lingered
            hosts = {rank: state.host for rank, state in self._state.ranks.items()}
        lines = [_counted(group, why) for group, why in (
            ([c for c in crashes if c[2] != FRAMEWORK_STOP.name], _FAULT_IN_TEARDOWN),
            ([c for c in crashes if c[2] == FRAMEWORK_STOP.name], _STOPPED_BY_FRAMEWORK)) if group]
        if stuck:
            said = "; ".join(f"rank {rank} on {hosts.get(rank, '?')}" for rank in stuck)
            lines.append(f"npu-launch: counted as exited 0: {said}: still in its exit handlers "
                         f"{limit:g} s after every rank's script ended cleanly, stopped "
                         f"(--exit-timeout {limit:g}; 0 waits without a limit)")
        return "\n".join(lines) or None

    def rank_states(self) -> list[RankState]:
        """A copy of every rank's state, for the stall check (``stalls.HangCheck``)."""
        with self._lock:
            return [dataclasses.replace(s, progress=s.progress.copy())
                    for s in self._state.ranks.values()]

    def ranks_where(self, fact: Callable[[RankRecord], bool]) -> set[int]:
        """The ranks whose record in this attempt says ``fact`` (initialised, exited...)."""
        with self._lock:
            return {r for r, s in self._state.ranks.items() if fact(s.progress)}

    def record(self, rank: int) -> Optional[RankRecord]:
        """A copy of ``rank``'s record in this attempt; None for a rank not in the job."""
        with self._lock:
            state = self._state.ranks.get(rank)
            return state.progress.copy() if state is not None else None

    def close(self, outcome: str, exit_code: int, message: str = "",
              stall: Optional[Stall] = None, cause: Optional[Cause] = None,
              diagnosis: Sequence[Mapping[str, Any]] = ()) -> dict:
        """Finish the display, close metrics.jsonl, write summary.json atomically; return it.

        Closing again returns the first summary unchanged."""
        with self._lock:
            if self._summary is None:
                self._record_busy(list(self._busy.values()))
                self._busy = {}
                self._finish_display()
                if self._metrics is not None:
                    self._metrics.close()
                    self._metrics = None
                self._summary = build_summary(self._job_id, self._state, self._started,
                                              self._clock(), str(getattr(outcome, "value", outcome)),
                                              exit_code, message, stall, cause, diagnosis)
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
            table = status_table(self._job_id, self._state.ranks, now, self._started)
            if self._busy:
                table[0] += f"  |  {self._busy_text()}"
            self._footer.draw(table)
        elif self._news_since_status:
            line = status_line(self._state.ranks.values())
            if line is not None:
                self._next_status = now + _PLAIN_INTERVAL
                self._news_since_status = False
                write_console(self._stream, f"npu-launch: {line}\n")

    def _finish_display(self) -> None:
        if self._footer is not None:
            now = self._clock()
            self._footer.close(status_table(self._job_id, self._state.ranks, now, self._started))


def _attempt_text(attempt: AttemptEntry) -> str:
    without = f" without {', '.join(attempt.left_out)}" if attempt.left_out else ""
    return f"{attempt.outcome}{attempt.who} after {attempt.duration_s or 0.0:.1f} s{without}"


def build_summary(job_id: str, state: JobState, started: Optional[float], ended: Optional[float],
                  outcome: str, exit_code: Optional[int], message: str = "",
                  stall: Optional[Stall] = None, cause: Optional[Cause] = None,
                  diagnosis: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The summary.json document: the one place that builds it, for the monitor at the end of a
    job and for ``npu-launch report`` rebuilding it from metrics.jsonl. ``root_cause`` is what
    ended the job, structured (``failures.Cause``); ``stall`` the first rank seen falling
    behind, whether or not it ended the job; ``diagnosis`` the known faults found in the
    logs (``launcher.diagnose``: rank, host, id, cause, fix, evidence, consequence_of)."""
    duration = ended - started if started is not None and ended is not None else None
    return {"job_id": job_id, "outcome": outcome, "exit_code": exit_code, "message": message,
            "root_cause": cause.to_json() if cause else None,
            "diagnosis": [dict(d) for d in diagnosis],
            "started_at": started, "ended_at": ended, "duration_s": duration,
            "stall": dataclasses.asdict(stall) if stall else None, **state.summary()}


def earlier_attempts(log_dir: str) -> list[AttemptEntry]:
    """The ``attempts`` of the summary.json an earlier launch left in ``log_dir`` (each with its
    ``launch``: 0 for the first); none when there is none or it cannot be read."""
    summary = JsonObject.of(read_json(os.path.join(log_dir, SUMMARY_FILE)))
    attempts = summary.items("attempts") if summary else None
    if attempts is None:
        return []
    return [AttemptEntry.from_json(a) for a in attempts if isinstance(a, dict)]
