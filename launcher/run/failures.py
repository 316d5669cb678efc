"""Why a job ended, told in one short block.

The root cause is the earliest failure: a rank's own error report (written by the rank hook when
an exception escaped) is believed over the order in which the launcher noticed exits, because a
peer that lost its connection may die a moment before the rank that caused it is reaped.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import signal
import time
from typing import Any, Collection, Mapping, Optional, Sequence

from launcher.files import read_json
from launcher.hangs.stalls import Stall
from launcher.plan.launch_plan import ProcessSpec
from launcher.run.output import tail, this_attempt
from launcher.run.process import Exit

LOG_TAIL_LINES = 15


class Outcome(str, enum.Enum):
    """How a job ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STARTUP_TIMEOUT = "startup-timeout"
    STALLED = "stalled"
    INTERRUPTED = "interrupted"


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """What the rank hook wrote when an exception escaped the user's script."""

    exception: str
    message: str
    traceback: str
    timestamp: float

    @classmethod
    def read(cls, path: str) -> Optional["ErrorReport"]:
        if not path:
            return None
        data = read_json(path)
        try:
            return cls(str(data["exception"]), str(data["message"]), str(data["traceback"]),
                       float(data["timestamp"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclasses.dataclass(frozen=True)
class Failure:
    """One process that failed: it exited badly, or reported an exception on its way out.

    ``returncode`` is None when the job was stopped on the report alone, before the rank's own
    (often slow: MindSpore finalises for about a second) exit.
    """

    spec: ProcessSpec
    pid: int
    returncode: Optional[int]
    report: Optional[ErrorReport]
    time: float

    @classmethod
    def from_exit(cls, exit_: Exit) -> "Failure":
        report = ErrorReport.read(exit_.spec.error_path)
        return cls(exit_.spec, exit_.pid, exit_.returncode, report,
                   report.timestamp if report else exit_.time)

    @classmethod
    def from_report(cls, spec: ProcessSpec, pid: int, report: ErrorReport) -> "Failure":
        return cls(spec, pid, None, report, report.timestamp)

    @property
    def exit_code(self) -> int:
        """The launcher's exit code: the rank's, 128+signal, or 1 (Python's uncaught exception)."""
        return 1 if self.returncode is None else exit_code_of(self.returncode)

    def cause(self) -> "Cause":
        spec, report = self.spec, self.report
        return Cause(Outcome.FAILED, spec.role.value, spec.rank, spec.host, self.pid,
                     self.returncode, report.exception if report else None,
                     report.message if report else None, time=self.time)

    def how(self) -> str:
        if self.returncode is None:
            return f"raised {self.report.exception if self.report else 'an exception'}"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exited with code {self.returncode}"


def exit_code_of(returncode: int) -> int:
    """A shell's exit code for a process's ``returncode`` (Popen's: negative for a signal)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclasses.dataclass(frozen=True)
class Cause:
    """What ended a job, structured: summary.json keeps it as ``root_cause``.

    ``process`` is ``rank``, ``scheduler`` or ``agent`` (with ``host``, ``pid``, ``returncode``
    and, from a rank's error report, ``exception`` and ``error``); ``ranks`` the ranks stuck at
    start-up, or waiting on a stalled one; ``signal`` what stopped the launcher;
    ``consequence`` the failure a stalled rank caused (a peer's communication timeout).
    """

    outcome: Outcome
    process: Optional[str] = None
    rank: Optional[int] = None
    host: Optional[str] = None
    pid: Optional[int] = None
    returncode: Optional[int] = None
    exception: Optional[str] = None
    error: Optional[str] = None
    ranks: tuple[int, ...] = ()
    signal: Optional[str] = None
    time: Optional[float] = None
    consequence: Optional["Cause"] = None

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "outcome": self.outcome.value,
                "ranks": list(self.ranks),
                "consequence": self.consequence.to_json() if self.consequence else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Cause":
        """The inverse of ``to_json`` (a node agent's result, as node 0 reads it)."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        consequence = fields.get("consequence")
        return cls(**{**fields, "outcome": Outcome(fields["outcome"]),
                      "ranks": tuple(fields.get("ranks") or ()),
                      "consequence": cls.from_json(consequence) if consequence else None})


@dataclasses.dataclass(frozen=True)
class JobResult:
    """How a job (or one node's share of it) ended: the outcome, the launcher's exit code, the
    block it prints, and the structured cause; a node agent sends it to node 0 as JSON."""

    outcome: Outcome
    exit_code: int
    message: str
    ended_at: float
    cause: Optional[Cause] = None
    diagnosis: tuple[Mapping[str, Any], ...] = ()
    """Node 0's diagnosis of the failure (``launcher.diagnose``), for summary.json; not sent
    by agents (node 0 reads the logs itself)."""

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "exit_code": self.exit_code,
                "message": self.message, "ended_at": self.ended_at,
                "cause": self.cause.to_json() if self.cause else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "JobResult":
        cause = data.get("cause")
        return cls(Outcome(data["outcome"]), int(data["exit_code"]), str(data["message"]),
                   float(data["ended_at"]), Cause.from_json(cause) if cause else None)

    @property
    def failed(self) -> bool:
        return self.outcome in (Outcome.FAILED, Outcome.STARTUP_TIMEOUT, Outcome.STALLED)

    @property
    def cause_time(self) -> float:
        """When the cause happened, for picking the earliest of several nodes' failures."""
        return self.cause.time if self.cause and self.cause.time is not None else self.ended_at


def stall_cause(stall: Stall, consequence: Optional[Cause] = None) -> Cause:
    """The root cause of a hang: the stalled rank (None: every rank waits in MindSpore), the
    ranks waiting on it, and what its stall made fail."""
    return Cause(Outcome.STALLED, "rank" if stall.rank is not None else None, stall.rank,
                 stall.host, ranks=stall.waiting, time=time.time(), consequence=consequence)


def root_cause(failures: Sequence[Failure]) -> Optional[Failure]:
    """The earliest failure (error-report time where there is one, else the exit time)."""
    return min(failures, key=lambda f: f.time, default=None)


def describe_failure(failure: Failure, job_id: str) -> str:
    """The root-cause block printed when a rank (or the scheduler) fails."""
    spec = failure.spec
    who = f"rank {spec.rank}" if spec.rank is not None else spec.role.value
    lines = [f"npu-launch: job {job_id} failed: {who} on {spec.host} (pid {failure.pid}) "
             f"{failure.how()}"]
    if failure.report:
        lines.append(f"  {failure.report.exception}: {failure.report.message}")
        lines += [f"    {line}" for line in _last_frames(failure.report.traceback)]
    if os.path.exists(spec.log_path):
        lines += last_lines_block(spec.log_path, LOG_TAIL_LINES)
    return "\n".join(lines)


def last_lines_block(path: str, count: int) -> list[str]:
    """``  last lines of PATH:`` and the file's last ``count`` lines, for a root-cause block;
    before them, the log's own error lines (MindSpore's ``[ERROR]``) that the tail leaves out:
    a scheduler's say why it failed, while its last lines are only the traceback of the
    RuntimeError that followed."""
    last = tail(path, count)
    errors = [line for line in error_lines(path) if line not in last]
    block = [f"  errors in {path}:", *(f"    | {_cut(line)}" for line in errors)] if errors else []
    return [*block, f"  last lines of {path}:",
            *([f"    | {line}" for line in last] or ["    | (empty)"])]


ERROR_LINES = 8
"""The first error lines of a log shown in a root-cause block: the first says why, the rest
follow from it."""
_ERROR_SCAN_BYTES = 4 << 20
_ERROR_LINE_CHARS = 400
_ERROR_MARKS = (b"[ERROR]", b"[CRITICAL]")


def error_lines(path: str, limit: int = ERROR_LINES) -> list[str]:
    """The first ``limit`` lines of MindSpore's ``[ERROR]`` or ``[CRITICAL]`` level in the last
    ``_ERROR_SCAN_BYTES`` of a log (a rank's log can be large: this reads a bounded piece), of
    the current attempt only (an earlier attempt's errors are not this failure's)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _ERROR_SCAN_BYTES))
            data = f.read(_ERROR_SCAN_BYTES)
    except OSError:
        return []
    found = []
    for raw in this_attempt(data).split(b"\n"):
        if raw.lstrip().startswith(_ERROR_MARKS):
            found.append(raw.rstrip(b"\r").decode(errors="replace"))
            if len(found) == limit:
                break
    return found


def _cut(line: str) -> str:
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
    return text if len(text) <= _ERROR_LINE_CHARS else f"{text[:_ERROR_LINE_CHARS]}..."


def describe_stuck(specs: Sequence[ProcessSpec], in_init: Collection[int], job_id: str,
                   waited: float, stacks: Mapping[int, Sequence[str]] = {}) -> str:
    """The block for ranks that had not initialised communication when the time was up: where
    each is (its stack, read before it was stopped) and its last lines."""
    never = [s for s in specs if s.rank not in in_init]
    waiting = [s for s in specs if s.rank in in_init]
    parts = []
    if never:
        parts.append(f"{_names(never)} never reached init()")
    if waiting:
        parts.append(f"{_names(waiting)} waiting in init()")
    lines = [f"npu-launch: job {job_id} stopped after {waited:g} s (--startup-timeout): "
             + "; ".join(parts)]
    for spec in (never or waiting)[:4]:
        frames = stacks.get(spec.rank) if spec.rank is not None else None
        if frames:
            lines.append(f"  rank {spec.rank} is at (most recent call first):")
            lines += [f"    {frame}" for frame in frames[:6]]
        lines += last_lines_block(spec.log_path, 5)
    return "\n".join(lines)


def _names(specs: Sequence[ProcessSpec]) -> str:
    return ", ".join(f"rank {s.rank} on {s.host}" for s in specs)


def _last_frames(traceback_text: str, count: int = 6) -> list[str]:
    frames = [line for line in traceback_text.rstrip().splitlines()[1:-1] if line.strip()]
    return frames[-count:]
