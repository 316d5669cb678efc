"""A job's files read back: ``summary.json`` and ``metrics.jsonl`` parsed into typed values.

A log directory may hold anything: a value of the wrong type, NaN where a time belongs, a line
that is not JSON or not UTF-8, a 5 MB line, a ``summary.json`` of gigabytes. Both files are
parsed where they are read into typed values (``JobSummary``, ``RankRow`` and records whose
known fields have their types). What cannot be read is left out and named in a line such as
``skipped metrics.jsonl:17: not JSON (...)``; ``read_job`` raises ``ReportError`` only when
nothing could be read. Without a ``summary.json`` (the launcher was killed, or the job still
runs) the summary is rebuilt from ``metrics.jsonl`` by the monitor's own fold.
"""
from __future__ import annotations

import dataclasses
import os
import stat
from typing import Any, Mapping, Optional, Sequence

from launcher.errors import LaunchError
from launcher.limits import MAX_RANK_TABLE_BYTES
from launcher.observe import startup
from launcher.observe.job_state import JobState, exec_mode_of
from launcher.observe.metrics_records import JobRecord, attempt_records, events_of, names_a_rank, read_records
from launcher.observe.monitor import build_summary
from launcher.observe.read_values import (
    Fields,
    Notes,
    as_message,
    as_moment,
    as_rank,
    as_real,
    as_text,
    as_whole,
    shown_value,
)
from launcher.observe.summary_records import AttemptEntry, CheckpointRecord
from parallel.config import ExecMode
from parallel.contract import METRICS_FILE, SUMMARY_FILE, Event
from parallel.record_fields import JsonObject
from rank_tables.bounded import UnreadableFile, display_name, parse_json, read_text

MAX_SUMMARY_BYTES = MAX_RANK_TABLE_BYTES
"""``summary.json``: a few hundred bytes per rank and evaluation, so room for thousands of ranks."""


class ReportError(LaunchError):
    """Nothing in the log directory could be read."""


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """What to report on and where the plot goes (None: no plot)."""

    log_dir: str
    plot_path: Optional[str]

    @classmethod
    def build(cls, log_dir: str, output: Optional[str], no_plot: bool) -> "ReportOptions":
        if not os.path.isdir(log_dir):
            what = "not a directory" if os.path.exists(log_dir) else "no such log directory"
            raise LaunchError(f"{display_name(log_dir)}: {what}")
        plot = None if no_plot else (output or os.path.join(log_dir, "report.png"))
        if plot is not None:
            _check_plot_path(plot)
        return cls(log_dir, plot)

    @property
    def plot_format(self) -> str:
        """The image format the plot is written in: its name's extension, or PNG without one."""
        return plot_format(self.plot_path or "")

    @property
    def summary_path(self) -> str:
        return os.path.join(self.log_dir, SUMMARY_FILE)

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.log_dir, METRICS_FILE)


PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")
"""The images ``report -o`` writes, by the name's extension (none: PNG, named as given)."""


def plot_format(path: str) -> str:
    """The format of a plot named ``path``: its extension in lower case, ``png`` if none."""
    extension = os.path.splitext(os.path.basename(path))[1]
    return extension[1:].lower() if extension else "png"


def _check_plot_path(plot: str) -> None:
    if not os.path.isdir(os.path.dirname(os.path.abspath(plot))):
        raise LaunchError(f"{display_name(plot)}: its folder does not exist")
    if len(os.fsencode(os.path.basename(plot))) > _NAME_MAX:
        raise LaunchError(f"{display_name(plot)}: a file name longer than {_NAME_MAX} bytes")
    if plot_format(plot) not in PLOT_FORMATS:
        raise LaunchError(f"--output {display_name(plot)}: cannot write a .{plot_format(plot)} "
                          f"image; name it .{', .'.join(PLOT_FORMATS)} (or give no extension: PNG)")


_NAME_MAX = 255
"""Bytes in one file name (Linux's NAME_MAX): longer is ENAMETOOLONG when the plot is saved."""

