"""``metrics.jsonl`` read back: each line a record whose known fields have their types.

A line that is not JSON or not UTF-8, or longer than ``MAX_LINE_BYTES``, is left out and named
in ``Notes``; so is a known field of the wrong type (the rest of its record is kept).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, Optional, Sequence

from launcher.limits import whole_number
from launcher.observe.read_values import (
    MAX_RANK,
    Notes,
    Reader,
    Unreadable,
    as_moment,
    as_rank,
    as_real,
    as_text,
    as_whole,
    clean_text,
    shown_value,
)
from parallel.contract import EVENT_ATTEMPT, EVENT_JOB, METRICS_FILE, Event
from rank_tables.bounded import JSON_DECODER

MAX_LINE_BYTES = 1 << 20
"""One line of ``metrics.jsonl``: a record is a few hundred bytes."""

RECORD_FIELDS: dict[str, Reader] = {
    "event": as_text, "host": as_text, "job_id": as_text, "exec_mode": as_text, "path": as_text,
    "rank": as_rank, "step": as_whole, "epoch": as_whole, "steps": as_whole, "samples": as_whole,
    "returncode": as_whole, "pid": as_whole,
    "time": as_moment, "loss": as_real, "samples_per_s": as_real, "final_loss": as_real, "accuracy": as_real,
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
            except Unreadable as e:
                notes.add(METRICS_FILE, where, f"{key}: {e}, got {shown_value(value)}")
    if "ranks" in record:
        typed["ranks"] = _host_map(record["ranks"], where, notes)
    return typed


def _host_map(value: Any, where: str, notes: Notes) -> dict[str, str]:
    if not isinstance(value, dict):
        notes.add(METRICS_FILE, where, f"ranks: not an object, got {shown_value(value)}")
        return {}
    ranks = {k: h for k, h in value.items() if whole_number(k) is not None and type(h) is str}
    if len(ranks) < len(value):
        notes.add(METRICS_FILE, where, f"ranks: {len(value) - len(ranks)} entries are not rank: host")
    return {k: clean_text(h) for k, h in ranks.items() if int(k) < MAX_RANK}


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
        notes.add(METRICS_FILE, where, f"not a JSON object, got {shown_value(record)}")
        return None
    return typed_record(record, where, notes)


def events_of(records: Iterable[Mapping[str, Any]]) -> tuple[Event, ...]:
    """The ranks' events among typed ``records``, each parsed once (``contract.Event``); the
    launcher's own records (``job``, ``attempt``) name no rank and are left out."""
    return tuple(filter(None, map(Event.parse, records)))


def kind_of(record: Mapping[str, Any]) -> Optional[str]:
    """The record's ``event`` (a typed record's is text, or absent)."""
    kind = record.get("event")
    return kind if isinstance(kind, str) else None


def of_kind(records: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    """The records whose ``event`` is ``kind``."""
    return [r for r in records if kind_of(r) == kind]


def attempt_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The launcher's ``attempt`` records (each read by ``AttemptEntry.from_json``)."""
    return of_kind(records, EVENT_ATTEMPT)


def names_a_rank(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any record is a rank's, or the launcher's ``job`` record that lists the ranks."""
    return any("rank" in r or kind_of(r) == EVENT_JOB for r in records)


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """The launcher's ``job`` record, the first line it writes: the job's id and each rank's host."""

    job_id: str
    hosts: dict[int, str]

    @classmethod
    def first_of(cls, records: Iterable[Mapping[str, Any]]) -> "JobRecord":
        """The first ``job`` record among typed ``records`` (``?`` and no hosts when none)."""
        job = next(iter(of_kind(records, EVENT_JOB)), {})
        job_id = job.get("job_id")
        return cls(job_id if isinstance(job_id, str) else "?",
                   {int(k): h for k, h in job.get("ranks", {}).items()})
