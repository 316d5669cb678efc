"""When a job starts again, after how long, and on which hosts: the restart policy, pure logic.

One budget for the whole job (``--max-restarts``): node 0 decides every restart, whichever host
failed, so two failures on two hosts use two restarts of it. Before restart k the launcher waits
``--restart-backoff`` x 2^(k-1) seconds, at most ``--restart-backoff-max``; without the option
the first restart comes at once (as torchrun's do) and restart k waits 2^(k-2) seconds: a failure
that repeats is met by the backoff from then on, and one that repeats at the same step by
``cannot_help``. With ``--min-nodes``
a host whose ranks were the root cause of the last two failures in a row is left out of the next
attempt, if at least that many hosts remain and the data still splits over the ranks left
(``Shrink``). Two attempts in a row that failed at the same step (or both before any step or
progress) with the same root cause and no newer complete checkpoint stop the job
(``cannot_help``) with ``NO_PROGRESS_EXIT_CODE``.
``launcher.run.restart_decision`` puts these rules together into one decision, which
``launch.run_with_restarts`` carries out; every attempt becomes one entry of summary.json's
``attempts`` (``AttemptRecord``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from launcher.run.failures import JobResult, Outcome

BLAMED_IN_A_ROW = 2
"""Failures in a row a host's ranks must have caused before it is left out."""
NO_PROGRESS_EXIT_CODE = 93
"""The job's exit code when it stopped restarting because a restart cannot help: two attempts
in a row failed at the same step (or both before any) with the same root cause and no newer
complete checkpoint.
A scheduler's requeue hook can test it and not requeue (NVIDIA's resiliency extension uses 93
for the same "do not requeue"; npu-launch's own codes are 1 a failure, 2 bad input, 124 a hang,
128+N a signal, though a failed rank's own exit status becomes the job's)."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """``--max-restarts``, the backoff and ``--min-nodes``, as the config gave them."""

    max_restarts: int = 0
    backoff: float = 1.0
    backoff_max: float = 60.0
    min_nodes: Optional[int] = None
    first_at_once: bool = False
    """The default (no ``--restart-backoff``): the first restart does not wait, and the backoff
    begins with the second."""

    def wait_before(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1 for the first)."""
        if self.first_at_once:
            restart -= 1
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
    """The complete step this attempt resumed from (``Attempt.resumed_from``; None: from the
    start, or not known)."""
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


BEFORE_ANY_PROGRESS = ("start", 0)
"""``FailurePoint.where`` of a rank that failed with no step and no progress count (after
``init()``, before its first step: a bad model, a missing file): twice in a row with the same
cause, it would fail there again."""


@dataclasses.dataclass(frozen=True)
class FailurePoint:
    """Where and why an attempt failed, to tell a failure that will happen again: the step
    (``("step", N)``: the failed rank's last trainer step; ``("count", N)``: without trainer
    steps, its progress count, reported every 0.5 s at most, so it may differ between two
    failures at the same place: then the job restarts, the safe side; ``BEFORE_ANY_PROGRESS``:
    neither yet; None: no rank's record to tell), the root cause (outcome, process, rank,
    exception, error, return code) and the newest complete checkpoint step."""

    where: Optional[tuple[str, int]]
    cause: tuple[Any, ...]
    complete: Optional[int]

    @classmethod
    def of(cls, result: JobResult, where: Optional[tuple[str, int]],
           complete: Optional[int]) -> "FailurePoint":
        c = result.cause
        cause = (result.outcome.value,) if c is None else (
            c.outcome.value, c.process, c.rank, c.exception, c.error, c.returncode)
        return cls(where, cause, complete)

    def told(self, other: "FailurePoint") -> "FailurePoint":
        """This point, or ``other`` (the same failure) when only it has the error report's
        exception."""
        return other if self.cause[3:4] == (None,) and other.cause[3:4] != (None,) else self

    def describe(self) -> str:
        kind, n = self.where or ("step", -1)
        at = ("before any step or progress" if self.where == BEFORE_ANY_PROGRESS else
              f"at step {n}" if kind == "step" else f"at progress count {n}")
        rank = self.cause[2] if len(self.cause) > 2 else None
        exception = self.cause[3] if len(self.cause) > 3 else None
        who = f"rank {rank}" if rank is not None else "the job"
        checkpoint = ("no complete checkpoint" if self.complete is None
                      else f"no complete checkpoint newer than step {self.complete}")
        return (f"{at} with the same root cause ({who}, "
                f"{exception or self.cause[0]}) and {checkpoint}")


def cannot_help(before: Optional[FailurePoint], now: FailurePoint) -> bool:
    """Whether another restart would fail the same way: the last two attempts failed at the
    same known step (or both before any step or progress) with the same root cause, and no
    newer complete checkpoint came between.
    The exception and error text count only when both failures have them (a rank's exit may
    be seen before its error report is read), and so does the return code (the job may be
    stopped on the report before the rank has exited)."""
    if before is None or now.where is None or (before.where, before.complete) != (
            now.where, now.complete) or len(before.cause) != len(now.cause):
        return False
    return all(a == b or (i in _MAY_BE_UNKNOWN and (a is None or b is None))
               for i, (a, b) in enumerate(zip(before.cause, now.cause)))


_MAY_BE_UNKNOWN = (3, 4, 5)
"""Positions of ``FailurePoint.cause`` that one sighting of a failure may lack: the exception
and error read from the rank's error report, and the return code of its exit."""


def stop_restarting(result: JobResult, point: FailurePoint) -> JobResult:
    """``result`` with ``NO_PROGRESS_EXIT_CODE`` and the one line that says why."""
    line = (f"npu-launch: not restarting: the last two attempts failed {point.describe()}: "
            f"a restart cannot help (exit {NO_PROGRESS_EXIT_CODE})")
    return dataclasses.replace(result, exit_code=NO_PROGRESS_EXIT_CODE,
                               message=f"{result.message}\n{line}".lstrip())


def not_restarted(result: JobResult, min_nodes: Optional[int]) -> str:
    """The line that says why a failure is not restarted though restarts are left: it came
    before start-up (``launch._started_up``), where it would only happen again; a script that
    initialises no communication never gets there."""
    cause = result.cause
    rank = cause.rank if cause is not None else None
    who = f"rank {rank}" if rank is not None else "the job"
    did = "hung" if result.outcome is Outcome.STALLED else "failed"
    if min_nodes is None:
        return (f"npu-launch: not restarted: {who} {did} before every rank had initialised "
                "communication (MindSpore's init() or torch's init_process_group; a failure "
                "there repeats, and a script that calls neither is never restarted)")
    before = "it called init()" if rank is not None else "every rank had called init()"
    return (f"npu-launch: not restarted: {who} {did} before {before} (MindSpore's, or torch's "
            "init_process_group; a failure there repeats on any host)")


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
    if len(blamed) < BLAMED_IN_A_ROW:
        return None
    last = blamed[-BLAMED_IN_A_ROW:]
    host = last[0]
    if host is None or any(h != host for h in last):
        return None
    return host if may_leave(host, hosts, min_nodes) else None


def may_leave(host: str, hosts: Sequence[str], min_nodes: Optional[int]) -> bool:
    """Whether ``host`` may be left out of a job on ``hosts``: ``--min-nodes`` was given, it is
    one of them, and at least that many would remain."""
    return min_nodes is not None and host in hosts and len(hosts) - 1 >= min_nodes


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