# summary.json as typed values -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RankRow:
    """One rank's line of the table."""

    rank: Optional[int]
    host: str
    exit_code: Optional[int]
    steps: Optional[int]
    final_loss: Optional[float]
    samples_per_s: Optional[float]
    exec_mode: Optional[ExecMode]
    eval_accuracy: Optional[float]
    eval_loss: Optional[float]
    last_event: str
    last_event_time: Optional[float]

    @classmethod
    def parse(cls, fields: Fields) -> "RankRow":
        row = cls(rank=fields.value("rank", as_rank), host=fields.value("host", as_text, "?"),
                  exit_code=fields.value("exit_code", as_whole), steps=fields.value("steps", as_whole),
                  final_loss=fields.value("final_loss", as_real), samples_per_s=fields.value("samples_per_s", as_real),
                  exec_mode=exec_mode_of(fields.value("exec_mode", as_text)), eval_accuracy=None, eval_loss=None,
                  last_event=fields.value("last_event", as_text, ""),
                  last_event_time=fields.value("last_event_time", as_moment))
        held_out = fields.object("eval")
        if not held_out:
            return row
        evaluation = fields.nested(held_out, fields.where + "eval")
        return dataclasses.replace(row, eval_accuracy=evaluation.value("accuracy", as_real),
                                   eval_loss=evaluation.value("loss", as_real))


@dataclasses.dataclass(frozen=True)
class AttemptRow:
    """One attempt of the job (summary.json's ``attempts``), as the report lists it."""

    attempt: Optional[int]
    outcome: str
    duration_s: Optional[float]
    resumed_from: Optional[int]
    nodes: Optional[int]
    world_size: Optional[int]
    waited_s: Optional[float]
    cause: str
    """Whose failure ended it: ``rank 3 on vm2``, ``agent on vm2``, or ""."""
    launch: Optional[int] = None
    """The launch into the log directory it belongs to (0 for the first)."""

    @classmethod
    def parse(cls, fields: Fields) -> "AttemptRow":
        cause = fields.object("cause") or {}
        said = fields.nested(cause, fields.where + "cause")
        process, rank, host = said.value("process", as_text), said.value("rank", as_rank), \
            said.value("host", as_text)
        who = f"rank {rank}" if rank is not None else (process or "")
        return cls(fields.value("attempt", as_whole), fields.value("outcome", as_text, "?"),
                   fields.value("duration_s", as_real), fields.value("resumed_from", as_whole),
                   fields.value("nodes", as_whole), fields.value("world_size", as_whole),
                   fields.value("waited_s", as_real), f"{who} on {host}" if who and host else who,
                   fields.value("launch", as_whole))


@dataclasses.dataclass(frozen=True)
class JobSummary:
    """What the report says about the job: summary.json's fields, typed."""

    job_id: str
    outcome: str
    exit_code: Optional[int]
    message: str
    started_at: Optional[float]
    ended_at: Optional[float]
    duration_s: Optional[float]
    world_size: Optional[int]
    global_samples_per_s: Optional[float]
    last_step: Optional[int]
    checkpoints: tuple[CheckpointRecord, ...]
    ranks: tuple[RankRow, ...]
    phases: tuple[startup.SlowestRank, ...] = ()
    """Each phase's slowest rank and the median (``launcher.observe.startup``)."""
    attempts: tuple[AttemptRow, ...] = ()

    @property
    def checkpoint_files(self) -> int:
        """How many checkpoint files the ranks reported."""
        return len(self.checkpoints)

    @property
    def checkpoint_steps(self) -> tuple[int, ...]:
        """The steps those files are of, in order, each once."""
        return tuple(sorted({c.step for c in self.checkpoints if c.step is not None}))

    @classmethod
    def parse(cls, doc: Mapping[str, Any], file: str, notes: Notes) -> tuple["JobSummary", int]:
        """The summary in ``doc`` and how many of its fields could be read."""
        fields = Fields(doc, file, "", notes)
        checkpoints = tuple(CheckpointRecord.parse(fields.nested(c, where))
                            for where, c in fields.objects("checkpoints"))
        ranks = tuple(RankRow.parse(fields.nested(r, where)) for where, r in fields.objects("ranks"))
        summary = cls(job_id=fields.value("job_id", as_text, "?"), outcome=fields.value("outcome", as_text, "?"),
                      exit_code=fields.value("exit_code", as_whole),
                      message=fields.value("message", as_message, ""),
                      started_at=fields.value("started_at", as_moment), ended_at=fields.value("ended_at", as_moment),
                      duration_s=fields.value("duration_s", as_real), world_size=fields.value("world_size", as_whole),
                      global_samples_per_s=fields.value("global_samples_per_s", as_real),
                      last_step=fields.value("last_step", as_whole), checkpoints=checkpoints,
                      ranks=ranks,
                      phases=startup.read_phases(JsonObject.of(fields.object("phases"))),
                      attempts=tuple(AttemptRow.parse(fields.nested(a, where))
                                     for where, a in fields.objects("attempts")))
        return summary, fields.read


