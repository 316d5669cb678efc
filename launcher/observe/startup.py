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
    training    the first step                  -> the last progress seen (``progress``,
                ``step`` or ``finished``; progress events come at most every half second,
                so this end is known to half a second)
    exit        the last progress               -> the process ended (``exited``, its
                supervisor's record)

A phase whose marks are not both known (a script that never calls ``init()``, a job stopped in
the middle) is None; the known ones still add up to the span of their marks. ``Marks`` folds a
rank's events; ``job_phases`` names the slowest rank of each phase.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, Mapping, Optional

from parallel import contract
from parallel.contract import Event

PHASES = ("process", "imports", "init", "first_step", "training", "exit")
_SHOWN = {"process": "process", "imports": "imports", "init": "init()",
          "first_step": "first step", "training": "training", "exit": "exit"}


@dataclasses.dataclass
class Marks:
    """One rank's phase boundaries (seconds since the epoch), as its events arrive."""

    spawned: Optional[float] = None
    started: Optional[float] = None
    init_started: Optional[float] = None
    initialised: Optional[float] = None
    first_step: Optional[float] = None
    last_progress: Optional[float] = None
    exited: Optional[float] = None

    def observe(self, event: Event) -> None:
        kind, at = event.kind, event.time
        if at is None:
            return
        if kind == contract.EVENT_STARTED:
            self.started = at
            spawned = event.record.get("process_start")
            if isinstance(spawned, (int, float)) and not isinstance(spawned, bool) \
                    and 0 < at - spawned < 86400:
                self.spawned = float(spawned)
        elif kind == contract.EVENT_INIT_STARTED:
            self.init_started = self.init_started or at
        elif kind == contract.EVENT_INITIALISED:
            self.initialised = self.initialised or at
        elif kind in (contract.EVENT_FIRST_STEP, contract.EVENT_STEP):
            self.first_step = self.first_step or at
            self.last_progress = at
        elif kind in (contract.EVENT_PROGRESS, contract.EVENT_FINISHED):
            if self.first_step is not None:
                self.last_progress = at
        elif kind == contract.EVENT_EXITED:
            self.exited = at
            last = event.record.get("last_progress")  # metrics.jsonl keeps no progress events
            if isinstance(last, float) and self.first_step is not None \
                    and last > (self.last_progress or 0.0):
                self.last_progress = last

    def phases(self) -> dict[str, Optional[float]]:
        """Seconds per phase; None where a mark is missing."""
        bounds = (self.spawned, self.started, self.init_started, self.initialised,
                  self.first_step, self.last_progress, self.exited)
        return {name: (round(max(end - start, 0.0), 3)
                       if start is not None and end is not None else None)
                for name, start, end in zip(PHASES, bounds, bounds[1:])}


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
