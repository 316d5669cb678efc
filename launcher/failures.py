"""Why a job ended, told in one short block.

The root cause is the earliest failure: a rank's own error report (written by the rank hook when
an exception escaped) is believed over the order in which the launcher noticed exits, because a
peer that lost its connection may die a moment before the rank that caused it is reaped.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
from typing import Collection, Optional, Sequence

from launcher.output import tail
from launcher.plan import ProcessSpec
from launcher.process import Exit

LOG_TAIL_LINES = 15


class Outcome(str, enum.Enum):
    """How a job ended. ``running`` -> one of the others, never back."""

    RUNNING = "running"
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
        try:
            with open(path) as f:
                data = json.load(f)
            return cls(str(data["exception"]), str(data["message"]), str(data["traceback"]),
                       float(data["timestamp"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


@dataclasses.dataclass(frozen=True)
class Failure:
    """One process that ended badly, with what we know about why."""

    exit: Exit
    report: Optional[ErrorReport]

    @property
    def time(self) -> float:
        return self.report.timestamp if self.report else self.exit.time

    @property
    def spec(self) -> ProcessSpec:
        return self.exit.spec


def root_cause(exits: Sequence[Exit]) -> Optional[Failure]:
    """The earliest failure among ``exits`` (error-report time first, else the exit time)."""
    failures = [Failure(e, ErrorReport.read(e.spec.error_path)) for e in exits if not e.ok]
    if not failures:
        return None
    return min(failures, key=lambda f: (f.report is None, f.time))


def describe_failure(failure: Failure, job_id: str) -> str:
    """The root-cause block printed when a rank (or the scheduler) fails."""
    spec, exit_ = failure.spec, failure.exit
    who = "scheduler" if spec.rank is None else f"rank {spec.rank}"
    how = (f"killed by {exit_.signal_name}" if exit_.signal_name
           else f"exited with code {exit_.returncode}")
    lines = [f"npu-launch: job {job_id} failed: {who} on {spec.host} (pid {exit_.pid}) {how}"]
    if failure.report:
        lines.append(f"  {failure.report.exception}: {failure.report.message}")
        lines += [f"    {l}" for l in _last_frames(failure.report.traceback)]
    if os.path.exists(spec.log_path):
        lines.append(f"  last lines of {spec.log_path}:")
        lines += [f"    | {l}" for l in tail(spec.log_path, LOG_TAIL_LINES)] or ["    | (empty)"]
    return "\n".join(lines)


def describe_stuck(specs: Sequence[ProcessSpec], in_init: Collection[int], job_id: str,
                   waited: float) -> str:
    """The block for ranks that had not initialised communication when the time was up."""
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
        lines.append(f"  last lines of {spec.log_path}:")
        lines += [f"    | {l}" for l in tail(spec.log_path, 5)] or ["    | (empty)"]
    return "\n".join(lines)


def _names(specs: Sequence[ProcessSpec]) -> str:
    return ", ".join(f"rank {s.rank} on {s.host}" for s in specs)


def _last_frames(traceback_text: str, count: int = 6) -> list[str]:
    frames = [l for l in traceback_text.rstrip().splitlines()[1:-1] if l.strip()]
    return frames[-count:]