# The command -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JobFiles:
    """What a log directory held, read: the summary, the ranks' events in metrics.jsonl and
    what could not be read."""

    summary: JobSummary
    events: tuple[Event, ...]
    note: str
    """Why the summary was derived from the records, or ""."""
    skipped: tuple[str, ...]


def read_job(options: ReportOptions) -> JobFiles:
    """summary.json, or one derived from metrics.jsonl with a note saying so; ``ReportError``
    when neither gives anything."""
    notes = Notes()
    records, metrics_problem = _read_metrics(options.metrics_path, notes)
    summary, summary_problem = _read_summary(options.summary_path, notes)
    if summary is not None:
        return JobFiles(summary, events_of(records), "", tuple(notes.lines()))
    if records:
        derived, _ = JobSummary.parse(derive_summary(records), METRICS_FILE, notes)
        note = f"{summary_problem}: derived from {METRICS_FILE} (outcome unknown)"
        return JobFiles(derived, events_of(records), note, tuple(notes.lines()))
    neither = (summary_problem, metrics_problem) == (f"no {SUMMARY_FILE}", f"no {METRICS_FILE}")
    both = " and " if neither else "; "
    raise ReportError(f"{display_name(options.log_dir)}: {summary_problem}{both}{metrics_problem}: "
                      "not an npu-launch log directory?")


def _read_summary(path: str, notes: Notes) -> tuple[Optional[JobSummary], str]:
    """The summary, or None and why not."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read; /dev/zero never ends
            return None, f"unreadable {SUMMARY_FILE}: not a regular file"
    except FileNotFoundError:
        return None, f"no {SUMMARY_FILE}"
    except OSError as e:
        return None, f"unreadable {SUMMARY_FILE}: {e.strerror or e}"
    try:
        text = read_text(path, MAX_SUMMARY_BYTES, SUMMARY_FILE, name=SUMMARY_FILE)
        doc = parse_json(text, SUMMARY_FILE, allow_constants=True)
    except UnreadableFile as e:
        return None, f"unreadable {e.message}"
    if not isinstance(doc, dict):
        return None, f"unreadable {SUMMARY_FILE}: not a JSON object, got {shown_value(doc)}"
    summary, read = JobSummary.parse(doc, SUMMARY_FILE, notes)
    if not read:
        return None, f"unreadable {SUMMARY_FILE}: " + _why_no_field(notes)
    return summary, ""


def _why_no_field(notes: Notes) -> str:
    """Why no field of a summary could be read: none is there, or each one there was skipped
    (the first named, the others counted)."""
    first = notes.first(SUMMARY_FILE)
    if first is None:
        return "no field of a job summary in it"
    more = notes.count(SUMMARY_FILE) - 1
    return (f"no field could be read: {first[len(SUMMARY_FILE) + 1:]}"
            + (f" (and {more} more skipped)" if more else ""))


def _read_metrics(path: str, notes: Notes) -> tuple[tuple[dict[str, Any], ...], str]:
    """The typed records, and when there are none, why."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return (), f"unreadable {METRICS_FILE}: not a regular file"
        records = tuple(read_records(path, notes))
    except FileNotFoundError:
        return (), f"no {METRICS_FILE}"
    except OSError as e:
        return (), f"unreadable {METRICS_FILE}: {e.strerror or e}"
    if names_a_rank(records):
        return records, ""
    first = notes.first(METRICS_FILE)
    return (), f"no readable record of a rank in {METRICS_FILE}" + (f" ({first})" if first else "")


def summary_from_metrics(path: str) -> dict[str, Any]:
    """What summary.json would say, as far as the records show (no outcome, no exit code)."""
    return derive_summary(list(read_records(path)))


def derive_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary.json document that typed ``records`` make, by the monitor's own fold."""
    job = JobRecord.first_of(records)
    state = JobState(job.hosts)
    times = [r["time"] for r in records if "time" in r]
    for event in events_of(records):
        state.apply(event, event.time or 0.0)
    state.attempts = [AttemptEntry.from_json(r) for r in attempt_records(records)]
    return build_summary(job.job_id, state, min(times, default=None),
                         max(times, default=None), "unknown", None)
