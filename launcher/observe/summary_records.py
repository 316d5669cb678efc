"""The records ``summary.json`` lists, as values that write and read themselves: each checkpoint
file a rank reported (``checkpoints``), each attempt of the job (``attempts``) and the checkpoint
files moved between hosts (``checkpoints_sent``, ``checkpoints_collected``).

The monitor builds them from events and ``AttemptRecord``s and writes them with ``to_json``.
Read back, the file is untrusted: a checkpoint is read by ``CheckpointRecord.parse`` with the
report's readers (a value of the wrong type is noted and left out), and an earlier launch's
attempt by ``AttemptEntry.from_json``, which keeps each field of its type and drops the rest
(what it keeps is written again as it was read).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from launcher.observe.read_values import Fields, Unreadable, as_moment, as_rank, as_text, as_whole
from launcher.run.failures import Cause
from launcher.run.restarts import AttemptRecord
from parallel.record_fields import JsonObject


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint file one rank reported (``contract.EVENT_CHECKPOINT``); ``time`` is the
    rank's clock, ``complete`` whether its step was complete when the summary was written."""

    rank: Optional[int]
    step: Optional[int]
    host: str
    path: Optional[str]
    time: Optional[float]
    complete: bool = False

    def to_json(self) -> dict[str, Any]:
        """The entry of summary.json's ``checkpoints``."""
        return {"rank": self.rank, "step": self.step, "host": self.host, "path": self.path,
                "time": self.time, "complete": self.complete}

    @classmethod
    def parse(cls, fields: Fields) -> "CheckpointRecord":
        """The entry ``fields`` reads (summary.json read back); what cannot be read is noted."""
        return cls(rank=fields.value("rank", as_rank), step=fields.value("step", as_whole),
                   host=fields.value("host", as_text, "?"), path=fields.value("path", as_text),
                   time=fields.value("time", as_moment), complete=fields.value("complete", _flag, False))


def _flag(value: Any) -> bool:
    if type(value) is not bool:
        raise Unreadable("not true or false")
    return value


@dataclasses.dataclass(frozen=True)
class FilesMoved:
    """Checkpoint files moved between hosts, counted: how many, their bytes, the seconds it took."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def plus(self, size: int, seconds: float) -> "FilesMoved":
        """These and one more file of ``size`` bytes, moved in ``seconds``."""
        return FilesMoved(self.files + 1, self.bytes + size, self.seconds + seconds)

    def to_json(self) -> dict[str, Any]:
        """As summary.json's ``checkpoints_sent`` and ``checkpoints_collected`` say it."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AttemptEntry:
    """One attempt of the job as summary.json's ``attempts`` lists it: the attempt's record
    (``launcher.run.restarts.AttemptRecord``) and the launch into the log directory it belongs
    to (0 for the first; the same command run again resumes there)."""

    launch: int
    attempt: Optional[int]
    started_at: Optional[float]
    ended_at: Optional[float]
    duration_s: Optional[float]
    outcome: str
    exit_code: Optional[int]
    cause: Optional[Cause]
    resumed_from: Optional[int]
    nodes: Optional[int]
    world_size: Optional[int]
    waited_s: Optional[float]
    left_out: tuple[str, ...] = ()

    @classmethod
    def of(cls, record: AttemptRecord, launch: int) -> "AttemptEntry":
        """The entry of an attempt of this launch."""
        return cls.from_json({**record.to_json(), "launch": launch})

    def to_json(self) -> dict[str, Any]:
        """The entry, as ``AttemptRecord.to_json`` writes it, with its ``launch``."""
        return {"attempt": self.attempt, "started_at": self.started_at, "ended_at": self.ended_at,
                "duration_s": self.duration_s, "outcome": self.outcome, "exit_code": self.exit_code,
                "cause": self.cause.to_json() if self.cause else None,
                "resumed_from": self.resumed_from, "nodes": self.nodes,
                "world_size": self.world_size, "waited_s": self.waited_s,
                "left_out": list(self.left_out), "launch": self.launch}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "AttemptEntry":
        """The entry in ``doc``, which may come from a file (an earlier launch's summary.json,
        an ``attempt`` record of metrics.jsonl): a field of another type is left out."""
        fields = JsonObject(doc)

        def seconds(key: str) -> Optional[float]:  # a number, an int kept as one
            whole = fields.whole(key)
            return fields.number(key) if whole is None else whole

        return cls(launch=fields.whole("launch") or 0, attempt=fields.whole("attempt"),
                   started_at=seconds("started_at"), ended_at=seconds("ended_at"),
                   duration_s=seconds("duration_s"), outcome=fields.text("outcome") or "?",
                   exit_code=fields.whole("exit_code"), cause=_cause(doc.get("cause")),
                   resumed_from=fields.whole("resumed_from"), nodes=fields.whole("nodes"),
                   world_size=fields.whole("world_size"), waited_s=seconds("waited_s"),
                   left_out=tuple(h for h in fields.items("left_out") or () if type(h) is str))

    @property
    def who(self) -> str:
        """Whose failure ended it: `` (rank 3 on vm2)``, `` (agent on vm2)``, or ""."""
        cause = self.cause
        if cause is None:
            return ""
        if cause.rank is not None:
            return f" (rank {cause.rank} on {cause.host})"
        return f" ({cause.process} on {cause.host})" if cause.process else ""


def _cause(value: Any) -> Optional[Cause]:
    """The cause an attempt's entry names; None when there is none, or it is not one."""
    if not isinstance(value, dict):
        return None
    try:
        return Cause.from_json(value)
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError):
        return None
