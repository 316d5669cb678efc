"""Node 0's half of last words (``parallel.last_words`` is the rank's): when a rank of a
data-parallel job failed or hung, before the watch loop stops anything, the lowest healthy rank
is asked to save the last step it completed; its file stands for every rank (the ledger,
``launcher.checkpoints``, takes it as a complete step), and the restart resumes from it.

The wait is bounded by ``WAIT`` seconds, and ends as soon as the rank answers or its process is
gone. Whatever happens, one line says it: the step saved, or why none was and where a restart
resumes from instead (the last periodic checkpoint). Jobs whose ranks do not save on request
(``saves_on_stop``: the shared trainer with a ``ckpt_dir``) are not asked anything.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Mapping, Optional, Protocol, TextIO

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.hangs.stalls import Stall
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec
from launcher.run.process import ProcessGroup
from parallel import contract
from parallel.manifest import atomic_write_bytes

WAIT = 3.0
"""Seconds the job's teardown waits for the answer at most (the rank itself gives up after
``parallel.last_words.WAIT``, 2 s)."""
_POLL = 0.01


def clear(log_dir: str) -> None:
    """An earlier attempt's request and answer must not be taken for this one's."""
    for name in (contract.LAST_WORDS_REQUEST_FILE, contract.LAST_WORDS_REPLY_FILE):
        try:
            os.remove(os.path.join(log_dir, name))
        except OSError:
            pass


class Ranks(Protocol):
    """What node 0 knows of the attempt's ranks (``launcher.attempt.Attempt``)."""

    @property
    def savers(self) -> set[int]:
        """Ranks whose trainer saves on request (``saves_on_stop``)."""

    @property
    def exited(self) -> set[int]:
        """Ranks whose process ended."""

    ledger: Optional[CheckpointLedger]


@dataclasses.dataclass(frozen=True)
class LastWordsRequest:
    """The watch loop's hook for a job that failed or hangs (``watch.FaultHook``)."""

    plan: LaunchPlan
    attempt: Ranks
    err: Optional[TextIO] = None
    wait: float = WAIT

    def __call__(self, group: ProcessGroup, stall: Optional[Stall]) -> None:
        ranks = {s.rank: s for s in self.plan.ranks if s.rank is not None}
        savers = self.attempt.savers & set(ranks)
        if not savers:
            return
        lost = self._lost(ranks, stall)
        healthy = sorted(savers - lost)
        if not self.plan.replicated:
            self._say_none("the layout is sliced (model or pipeline parallel), no rank holds "
                           "another's state")
        elif stall is not None and stall.rank is None:
            self._say_none("every rank went silent: none is known to be healthy")
        elif not healthy:
            self._say_none("no healthy rank is left to save")
        else:
            # Since when the lost rank cannot have completed a step with the others: a hung
            # rank since it went silent, a failed one from now (it may have sent its share of
            # an all-reduce just before it died).
            since = time.time() - (stall.silent_for if stall is not None else 0.0)
            self._ask(group, ranks[healthy[0]], since)

    def _lost(self, ranks: Mapping[int, ProcessSpec], stall: Optional[Stall]) -> set[int]:
        """Ranks that exited, reported an uncaught exception or hang."""
        lost = set(self.attempt.exited)
        lost |= {r for r, spec in ranks.items() if spec.error_path and os.path.exists(spec.error_path)}
        if stall is not None and stall.rank is not None:
            lost.add(stall.rank)
        return lost

    def _ask(self, group: ProcessGroup, spec: ProcessSpec, since: float) -> None:
        rank, started = spec.rank, time.monotonic()
        reply = os.path.join(self.plan.log_dir, contract.LAST_WORDS_REPLY_FILE)
        request = os.path.join(self.plan.log_dir, contract.LAST_WORDS_REQUEST_FILE)
        try:
            atomic_write_bytes(request, f"{rank} {self.plan.restart} {since:.3f}\n".encode())
        except OSError as error:
            self._say_none(f"the request could not be written: {error}")
            return
        pid = group.pids.get(spec.label)
        while time.monotonic() - started < self.wait:
            words = _words(reply)
            if words and words[0] == "saved" and len(words) == 2 and words[1].isdigit():
                self._say(f"npu-launch: last words: rank {rank} saved step {words[1]} for every "
                          f"rank before the job was stopped ({time.monotonic() - started:.2f} s)")
                return
            if words and words[0] == "none":
                self._say_none(f"rank {rank}: {' '.join(words[1:])}")
                return
            if pid is None or not _alive(pid):
                self._say_none(f"rank {rank} ended before it answered")
                return
            time.sleep(_POLL)
        self._say_none(f"rank {rank} did not answer within {self.wait:g} s")

    def _say_none(self, why: str) -> None:
        point = self.attempt.ledger.resume_point() if self.attempt.ledger is not None else None
        where = f"step {point.step}, the last complete checkpoint" if point else \
            "the start (no complete checkpoint)"
        self._say(f"npu-launch: no last words: {why}; a restart resumes from {where}")

    def _say(self, line: str) -> None:
        if self.err is not None:
            self.err.write(line + "\n")
            self.err.flush()


def _words(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """Whether the child ``pid`` still runs; it is not reaped (the process group's poll does)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False
