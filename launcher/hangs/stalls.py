"""Hang detection as node 0 judges it: which rank stopped making progress, and where it is stuck.
The limits live in ``launcher.hangs.hang_limits``, each node's reading of its ranks' stacks in
``launcher.hangs.stack_samples``.

Progress is what the ranks report: the rank hook's ``progress`` events (``parallel.progress``:
top-level Cell calls, dataset batches, checkpoint loads, whatever loop the script runs), the
trainer's ``step`` events, and ``initialised``. ``launcher.ranks.RankRecord`` folds them (what
counts as progress is said there, once), with the launcher's clock when each arrived (not the
rank's, so clock skew between hosts cannot fake or hide a stall). A rank is silent past its
limit (``Limits``) after ``--hang-timeout`` seconds without progress, or, with no
``--hang-timeout`` given, after a limit learnt from the job: 5 x the longest quiet interval any
rank showed between two progress events, at least 10 s (kept across restarts); or
``--hang-grace`` while it is in grace: since ``init()`` until its first progress, and since a
checkpoint load until its next (graph compilation on Ascend can take many minutes). A rank
inside a checkpoint save or an evaluation (a ``section``) has the limit of that kind: 5 x the
longest one seen, or the grace while none ended yet; its peers that wait meanwhile are not
judged while it is within it.

Two ways a hang shows, both judged on node 0 over every rank of every host (``HangCheck``):

* One rank silent past its limit while others still advance (``find_stall``).
* Every rank silent past its limit: in synchronous data parallelism the healthy ranks soon wait
  inside the framework's collectives (MindSpore's, torch's) for the one that hangs. Each node's
  supervisor then reads its ranks' stacks (``stack_samples.StallWatch``: faulthandler on
  SIGUSR1, every thread, and py-spy's native stacks when py-spy is installed), keeps them under
  the log directory and sends them to node 0 as ``stack`` events. The rank whose main thread is
  anywhere else (user code, a sleep, a data loader) is the straggler; without stacks, the one
  not inside a top-level call while the others are, or the one whose count is behind. Ranks that
  all wait inside the framework with nobody standing out are a hang too (a lost collective),
  named as such; ranks that are all outside it wait on nobody (an evaluation in numpy, a long
  save), and are left alone.

A rank that fails with a communication timeout after another stopped making progress is the
victim: ``stalled_before`` names the stalled one as the root cause (``launch`` rewrites the
result). ``HANG_EXIT_CODE`` (124, as ``timeout(1)``) is the job's exit code for a hang.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

from launcher.console_lines import runs_text
from launcher.hangs.hang_limits import Learnt, Limits
from launcher.hangs.stack_samples import StackSample
from launcher.ranks.record import RankRecord

HANG_EXIT_CODE = 124


_CHECK_INTERVAL = 0.5


_EVIDENCE_WAIT = 2.0
"""Seconds node 0 waits, once every rank is silent, for the nodes' stack samples."""


_SHOWN_FRAMES = 6


