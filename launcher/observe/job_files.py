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
import json
import math
import os
import stat
from typing import Any, BinaryIO, Callable, Iterator, Mapping, Optional, Sequence

from launcher.errors import LaunchError
from launcher.limits import MAX_NODES, MAX_RANK_TABLE_BYTES, MAX_RANKS_PER_NODE, MAX_SHOWN, whole_number
from launcher.observe import startup
from launcher.observe.job_state import JobState, exec_mode_of
from launcher.observe.monitor import build_summary
from parallel.config import ExecMode
from parallel.contract import EVENT_ATTEMPT, EVENT_JOB, METRICS_FILE, SUMMARY_FILE, Event
from rank_tables.bounded import JSON_DECODER, LongNumber, UnreadableFile, display_name, parse_json, read_text

MAX_SUMMARY_BYTES = MAX_RANK_TABLE_BYTES
"""``summary.json``: a few hundred bytes per rank and evaluation, so room for thousands of ranks."""
MAX_LINE_BYTES = 1 << 20
"""One line of ``metrics.jsonl``: a record is a few hundred bytes."""
MAX_RANK = MAX_NODES * MAX_RANKS_PER_NODE
"""Ranks are numbered below this: no job has more."""
LATEST_TIME = 253402300799.0
"""The last second ``datetime`` can show (9999-12-31); a time is within 0 .. this."""
_LARGEST_WHOLE = 2 ** 53
_NOTES_PER_FILE = 10
_TEXT_CHARS = 200


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


# What could not be read ------------------------------------------------------------------------

class Notes:
    """What could not be read, per file: the first ``_NOTES_PER_FILE`` named, the rest counted."""

    def __init__(self) -> None:
        self._named: dict[str, list[str]] = {}
        self._more: dict[str, int] = {}

    def add(self, file: str, where: str, problem: str) -> None:
        """``where`` is a line number or JSON path inside ``file`` ("" for the whole file)."""
        named = self._named.setdefault(file, [])
        if len(named) < _NOTES_PER_FILE:
            named.append(f"skipped {file}{':' if where else ''}{where}: {problem}")
        else:
            self._more[file] = self._more.get(file, 0) + 1

    def lines(self) -> list[str]:
        out = []
        for file, named in self._named.items():
            out += named
            if self._more.get(file):
                out.append(f"skipped {self._more[file]} more in {file}")
        return out

    def count(self, file: str) -> int:
        """How many problems were noted in ``file``."""
        return len(self._named.get(file, ())) + self._more.get(file, 0)

    def first(self, file: str) -> Optional[str]:
        """The first problem noted in ``file``, without its ``skipped`` prefix."""
        named = self._named.get(file)
        return named[0][len("skipped "):] if named else None


class _Unreadable(ValueError):
    """A value of the wrong type or out of range; the message says what was expected."""


