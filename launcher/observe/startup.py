"""Where a rank's time goes, from its process's start to its exit, in six phases.

Each phase runs from one mark to the next, all but the last taken by the rank (its own clock;
a rank and its supervisor share a host, so a clock):

    process     the kernel started the process  -> the rank hook runs (``started``: the
                interpreter is up; its ``process_start`` is the kernel's start time)
    imports     ``started``                     -> ``init()`` is called (``init-started``:
                MindSpore's and the script's imports, its set-up)
    init        ``init-started``                -> ``initialised`` (registration with the
                scheduler, the collective's set-up)
    first step  ``initialised``                 -> the first step ended (``first-step``, from
                the rank hook's progress count, else the trainer's first ``step``: graph
                compilation)
    training    the first step                  -> the last progress seen (the one rule in
                ``launcher.ranks.record``: a step, a higher count, ``finished``...; progress
                events come at most every half second, so this end is known to half a second)
    exit        the last progress               -> the process ended (``exited``, its
                supervisor's record)

A phase whose marks are not both known (a script that never calls ``init()``, a job stopped in
the middle) is None; the known ones still add up to the span of their marks. The rank's record
(``launcher.ranks.RankRecord``) folds its events and keeps the marks; ``job_phases`` names the
slowest rank of each phase.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Mapping, Optional, Sequence

from launcher.ranks.record import PHASES
from parallel.record_fields import JsonObject

_SHOWN = {"process": "process", "imports": "imports", "init": "init()",
          "first_step": "first step", "training": "training", "exit": "exit"}


"""A rank's phase boundaries are its record's marks (``launcher.ranks.record``: one fold for
the phases, the hang check, the monitor and the attempt); ``RankRecord.phases`` measures them."""


@dataclasses.dataclass(frozen=True)
class SlowestRank:
    """One phase over the ranks that report it: the slowest rank, its seconds, the median."""

    phase: str
    rank: int
    seconds: float
    median: float

    @property
    def shown(self) -> str:
        """The phase as a person reads it (``init()``, ``first step``)."""
        return _SHOWN[self.phase]

    def to_json(self) -> dict[str, Any]:
        """The phase's entry in summary.json's ``phases``."""
        return {"slowest_rank": self.rank, "seconds": self.seconds, "median": self.median}

    @classmethod
    def parse(cls, phase: str, entry: Optional[JsonObject]) -> Optional["SlowestRank"]:
        """The entry of ``phase`` as ``to_json`` wrote it (summary.json read back, which may have
        been edited); None for one that is not (a rank that is no whole number, NaN seconds)."""
        if entry is None:
            return None
        rank, seconds, median = entry.whole("slowest_rank"), entry.number("seconds"), entry.number("median")
        if rank is None or seconds is None or median is None \
                or not (math.isfinite(seconds) and math.isfinite(median)):
            return None
        return cls(phase, rank, seconds, median)


def slowest_ranks(ranks: Mapping[int, Mapping[str, Optional[float]]]) -> tuple[SlowestRank, ...]:
    """Per phase (in ``PHASES`` order) that some rank reports: its slowest rank and the median."""
    found = []
    for name in PHASES:
        known = {rank: seconds for rank, p in ranks.items()
                 if (seconds := p.get(name)) is not None}
        if known:
            slowest = max(known, key=lambda rank: (known[rank], -rank))
            found.append(SlowestRank(name, slowest, known[slowest],
                                     round(statistics.median(known.values()), 3)))
    return tuple(found)


def job_phases(ranks: Mapping[int, Mapping[str, Optional[float]]]) -> dict[str, Any]:
    """summary.json's ``phases``: each phase's ``SlowestRank``, null for one no rank reports."""
    return {name: None for name in PHASES} | {s.phase: s.to_json() for s in slowest_ranks(ranks)}


def read_phases(phases: Optional[JsonObject]) -> tuple[SlowestRank, ...]:
    """summary.json's ``phases`` read back: the entries that are as ``job_phases`` writes them."""
    if phases is None:
        return ()
    return tuple(filter(None, (SlowestRank.parse(name, phases.object(name)) for name in PHASES)))


def describe(phases: Sequence[SlowestRank]) -> Optional[str]:
    """``start-up (slowest rank): process 0.1 s (rank 1), imports 2.0 s (rank 0), ...``; None
    when no phase is known."""
    parts = [f"{p.shown} {p.seconds:.1f} s (rank {p.rank})" for p in phases]
    return f"npu-launch: where the time went (slowest rank): {', '.join(parts)}" if parts else None