class Progress(Protocol):
    """What the stall check reads of a rank (the monitor's ``RankState``): ``progress`` is its
    record (``launcher.ranks.record``), whose ``since`` is its last progress."""

    rank: int
    host: str
    step: Optional[int]
    progress: RankRecord

    @property
    def finished(self) -> bool: ...

    @property
    def done(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Stall:
    """A hang: the rank that stopped making progress (None when every rank waits in MindSpore
    and none stands out), its host, since when, and where the ranks are. ``others_advanced``:
    the others stepped on (``find_stall``); else every rank went silent, ``waiting`` being the
    ranks that wait on it, ``also`` any further straggler, ``how`` what gave it away."""

    rank: Optional[int]
    host: str
    last_step: Optional[int]
    silent_for: float
    others_advanced: bool = True
    timeout: float = 0.0
    also: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    stacks: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """(rank, frames, most recent call first) of the ranks the block shows."""
    how: str = ""
    framework: str = ""
    """Where the waiting ranks wait, if their stacks say: ``MindSpore`` or ``torch``."""
    limit: str = ""
    """The limit that was passed and where it came from (``Limits.why``); "" when the hang was
    found from a failure it caused, before any limit passed."""
    count: int = 0
    """The stalled rank's progress count (the rank hook's counted calls and batches): where a
    script sends no ``step`` events (torch, a plain loop), how far it got."""
    left: bool = False
    """``rank`` did not hang: its script ended while the others wait inside a step for it (it
    left the job's collectives early: fewer batches than its peers, a loop that ends early)."""


def describe_stall(stall: Stall, job_id: str) -> str:
    """The block printed when the job is stopped because of ``stall``."""
    if stall.left:
        window = f"{stall.silent_for:.0f} s" + (f" ({stall.limit})" if stall.limit else "")
        names = ", ".join(f"rank {r}" for r in (stall.rank, *stall.also))
        after = f" after step {stall.last_step}" if stall.last_step is not None else ""
        where = f" in {stall.framework}" if stall.framework else ""
        head = (f"npu-launch: job {job_id} stopped: rank(s) {_ranks(stall.waiting)} wait{where} "
                f"with no progress for {window}, but {names} on {stall.host} ended its script"
                f"{after}: it left the job's collectives early (fewer batches than its peers?)")
    elif stall.others_advanced:
        where = (f"at step {stall.last_step}" if stall.last_step is not None
                 else f"after {stall.count} counted calls" if stall.count
                 else "before its first step")
        head = (f"npu-launch: job {job_id} stopped: rank {stall.rank} on {stall.host} stalled "
                f"{where}: no progress for {stall.silent_for:.0f} s while other ranks advanced"
                + (f" ({stall.limit})" if stall.limit else ""))
    else:
        window = f"{stall.silent_for:.0f} s" + (f" ({stall.limit})" if stall.limit else "")
        if stall.rank is None:
            head = (f"npu-launch: job {job_id} stopped: no rank made progress for {window}; "
                    f"every rank waits inside {stall.framework or 'a step'}")
        else:
            names = ", ".join(f"rank {r}" for r in (stall.rank, *stall.also))
            where = f" in {stall.framework}" if stall.framework else ""
            head = (f"npu-launch: job {job_id} stopped: {names} on {stall.host} hangs: no "
                    f"progress for {window} while rank(s) {_ranks(stall.waiting)} wait{where}"
                    + (f" ({stall.how})" if stall.how else ""))
    lines = [head]
    for rank, frames in stall.stacks:
        lines.append(f"  rank {rank} is at (most recent call first):")
        lines += [f"    {frame}" for frame in frames[:_SHOWN_FRAMES]] or ["    (no stack)"]
    return "\n".join(lines)


def _ranks(ranks: Sequence[int]) -> str:
    return runs_text(sorted(ranks), ", ") or "none"


def find_stall(ranks: Iterable[Progress], now: float, limits: Limits) -> Optional[Stall]:
    """The rank silent longest past its limit while another stepped within the timeout, and
    went on for at least half the timeout after it went quiet (ranks of a synchronous job that
    all stop together stop a hair apart: that is every rank silent, not one falling behind).
    A rank is silent only from when the others' last save or evaluation ended: until then it
    may have waited on them, and the one that saved steps on a moment before it does."""
    states = list(ranks)
    quiet = limits.quiet
    recent = [s for s in states if s.progress.stepped_at is not None
              and now - s.progress.stepped_at <= quiet]

    def quiet_since(s: Progress) -> Optional[float]:
        since = s.progress.since
        if since is None:
            return None
        return max([since] + [r.progress.section_ended for r in states
                              if r.rank != s.rank and r.progress.section_ended is not None])

    def behind(s: Progress, since: float) -> bool:
        return any(r.rank != s.rank and (r.progress.stepped_at or 0.0) - since > quiet / 2
                   for r in recent)

    silent = [(since, s.rank, s) for s in states
              if not s.done and (since := quiet_since(s)) is not None
              and now - since > limits.of(s.progress) and behind(s, since)]
    if not silent:
        return None
    _, _, worst = min(silent, key=lambda item: item[:2])
    silent_since = worst.progress.since if worst.progress.since is not None else now
    return Stall(worst.rank, worst.host, worst.step, now - silent_since,
                 timeout=limits.of(worst.progress), limit=limits.why_for(worst.progress),
                 count=worst.progress.count)


def judge(states: Sequence[Progress], samples: Mapping[int, StackSample], now: float,
          limits: Limits) -> Stall:
    """Every rank of ``states`` went silent: the straggler, by stacks, else by progress."""
    since = max(s.progress.since or now for s in states)
    by_rank = {s.rank: s for s in states}
    stacked = {r: s for r, s in samples.items() if s.frames and r in by_rank}
    inside = sorted(r for r, s in stacked.items() if s.waits_in)
    outside = sorted(r for r, s in stacked.items() if not s.waits_in)
    framework = next((w for r in inside if (w := stacked[r].waits_in)), "")
    busy = sorted(s.rank for s in states if s.progress.busy)
    idle = sorted(s.rank for s in states if not s.progress.busy)
    low = min(s.progress.count for s in states)
    behind = sorted(s.rank for s in states if s.progress.count == low)
    guilty: list[int] = []
    how = ""
    if inside and outside:
        guilty, waiting, how = outside, inside, f"its stack is outside {framework}"
    elif busy and idle:
        guilty, waiting, how = idle, busy, "it is not inside a step"
    elif len(behind) < len(states):
        guilty, waiting, how = behind, sorted(set(by_rank) - set(behind)), "its count is behind"
    else:
        waiting = inside if inside else busy
    shown = guilty + [r for r in waiting if r in stacked][:1] if guilty else sorted(stacked)
    first = by_rank[guilty[0]] if guilty else None
    return Stall(rank=first.rank if first else None, host=first.host if first else states[0].host,
                 last_step=first.step if first else None, silent_for=now - since,
                 others_advanced=False, timeout=limits.quiet, also=tuple(guilty[1:]),
                 waiting=tuple(waiting), how=how,
                 limit=limits.why_for(first.progress) if first else limits.why,
                 stacks=tuple((r, stacked[r].frames) for r in shown[:4] if r in stacked),
                 framework=framework)


class HangCheck:
    """Node 0's hang check over the job's rank states (``states``, the monitor's), called every
    tick; ``sample`` takes the stacks a node sent. ``first`` is the first stall seen
    (``summary.json`` keeps it); ``begin_attempt`` forgets the last attempt's, not what the
    limits learnt (``limits``: kept across restarts, as the ranks do the same work again)."""

    def __init__(self, states: Callable[[], Iterable[Progress]], limits: Limits,
                 clock: Callable[[], float] = time.time) -> None:
        self._states = states
        self.limits = limits
        self._clock = clock
        self._next_check = 0.0
        self._due: Optional[float] = None
        self._samples: dict[int, tuple[float, StackSample]] = {}
        self._stall: Optional[Stall] = None
        self.first: Optional[Stall] = None

    def begin_attempt(self) -> None:
        self._stall, self._next_check, self._due = None, 0.0, None
        self._samples.clear()

    def sample(self, sample: StackSample) -> None:
        if sample.frames:  # not a native-only follow-up
            self._samples[sample.rank] = (self._clock(), sample)

    def __call__(self) -> Optional[Stall]:
        now = self._clock()
        if self._stall is None and now >= self._next_check:
            self._next_check = now + _CHECK_INTERVAL
            states = list(self._states())
            self.limits = self.limits.learning(Learnt.of(s.progress for s in states))
            self._stall = self._check(states, now)
            if self._due is not None:  # awaiting the nodes' stacks: look again soon
                self._next_check = min(self._next_check, now + 0.05)
            self.first = self.first or self._stall
        return self._stall

    def _check(self, states: list[Progress], now: float) -> Optional[Stall]:
        behind = find_stall(states, now, self.limits)
        if behind is not None:
            return behind
        live = [s for s in states if not s.done and s.progress.since is not None]
        if not live or any(now - (s.progress.since or now) <= self.limits.of(s.progress)
                           for s in live):
            self._due = None
            return None
        self._due = self._due or now
        since = max(s.progress.since or 0.0 for s in live)
        fresh = {r: sample for r, (at, sample) in self._samples.items() if at >= since}
        if len(fresh.keys() & {s.rank for s in live}) < len(live) \
                and now - self._due < _EVIDENCE_WAIT:
            return None
        stall = judge(live, fresh, now, self.limits)
        ended = [s for s in states if s.progress.script_ended]
        if stall.rank is None and stall.waiting and ended:
            return left_early(stall, ended)
        if stall.rank is None and not stall.waiting:
            # Nobody waits inside a framework, so nobody waits on anybody: look again later.
            self._due, self._next_check = None, now + self.limits.quiet
            return None
        return stall


def left_early(stall: Stall, ended: Sequence[Progress]) -> Stall:
    """Every rank still in the job waits inside a step, none stands out, and ``ended`` ranks'
    scripts have ended: the first of them to end is the cause (the others wait for its share of
    a collective it will never join)."""
    first, *more = sorted(ended, key=lambda s: (s.progress.script_ended_at or 0.0, s.rank))
    return dataclasses.replace(stall, rank=first.rank, host=first.host, last_step=first.step,
                               also=tuple(s.rank for s in more), left=True,
                               count=first.progress.count)


def stalled_before(states: Iterable[Progress], failed: int, at: float) -> Optional[Stall]:
    """The rank that had stopped making progress before rank ``failed`` failed at ``at``, when
    the failure looks like its consequence: the failed rank was inside a step (a collective) or
    ahead, waiting for at least 2 s, and the other had been silent for at least half that long,
    outside a step or behind. None when nothing says so."""
    by_rank = {s.rank: s for s in states}
    victim = by_rank.get(failed)
    if victim is None or victim.progress.since is None:
        return None
    waited = at - victim.progress.since
    if waited < 2.0:
        return None
    suspects = []
    for s in by_rank.values():
        p = s.progress
        if s.rank == failed or p.since is None or s.finished:
            continue
        # A suspect inside a step while the failed rank is not was waiting on it (a rank that
        # raised between steps, then took seconds to tear its pipeline down).
        behind = p.count < victim.progress.count and (victim.progress.busy or not p.busy)
        apart = (victim.progress.busy and not p.busy) or behind
        if apart and at - p.since >= waited / 2:
            suspects.append((p.since, s.rank, s))
    if not suspects:
        return None
    since, _, straggler = min(suspects, key=lambda item: item[:2])
    return Stall(straggler.rank, straggler.host, straggler.step, at - since,
                 others_advanced=False, waiting=(failed,),
                 how="not inside a step" if not straggler.progress.busy else "its count is behind")