def _shown_value(value: Any) -> str:
    """A JSON value, short, for a note."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    if type(value) is LongNumber:
        return f"a number of {value.digits} digits"
    return _clean(json.dumps(value[:MAX_SHOWN + 1] if isinstance(value, str) else value,
                                 ensure_ascii=False), MAX_SHOWN)


def _whole(value: Any) -> int:
    """An int (not a bool) within 2^53 either side, an integral float, or digits in a string."""
    number: Optional[int] = None
    if type(value) is int:
        number = value
    elif type(value) is float and value.is_integer():
        number = int(value)
    elif type(value) is str:
        negative = value.startswith("-")
        digits = whole_number(value[1:] if negative else value)
        number = None if digits is None else (-digits if negative else digits)
    if number is None or abs(number) > _LARGEST_WHOLE:
        raise _Unreadable("not a whole number")
    return number


def _rank(value: Any) -> int:
    number = _whole(value)
    if not 0 <= number < MAX_RANK:
        raise _Unreadable(f"not a rank (0 to {MAX_RANK - 1})")
    return number


def _real(value: Any) -> float:
    """A number, NaN and infinities included (a diverged loss), or one written in a string (the
    rank side writes a value JSON cannot hold, such as a float32, with ``str``)."""
    if type(value) in (int, float):
        return float(value)
    if type(value) is str and value.isascii() and len(value) <= 32:
        try:
            return float(value)
        except ValueError:
            pass
    raise _Unreadable("not a number")


def _moment(value: Any) -> float:
    """Seconds since the epoch, within what a clock can show."""
    seconds = _real(value)
    if not 0 <= seconds <= LATEST_TIME:  # False for NaN too
        raise _Unreadable(f"not a time (seconds from 0 to {LATEST_TIME:.0f})")
    return seconds


def _text(value: Any) -> str:
    """A string, with control characters escaped (a hostile file must not drive the terminal)
    and cut to ``_TEXT_CHARS``."""
    if type(value) is not str:
        raise _Unreadable("not text")
    return _clean(value)


_MESSAGE_LINES = 30


def _message(value: Any) -> str:
    """The job's closing block (several lines): each line cleaned, at most ``_MESSAGE_LINES``
    of them and 2000 characters in all."""
    lines = _text_of(value).splitlines()
    kept = [_clean(line, 2000) for line in lines[:_MESSAGE_LINES]]
    if len(lines) > _MESSAGE_LINES:
        kept.append(f"...({len(lines) - _MESSAGE_LINES} more lines)")
    text = "\n".join(kept)
    return text if len(text) <= 2000 else f"{text[:2000]}...({len(text)} chars)"


def _text_of(value: Any) -> str:
    if type(value) is not str:
        raise _Unreadable("not text")
    return value


def _clean(value: str, limit: int = _TEXT_CHARS) -> str:
    if len(value) <= limit and value.isprintable():
        return value
    cut = value[:limit]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut if len(value) <= limit else f"{cut}...({len(value)} chars)"


Reader = Callable[[Any], Any]


@dataclasses.dataclass
class _Fields:
    """Reads typed fields of one JSON object, noting each one that is there but unreadable."""

    doc: Mapping[str, Any]
    file: str
    where: str
    notes: Notes
    read: int = 0

    def get(self, key: str, reader: Reader, default: Any = None) -> Any:
        value = self.doc.get(key)
        if value is None:
            return default
        try:
            typed = reader(value)
        except _Unreadable as e:
            self.notes.add(self.file, f"{self.where}{key}", f"{e}, got {_shown_value(value)}")
            return default
        self.read += 1
        return typed

    def objects(self, key: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The objects of list ``key`` with their JSON paths; other items are noted."""
        value = self.doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.notes.add(self.file, f"{self.where}{key}", f"not a list, got {_shown_value(value)}")
            return []
        self.read += 1
        found: list[tuple[str, Mapping[str, Any]]] = []
        for index, item in enumerate(value):
            where = f"{self.where}{key}[{index}]"
            if isinstance(item, dict):
                found.append((where, item))
            else:
                self.notes.add(self.file, where, f"not an object, got {_shown_value(item)}")
        return found

    def object(self, key: str) -> Optional[Mapping[str, Any]]:
        value = self.doc.get(key)
        if value is None or isinstance(value, dict):
            return value
        self.notes.add(self.file, f"{self.where}{key}", f"not an object, got {_shown_value(value)}")
        return None

    def nested(self, doc: Mapping[str, Any], where: str) -> "_Fields":
        return _Fields(doc, self.file, where + ".", self.notes)


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
    def parse(cls, fields: _Fields) -> "RankRow":
        row = cls(rank=fields.get("rank", _rank), host=fields.get("host", _text, "?"),
                  exit_code=fields.get("exit_code", _whole), steps=fields.get("steps", _whole),
                  final_loss=fields.get("final_loss", _real), samples_per_s=fields.get("samples_per_s", _real),
                  exec_mode=exec_mode_of(fields.get("exec_mode", _text)), eval_accuracy=None, eval_loss=None,
                  last_event=fields.get("last_event", _text, ""),
                  last_event_time=fields.get("last_event_time", _moment))
        held_out = fields.object("eval")
        if not held_out:
            return row
        evaluation = fields.nested(held_out, fields.where + "eval")
        return dataclasses.replace(row, eval_accuracy=evaluation.get("accuracy", _real),
                                   eval_loss=evaluation.get("loss", _real))


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

    @classmethod
    def parse(cls, fields: _Fields) -> "AttemptRow":
        cause = fields.object("cause") or {}
        said = fields.nested(cause, fields.where + "cause")
        process, rank, host = said.get("process", _text), said.get("rank", _rank), \
            said.get("host", _text)
        who = f"rank {rank}" if rank is not None else (process or "")
        return cls(fields.get("attempt", _whole), fields.get("outcome", _text, "?"),
                   fields.get("duration_s", _real), fields.get("resumed_from", _whole),
                   fields.get("nodes", _whole), fields.get("world_size", _whole),
                   fields.get("waited_s", _real), f"{who} on {host}" if who and host else who)


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
    checkpoint_files: int
    checkpoint_steps: tuple[int, ...]
    ranks: tuple[RankRow, ...]
    phases: tuple[tuple[str, float, int, float], ...] = ()
    """(phase, the slowest rank's seconds, that rank, the median): ``launcher.observe.startup``."""
    attempts: tuple[AttemptRow, ...] = ()

    @classmethod
    def parse(cls, doc: Mapping[str, Any], file: str, notes: Notes) -> tuple["JobSummary", int]:
        """The summary in ``doc`` and how many of its fields could be read."""
        fields = _Fields(doc, file, "", notes)
        checkpoints = fields.objects("checkpoints")
        steps = {fields.nested(c, where).get("step", _whole) for where, c in checkpoints}
        ranks = tuple(RankRow.parse(fields.nested(r, where)) for where, r in fields.objects("ranks"))
        summary = cls(job_id=fields.get("job_id", _text, "?"), outcome=fields.get("outcome", _text, "?"),
                      exit_code=fields.get("exit_code", _whole),
                      message=fields.get("message", _message, ""),
                      started_at=fields.get("started_at", _moment), ended_at=fields.get("ended_at", _moment),
                      duration_s=fields.get("duration_s", _real), world_size=fields.get("world_size", _whole),
                      global_samples_per_s=fields.get("global_samples_per_s", _real),
                      last_step=fields.get("last_step", _whole), checkpoint_files=len(checkpoints),
                      checkpoint_steps=tuple(sorted(s for s in steps if s is not None)), ranks=ranks,
                      phases=_phases(fields.object("phases")),
                      attempts=tuple(AttemptRow.parse(fields.nested(a, where))
                                     for where, a in fields.objects("attempts")))
        return summary, fields.read


