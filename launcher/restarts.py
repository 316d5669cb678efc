"""When a job starts again, after how long, and on which hosts: the restart policy, pure logic.

One budget for the whole job (``--max-restarts``): node 0 decides every restart, whichever host
failed, so two failures on two hosts use two restarts of it. Before restart k the launcher waits
``--restart-backoff`` x 2^(k-1) seconds, at most ``--restart-backoff-max``. With ``--min-nodes``
a host whose ranks were the root cause of the last two failures in a row is left out of the next
attempt, if at least that many hosts remain and the data still splits over the ranks left
(``Shrink``); ``launch.run_with_restarts`` acts on what this module decides, and every attempt
becomes one entry of summary.json's ``attempts`` (``AttemptRecord``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from launcher.failures import JobResult

BLAMED_IN_A_ROW = 2
"""Failures in a row a host's ranks must have caused before it is left out."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """``--max-restarts``, the backoff and ``--min-nodes``, as the config gave them."""

    max_restarts: int = 0
    backoff: float = 1.0
    backoff_max: float = 60.0
    min_nodes: Optional[int] = None

    def wait_before(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1 for the first)."""
        if restart < 1 or self.backoff <= 0:
            return 0.0
        return min(self.backoff * 2.0 ** min(restart - 1, 60), self.backoff_max)


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """One attempt of the job, as summary.json's ``attempts`` lists it."""

    attempt: int
    started_at: float
    ended_at: float
    outcome: str
    exit_code: int
    cause: Optional[dict[str, Any]]
    resumed_from: Optional[int]
    """The complete step this attempt resumed from (None: from the start)."""
    nodes: int
    world_size: int
    waited_s: float = 0.0
    """The backoff before this attempt started."""
    left_out: tuple[str, ...] = ()
    """Hosts of the job's hostfile this attempt ran without (``--min-nodes``)."""

    @classmethod
    def of(cls, attempt: int, started_at: float, result: JobResult, resumed_from: Optional[int],
           hosts: Sequence[str], world_size: int, waited_s: float,
           left_out: Sequence[str]) -> "AttemptRecord":
        return cls(attempt, started_at, result.ended_at, result.outcome.value, result.exit_code,
                   result.cause.to_json() if result.cause else None, resumed_from, len(hosts),
                   world_size, waited_s, tuple(left_out))

    @property
    def duration_s(self) -> float:
        return max(0.0, self.ended_at - self.started_at)

    def to_json(self) -> dict[str, Any]:
        """The ``attempt`` record of metrics.jsonl and summary.json's entry (hosts counted,
        not listed: a job may have a thousand)."""
        return {"attempt": self.attempt, "started_at": self.started_at,
                "ended_at": self.ended_at, "duration_s": round(self.duration_s, 3),
                "outcome": self.outcome, "exit_code": self.exit_code, "cause": self.cause,
                "resumed_from": self.resumed_from, "nodes": self.nodes,
                "world_size": self.world_size, "waited_s": round(self.waited_s, 3),
                "left_out": list(self.left_out)}


def blamed_host(result: JobResult) -> Optional[str]:
    """The host whose process was the root cause of a failed attempt, if one was."""
    cause = result.cause
    if cause is None or not result.failed:
        return None
    return cause.host


def host_to_leave_out(blamed: Sequence[Optional[str]], hosts: Sequence[str],
                      min_nodes: Optional[int]) -> Optional[str]:
    """The host to run the next attempt without: the one blamed for the last
    ``BLAMED_IN_A_ROW`` failures, when it is still a host of the job and at least ``min_nodes``
    would remain."""
    if min_nodes is None or len(blamed) < BLAMED_IN_A_ROW:
        return None
    last = blamed[-BLAMED_IN_A_ROW:]
    host = last[0]
    if host is None or any(h != host for h in last) or host not in hosts:
        return None
    return host if len(hosts) - 1 >= min_nodes else None


def shrink_problem(world_before: int, world_after: int, global_batch: Optional[int]) -> Optional[str]:
    """Why the data cannot go on over ``world_after`` ranks, or None. The global batch is kept
    (README, "Leaving a failing host out"): each rank's batch becomes the global batch over the
    ranks left, which must divide it."""
    if world_after < 1:
        return "no rank would remain"
    if global_batch is not None and global_batch % world_after:
        return (f"the global batch of {global_batch} (over {world_before} ranks) does not split "
                f"over {world_after} ranks")
    return None
