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

import statistics
from typing import Any, Iterable, Mapping, Optional

from launcher.ranks.record import PHASES

_SHOWN = {"process": "process", "imports": "imports", "init": "init()",
          "first_step": "first step", "training": "training", "exit": "exit"}


"""A rank's phase boundaries are its record's marks (``launcher.ranks.record``: one fold for
the phases, the hang check, the monitor and the attempt); ``RankRecord.phases`` measures them."""


def job_phases(ranks: Mapping[int, Mapping[str, Optional[float]]]) -> dict[str, Any]:
    """Per phase over the ranks that report it: the slowest rank, its seconds, the median."""
    result: dict[str, Any] = {}
    for name in PHASES:
        known = {rank: seconds for rank, p in ranks.items()
                 if (seconds := p.get(name)) is not None}
        if not known:
            result[name] = None
            continue
        slowest = max(known, key=lambda rank: (known[rank], -rank))
        result[name] = {"slowest_rank": slowest, "seconds": known[slowest],
                        "median": round(statistics.median(known.values()), 3)}
    return result


def describe(phases: Mapping[str, Any]) -> Optional[str]:
    """``start-up (slowest rank): process 0.1 s (rank 1), imports 2.0 s (rank 0), ...``; None
    when no phase is known."""
    parts = [f"{_SHOWN[name]} {p['seconds']:.1f} s (rank {p['slowest_rank']})"
             for name in PHASES if isinstance(p := phases.get(name), Mapping)]
    return f"npu-launch: where the time went (slowest rank): {', '.join(parts)}" if parts else None


def rows(phases: Mapping[str, Any]) -> Iterable[tuple[str, Any, Any, Any]]:
    """(phase, slowest seconds, slowest rank, median) of each phase given, as given (the report
    checks the types: summary.json may have been edited)."""
    for name in PHASES:
        p = phases.get(name)
        if isinstance(p, Mapping):
            yield _SHOWN[name], p.get("seconds"), p.get("slowest_rank"), p.get("median")