def _phases(doc: Optional[Mapping[str, Any]]) -> tuple[tuple[str, float, int, float], ...]:
    """The phases ``startup.job_phases`` wrote; one that is not as it writes them is left out."""
    found = []
    for name, seconds, rank, median in startup.rows(doc or {}):
        if _is_number(seconds) and _is_number(median) and isinstance(rank, int) \
                and not isinstance(rank, bool):
            found.append((name, float(seconds), rank, float(median)))
    return tuple(found)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# metrics.jsonl as typed records -----------------------------------------------------------------

RECORD_FIELDS: dict[str, Reader] = {
    "event": _text, "host": _text, "job_id": _text, "exec_mode": _text, "path": _text,
    "rank": _rank, "step": _whole, "epoch": _whole, "steps": _whole, "samples": _whole,
    "returncode": _whole, "pid": _whole,
    "time": _moment, "loss": _real, "samples_per_s": _real, "final_loss": _real, "accuracy": _real,
}
"""The fields of an event record that the report and the monitor's fold read, and their types."""


def typed_record(record: Mapping[str, Any], where: str, notes: Notes) -> dict[str, Any]:
    """``record`` with each known field of its type; a field that is not is left out, and noted."""
    typed = {}
    for key, value in record.items():
        reader = RECORD_FIELDS.get(key)
        if reader is None:
            typed[key] = value
        elif value is not None:  # null is as good as absent
            try:
                typed[key] = reader(value)
            except _Unreadable as e:
                notes.add(METRICS_FILE, where, f"{key}: {e}, got {_shown_value(value)}")
    if "ranks" in record:
        typed["ranks"] = _host_map(record["ranks"], where, notes)
    return typed


