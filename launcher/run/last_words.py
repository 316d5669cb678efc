"""Node 0's half of last words (``parallel.checkpoints.last_words`` is the rank's): when a rank of a
data-parallel job failed or hung, before the watch loop stops anything, the lowest healthy rank
is asked to save the last step it completed; its file stands for every rank (the ledger,
``launcher.checkpoints``, takes it as a complete step), and the restart resumes from it.

The request and the answer are files in the rank's log directory. When the ranks run here node 0
writes and reads them itself; in a job of node agents it sends the request down the agents'
stdin and the rank's agent relays the answer back as a control line (``launcher.cluster``), so
the replica asked may be on any host that still runs (not on one whose agent reported the
failure: it stopped its ranks). The wait is bounded by ``WAIT`` seconds, and ends as soon as the
rank answers or its process is gone. Whatever happens, one line says it: the step saved, or why
none was and where a restart resumes from instead (the last periodic checkpoint). Jobs whose
ranks do not save on request (``saves_on_stop``: the shared trainer with a ``ckpt_dir``) are not
asked anything.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Mapping, Optional, Protocol, TextIO

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.hangs.stalls import Stall
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec
from launcher.run.process import ProcessGroup
from parallel import contract
from parallel.checkpoints.manifest import atomic_write_bytes

WAIT = 3.0
"""Seconds the job's teardown waits for the answer at most (the rank itself gives up after
``parallel.checkpoints.last_words.WAIT``, 2 s)."""
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
        """Ranks that save last words on request (the trainer's, ``saves_on_stop``)."""

    @property
    def exited(self) -> set[int]:
        """Ranks whose process ended."""

    ledger: Optional[CheckpointLedger]


class Asker(Protocol):
    """How node 0 reaches the rank it asks: through files in the log directory when the ranks
    run here (:class:`AskHere`), through the rank's node agent otherwise
    (``launcher.cluster.node_agents.AskThroughAgents``)."""

    def lost(self, ranks: Mapping[int, ProcessSpec]) -> set[int]:
        """Ranks known lost that the ranks' records may not show yet."""

    def unreachable(self, ranks: Mapping[int, ProcessSpec]) -> tuple[set[int], str]:
        """Ranks that cannot be asked, and why."""

    def ask(self, group: ProcessGroup, rank: int, spec: ProcessSpec, since: float,
            wait: float) -> str:
        """The answer of ``rank`` (run by ``spec``; :func:`ask_here`), ``""`` when none came
        within ``wait``."""


@dataclasses.dataclass(frozen=True)
class AskHere:
    """The ranks run on this host and see its log directory."""

    log_dir: str
    attempt: int

    def lost(self, ranks: Mapping[int, ProcessSpec]) -> set[int]:
        """Ranks that reported an uncaught exception."""
        return {r for r, spec in ranks.items() if spec.error_path and os.path.exists(spec.error_path)}

    def unreachable(self, ranks: Mapping[int, ProcessSpec]) -> tuple[set[int], str]:
        return set(), ""

    def ask(self, group: ProcessGroup, rank: int, spec: ProcessSpec, since: float,
            wait: float) -> str:
        pid = group.pids.get(spec.label)
        return ask_here(self.log_dir, rank, self.attempt, since,
                        lambda: pid is not None and child_alive(pid), wait)


def ask_here(log_dir: str, rank: int, attempt: int, since: float, alive: Callable[[], bool],
             wait: float) -> str:
    """Ask ``rank``, whose process runs on this host, through the request and reply files in
    ``log_dir``; ``since`` on this host's wall clock. The answer: the reply's words (``saved
    <step>`` or ``none <why>``), ``ended`` when the process ended first, ``""`` when no answer
    came within ``wait`` seconds. Node 0 asks so for a job run here; a node agent for node 0."""
    started = time.monotonic()
    try:
        atomic_write_bytes(os.path.join(log_dir, contract.LAST_WORDS_REQUEST_FILE),
                           f"{rank} {attempt} {since:.3f}\n".encode())
    except OSError as error:
        return f"none the request could not be written: {error}"
    reply = os.path.join(log_dir, contract.LAST_WORDS_REPLY_FILE)
    while time.monotonic() - started < wait:
        words = _words(reply)
        if words and (words[0] == "none" or _saved(words) is not None):
            return " ".join(words)
        if not alive():
            return "ended"
        time.sleep(_POLL)
    return ""


@dataclasses.dataclass(frozen=True)
class LastWordsRequest:
    """The watch loop's hook for a job that failed or hangs (``watch.FaultHook``)."""

    plan: LaunchPlan
    attempt: Ranks
    err: Optional[TextIO] = None
    asker: Optional[Asker] = None
    """None: the ranks run here (:class:`AskHere`)."""
    wait: float = WAIT

    def __call__(self, group: ProcessGroup, stall: Optional[Stall]) -> None:
        ranks = {s.rank: s for s in self.plan.ranks if s.rank is not None}
        savers = self.attempt.savers & set(ranks)
        if not savers:
            return
        asker = self.asker or AskHere(self.plan.log_dir, self.plan.restart)
        lost = self._lost(ranks, stall) | asker.lost(ranks)
        deaf, why_deaf = asker.unreachable(ranks)
        healthy = sorted(savers - lost - deaf)
        if not self.plan.replicated:
            self._say_none("the layout is sliced (model or pipeline parallel), no rank holds "
                           "another's state")
        elif stall is not None and stall.rank is None:
            self._say_none("every rank went silent: none is known to be healthy")
        elif not healthy and savers - lost:
            self._say_none(f"no healthy rank can be asked: {why_deaf}")
        elif not healthy:
            self._say_none("no healthy rank is left to save")
        else:
            # Since when the lost rank cannot have completed a step with the others: a hung
            # rank since it went silent, a failed one from now (it may have sent its share of
            # an all-reduce just before it died).
            since = time.time() - (stall.silent_for if stall is not None else 0.0)
            rank, started = healthy[0], time.monotonic()
            said = asker.ask(group, rank, ranks[rank], since, self.wait)
            step = _saved(said.split())
            if step is not None:
                self._say(f"npu-launch: last words: rank {rank} saved step {step} for every "
                          f"rank before the job was stopped ({time.monotonic() - started:.2f} s)")
            elif said.split()[:1] == ["none"]:
                self._say_none(f"rank {rank}: {said[len('none '):] or 'no reason given'}")
            elif said == "ended":
                self._say_none(f"rank {rank} ended before it answered")
            else:
                self._say_none(f"rank {rank} did not answer within {self.wait:g} s")

    def _lost(self, ranks: Mapping[int, ProcessSpec], stall: Optional[Stall]) -> set[int]:
        """Ranks that exited or hang."""
        lost = set(self.attempt.exited)
        if stall is not None and stall.rank is not None:
            lost.add(stall.rank)
        return lost

    def _say_none(self, why: str) -> None:
        point = self.attempt.ledger.resume_point() if self.attempt.ledger is not None else None
        where = f"step {point.step}, the last complete checkpoint" if point else \
            "the start (no complete checkpoint)"
        self._say(f"npu-launch: no last words: {why}; a restart resumes from {where}")

    def _say(self, line: str) -> None:
        if self.err is not None:
            self.err.write(line + "\n")
            self.err.flush()


def _saved(words: list[str]) -> Optional[int]:
    """The step of a ``saved <step>`` answer; None for any other."""
    if len(words) == 2 and words[0] == "saved" and words[1].isdigit() and len(words[1]) <= 18:
        return int(words[1])
    return None


def _words(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def child_alive(pid: int) -> bool:
    """Whether the child ``pid`` still runs; it is not reaped (the process group's poll does)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False
