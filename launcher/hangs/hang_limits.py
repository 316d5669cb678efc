"""The hang limit: ``--hang-timeout`` when given, else learnt from the job (``Limits``,
``Learnt``): a multiple of the longest quiet interval seen between progress events, with a
floor, kept across restarts and, for the same command run again, in ``hang_limits.json``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Iterable, Mapping, Optional, Sequence

from launcher.files import read_json
from launcher.ranks.record import RankRecord
from parallel.checkpoints.manifest import atomic_write_bytes

LEARN_FACTOR = 5.0
"""The learnt limit is this many times the longest quiet interval seen (NVIDIA's resiliency
extension uses 5 too)."""


LEARN_FLOOR = 10.0
"""Seconds a learnt limit is at least, unless ``--hang-floor`` says otherwise: a progress event
may lag its step by half a second (``parallel.hook.progress.INTERVAL``), a busy machine stretches a
step twofold."""


LEARN_AFTER = 1
"""Quiet intervals a rank must have shown before the limit is learnt from them: after the first
training step, the first interval and the floor judge a frozen rank."""


LEARNT_FILE = "hang_limits.json"
"""In the log directory: what the hang limits learnt, for the next launch of the same job."""


DEFAULT_TIMEOUT = 600.0
"""The limit while nothing is learnt yet (no ``--hang-timeout`` given)."""


WAIT_MARGIN = 1.0
"""Seconds short of its limit at which a quiet rank counts as waiting, for what the limits learn
(``Lessons``): the readers look every half second or so, and a wait on a rank busy alone that
ends between two looks, a little past the limit, must not be learnt as a step either. At most
half the limit."""


@dataclasses.dataclass(frozen=True)
class Learnt:
    """What the job has shown so far: the longest quiet interval between two progress events of
    one rank outside grace and sections, how many such intervals one rank showed (at most), the
    longest section of each kind (a save, an evaluation), and the first training step's run
    (``RankRecord.first_run``: the least of any rank's, the one that did not wait on a peer's
    compilation), which judges until an interval is seen."""

    longest: float = 0.0
    intervals: int = 0
    sections: tuple[tuple[str, float], ...] = ()
    first_run: Optional[float] = None

    def merge(self, other: "Learnt") -> "Learnt":
        kinds = dict(self.sections)
        for kind, seconds in other.sections:
            kinds[kind] = max(kinds.get(kind, 0.0), seconds)
        runs = [r for r in (self.first_run, other.first_run) if r is not None]
        return Learnt(max(self.longest, other.longest), max(self.intervals, other.intervals),
                      tuple(sorted(kinds.items())), min(runs, default=None))

    @classmethod
    def of(cls, progress: Iterable[RankRecord]) -> "Learnt":
        learnt = cls()
        for p in progress:
            learnt = learnt.merge(cls(p.longest, p.intervals, p.section_longest, p.first_run))
        return learnt

    def section(self, kind: str) -> Optional[float]:
        return dict(self.sections).get(kind)

    def save(self, log_dir: str, command: Sequence[str]) -> None:
        """Keep what was learnt in ``log_dir`` (``LEARNT_FILE``) for the next launch there of
        the same ``command`` (the script and its arguments): it resumes the same job."""
        record = {"command": list(command), "longest": self.longest,
                  "intervals": self.intervals, "sections": dict(self.sections)}
        try:
            atomic_write_bytes(os.path.join(log_dir, LEARNT_FILE), json.dumps(record).encode())
        except OSError:
            pass

    @classmethod
    def load(cls, log_dir: str, command: Sequence[str]) -> "Learnt":
        """What an earlier launch of ``command`` into ``log_dir`` learnt; nothing when it was
        another command (another job's pace says nothing of this one's) or cannot be read."""
        record = read_json(os.path.join(log_dir, LEARNT_FILE))
        try:
            if record["command"] != list(command):
                return cls()
            sections = tuple(sorted((str(k), float(v)) for k, v in record["sections"].items()))
            learnt = cls(float(record["longest"]), int(record["intervals"]), sections)
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls()
        finite = all(map(math.isfinite, [learnt.longest, *dict(sections).values()]))
        return learnt if finite and learnt.longest >= 0 else cls()


@dataclasses.dataclass(frozen=True)
class Limits:
    """``--hang-timeout`` (None: not given, learnt from the job; 0 turns detection off) and
    ``--hang-grace``, in seconds, with what the job has shown so far (``learning``).

    Learnt: ``LEARN_FACTOR`` x the longest quiet interval, at least ``floor`` (``--hang-floor``,
    ``LEARN_FLOOR``), once a rank showed ``LEARN_AFTER`` intervals (``DEFAULT_TIMEOUT`` before).
    A rank in grace or inside a graph compilation gets the grace; a rank inside a section (a
    save, an evaluation) gets ``LEARN_FACTOR`` x the longest section of that kind seen, at least
    the step limit, or the grace while none ended yet."""

    timeout: Optional[float]
    grace: float
    learnt: Learnt = Learnt()
    floor: float = LEARN_FLOOR

    @property
    def on(self) -> bool:
        return self.timeout is None or self.timeout > 0

    @property
    def quiet(self) -> float:
        """The limit in force between two progress events, in seconds."""
        if self.timeout is not None:
            return self.timeout
        if self.learnt.intervals < LEARN_AFTER:
            run = self.learnt.first_run
            return DEFAULT_TIMEOUT if run is None else max(self.floor, LEARN_FACTOR * run)
        return max(self.floor, LEARN_FACTOR * self.learnt.longest)

    @property
    def why(self) -> str:
        """The limit and where it comes from, for the message that names a hang."""
        if self.timeout is not None:
            return f"--hang-timeout {self.timeout:g}"
        if self.learnt.intervals < LEARN_AFTER and self.learnt.first_run is not None:
            return (f"limit {_seconds(self.quiet)} s learnt: {LEARN_FACTOR:g} x "
                    f"{_seconds(self.learnt.first_run, 2)} s first step, floor {self.floor:g} s")
        if self.learnt.intervals < LEARN_AFTER:
            return f"limit {DEFAULT_TIMEOUT:g} s, the default: no interval seen to learn from"
        return (f"limit {_seconds(self.quiet)} s learnt: {LEARN_FACTOR:g} x "
                f"{_seconds(self.learnt.longest, 2)} s longest interval, floor {self.floor:g} s")

    def learning(self, learnt: Learnt) -> "Limits":
        return dataclasses.replace(self, learnt=self.learnt.merge(learnt))

    def of(self, progress: RankRecord) -> float:
        if progress.in_grace or progress.compiling:
            return max(self.grace, self.quiet)
        if progress.section:
            seen = self.learnt.section(progress.section)
            return self.grace if seen is None else max(self.quiet, LEARN_FACTOR * seen)
        return self.quiet

    def life(self, progress: RankRecord) -> Optional[float]:
        """When ``progress``'s rank was last seen alive for these limits: with ``--hang-timeout``
        the limit is on progress alone (a rank spinning without progress is found by it),
        else its last sign of life (``RankRecord.life``)."""
        return progress.since if self.timeout is not None else progress.life

    def frozen(self, progress: RankRecord, now: float, margin: float = 0.0) -> bool:
        """Whether ``progress``'s rank has not been seen alive (``life``) for its limit (less
        ``margin`` seconds, at most half of it)."""
        life, limit = self.life(progress), self.of(progress)
        return life is not None and now - life > limit - min(margin, limit / 2)

    def why_for(self, progress: RankRecord) -> str:
        """``why``, or the grace's or a section's limit when that is what ``progress`` had."""
        if (progress.in_grace or progress.compiling) and self.grace > self.quiet:
            return f"--hang-grace {self.grace:g}: compiling"
        if progress.section and not progress.in_grace and not progress.compiling:
            return f"limit {_seconds(self.of(progress))} s inside a {progress.section}"
        return self.why


class Lessons:
    """What the limits learn from the ranks' records as they go, less the intervals that held a
    wait: a rank frozen past its limit (``WAIT_MARGIN`` short of it) while another lived on
    (rank 0 saving, evaluating or uploading alone, the others waiting for it in the next
    collective). They did not step at that pace, and after an hour's save a limit of 5 hours
    would name the next hang in hours.
    Each reader of records keeps its own (node 0's ``HangCheck``, each node's ``StallWatch``);
    a new attempt's records start afresh (``begin_attempt``), what was learnt stays."""

    def __init__(self) -> None:
        self._upto: dict[int, float] = {}
        self._busy_at: Optional[float] = None

    def begin_attempt(self) -> None:
        self._upto.clear()

    def learn(self, limits: Limits, records: Mapping[int, RankRecord], now: float) -> Limits:
        """``limits`` with the intervals ``records`` ended since the last call
        (``RankRecord.recent``) that began after the last wait."""
        frozen = [limits.frozen(p, now, WAIT_MARGIN) for p in records.values()]
        if any(frozen) and not all(frozen):
            self._busy_at = now
        learnt = Learnt()
        for rank, p in records.items():
            upto = self._upto.get(rank, -math.inf)
            fresh = [(ended, seconds) for ended, seconds in p.recent if ended > upto]
            longest = max((seconds for ended, seconds in fresh
                           if self._busy_at is None or ended - seconds > self._busy_at), default=0.0)
            self._upto[rank] = max([upto, *(ended for ended, _ in fresh)])
            learnt = learnt.merge(Learnt(longest, p.intervals, p.section_longest, p.first_run))
        return limits.learning(learnt)


def _seconds(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, whole from 100 on (never ``1e+03``)."""
    return f"{value:.{digits}g}" if value < 10 ** digits else f"{value:.0f}"


"""What the limits read of a rank: its record (``launcher.ranks.record``), one fold for the hang
check, the phases, the monitor and the attempt."""