def _host_map(value: Any, where: str, notes: Notes) -> dict[str, str]:
    if not isinstance(value, dict):
        notes.add(METRICS_FILE, where, f"ranks: not an object, got {_shown_value(value)}")
        return {}
    ranks = {k: h for k, h in value.items() if whole_number(k) is not None and type(h) is str}
    if len(ranks) < len(value):
        notes.add(METRICS_FILE, where, f"ranks: {len(value) - len(ranks)} entries are not rank: host")
    return {k: _clean(h) for k, h in ranks.items() if int(k) < MAX_RANK}


def read_records(path: str, notes: Optional[Notes] = None) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines file, typed; what is skipped is noted in ``notes``."""
    notes = notes if notes is not None else Notes()
    with open(path, "rb") as f:
        for number, line in _lines(f):
            record = _record(line, str(number), notes)
            if record is not None:
                yield record


def _lines(f: BinaryIO) -> Iterator[tuple[int, Optional[bytes]]]:
    """Numbered lines, each read within ``MAX_LINE_BYTES`` (None for one longer than that)."""
    number = 0
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) <= MAX_LINE_BYTES:
            yield number, line
            continue
        while line and not line.endswith(b"\n"):  # the rest of the long line, in bounded reads
            line = f.readline(MAX_LINE_BYTES)
        yield number, None


def _record(line: Optional[bytes], where: str, notes: Notes) -> Optional[dict[str, Any]]:
    if line is None:
        notes.add(METRICS_FILE, where, f"longer than {MAX_LINE_BYTES >> 20} MiB")
        return None
    if not line.strip():
        return None
    try:
        record = JSON_DECODER.decode(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        notes.add(METRICS_FILE, where, f"not UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1})")
        return None
    except json.JSONDecodeError as e:
        notes.add(METRICS_FILE, where, f"not JSON ({e.msg} at column {e.colno})")
        return None
    except RecursionError:
        notes.add(METRICS_FILE, where, "nested too deep")
        return None
    # No find_problem walk here (it would double the cost of a line): only the typed fields are
    # read, and those refuse a LongNumber; NaN and infinities are values a loss may take.
    if not isinstance(record, dict):
        notes.add(METRICS_FILE, where, f"not a JSON object, got {_shown_value(record)}")
        return None
    return typed_record(record, where, notes)


# The command -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class JobFiles:
    """What a log directory held, read: the summary, the records and what could not be read."""

    summary: JobSummary
    records: tuple[dict[str, Any], ...]
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
        return JobFiles(summary, records, "", tuple(notes.lines()))
    if records:
        derived, _ = JobSummary.parse(derive_summary(records), METRICS_FILE, notes)
        note = f"{summary_problem}: derived from {METRICS_FILE} (outcome unknown)"
        return JobFiles(derived, records, note, tuple(notes.lines()))
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
        return None, f"unreadable {SUMMARY_FILE}: not a JSON object, got {_shown_value(doc)}"
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
    if any("rank" in r or r.get("event") == EVENT_JOB for r in records):
        return records, ""
    first = notes.first(METRICS_FILE)
    return (), f"no readable record of a rank in {METRICS_FILE}" + (f" ({first})" if first else "")


def summary_from_metrics(path: str) -> dict[str, Any]:
    """What summary.json would say, as far as the records show (no outcome, no exit code)."""
    return derive_summary(list(read_records(path)))


def derive_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary.json document that typed ``records`` make, by the monitor's own fold."""
    job = next((r for r in records if r.get("event") == EVENT_JOB), {})
    state = JobState({int(k): h for k, h in job.get("ranks", {}).items()})
    times = [r["time"] for r in records if "time" in r]
    for event in filter(None, map(Event.parse, records)):
        state.apply(event, event.time or 0.0)
    state.attempts = [{k: v for k, v in r.items() if k not in ("event", "time")}
                      for r in records if r.get("event") == EVENT_ATTEMPT]
    return build_summary(job.get("job_id", "?"), state, min(times, default=None),
                         max(times, default=None), "unknown", None)
