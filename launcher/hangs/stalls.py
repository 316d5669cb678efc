"""Hang detection as node 0 judges it: which rank is frozen, and where it is stuck. The limits
live in ``launcher.hangs.hang_limits``, each node's readings of its ranks in
``launcher.hangs.liveness`` (alive or frozen) and ``launcher.hangs.stack_samples`` (stacks).

Progress is what the ranks report: the rank hook's ``progress`` events (``parallel.hook.progress``:
top-level Cell calls, dataset batches, checkpoint loads, graph compilations), the trainer's
``step`` events, and ``initialised``. ``launcher.ranks.RankRecord`` folds them (what counts as
progress is said there, once), with the launcher's clock when each arrived (not the rank's, so
clock skew between hosts cannot fake or hide a stall). Between two progress events a rank may be
busy alone: rank 0 saving, evaluating or uploading while the others wait for it in the next
step's collective. So a rank is judged by when it was last seen *alive* (``RankRecord.life``):
its last progress, or, outside a framework call, the last time its supervisor read its main
thread run, its process read or write, or a process it started run (``alive`` events). Inside a
framework call only progress counts: a rank waiting in a collective is not alive by its CPU.

A rank is frozen once it has not been alive for its limit (``Limits.frozen``): learnt from the
job; ``--hang-grace`` from ``init()`` until its first training step, after a checkpoint load
and while MindSpore compiles a graph; a section's own limit inside a save or an evaluation. With
``--hang-timeout`` only progress counts as life: a rank that spins without progress is found.
While any rank of the job is alive, nobody is judged: a rank that waits is waiting on the one
that is busy (``busy_alone`` names such spells for the display). Once every
rank is frozen, each node's supervisor reads its ranks' stacks (``stack_samples.StallWatch``:
faulthandler on SIGUSR1, every thread, and py-spy's native stacks when py-spy is installed) and
sends them to node 0 as ``stack`` events, and ``judge`` names the hang (``HangCheck``): the rank
whose main thread is anywhere but inside the framework (user code, a sleep, a data loader) is
the one that hangs, frozen where it is; without stacks, the one not inside a top-level call
while the others are, or the one whose count is behind. Ranks that all wait inside the
framework with nobody standing out are a hang too (a lost collective), named as such, or, when
a rank's script ended, as that rank leaving the job's collectives early; the end of a script is
the job's progress too, so the ranks still in it are judged only a limit after it (they may be
finishing the very steps it finished). Ranks that are all outside it wait on nobody, and are
left alone.

A rank that fails with a communication timeout after another stopped making progress is the
victim: ``stalled_before`` names the stalled one as the root cause (``launch`` rewrites the
result). ``HANG_EXIT_CODE`` (124, as ``timeout(1)``) is the job's exit code for a hang.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

from launcher.hangs.hang_limits import Lessons, Limits
from launcher.hangs.stack_samples import StackSample
from launcher.ranks.ranges import runs_text
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
    """A hang: the frozen rank (None when every rank waits in MindSpore and none stands out),
    its host, for how long every rank has been frozen, and where the ranks are: ``waiting`` the
    ranks that wait on it, ``also`` any further straggler, ``how`` what gave it away."""

    rank: Optional[int]
    host: str
    last_step: Optional[int]
    silent_for: float
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
    else:
        window = f"{stall.silent_for:.0f} s" + (f" ({stall.limit})" if stall.limit else "")
        if stall.rank is None:
            head = (f"npu-launch: job {job_id} stopped: no rank made progress for {window}; "
                    f"every rank waits inside {stall.framework or 'a step'}")
        else:
            names = ", ".join(f"rank {r}" for r in (stall.rank, *stall.also))
            where = f" in {stall.framework}" if stall.framework else ""
            got = (f"; it stopped at step {stall.last_step}" if stall.last_step is not None
                   else f"; it stopped after {stall.count} counted calls" if stall.count else "")
            head = (f"npu-launch: job {job_id} stopped: {names} on {stall.host} hangs: no "
                    f"progress for {window} while rank(s) {_ranks(stall.waiting)} wait{where}"
                    + (f" ({stall.how})" if stall.how else "") + got)
    lines = [head]
    for rank, frames in stall.stacks:
        lines.append(f"  rank {rank} is at (most recent call first):")
        lines += [f"    {frame}" for frame in frames[:_SHOWN_FRAMES]] or ["    (no stack)"]
    return "\n".join(lines)


def _ranks(ranks: Sequence[int]) -> str:
    return runs_text(sorted(ranks), ", ") or "none"


def judge(states: Sequence[Progress], samples: Mapping[int, StackSample], now: float,
          limits: Limits) -> Stall:
    """Every rank of ``states`` is frozen: the one that hangs, by stacks, else by progress."""
    since = max(limits.life(s.progress) or now for s in states)
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
    if first is not None and not first.progress.busy and limits.timeout is None:
        how = ", ".join(filter(None, (how, _still(first, now))))
    return Stall(rank=first.rank if first else None, host=first.host if first else states[0].host,
                 last_step=first.step if first else None, silent_for=now - since,
                 timeout=limits.quiet, also=tuple(guilty[1:]),
                 waiting=tuple(waiting), how=how,
                 limit=limits.why_for(first.progress) if first else limits.why,
                 stacks=tuple((r, stacked[r].frames) for r in shown[:4] if r in stacked),
                 framework=framework, count=first.progress.count if first else 0)


def _still(state: Progress, now: float) -> str:
    """Why a rank outside a framework call was judged frozen, as its supervisor read it."""
    life = state.progress.life
    if life is None:
        return ""
    return f"no CPU, no I/O, no child process for {now - life:.0f} s"


@dataclasses.dataclass(frozen=True)
class Busy:
    """A rank busy alone: outside a framework call, without progress for longer than its limit,
    but alive (its main thread runs, it reads or writes, its child processes run) while the
    ``waiting`` ranks are frozen, most likely waiting for it in the next collective. ``doing``
    says what its supervisor last read it doing; ``written``: bytes it wrote meanwhile."""

    rank: int
    host: str
    seconds: float
    doing: str
    written: int
    waiting: tuple[int, ...]

    def text(self) -> str:
        """``rank 0 busy alone for 34 s (writing, 680 MB), ranks 1-7 wait``."""
        what = self.doing + (f", {self.written / 1e6:.0f} MB" if self.written >= 1e6 else "")
        waiting = runs_text(sorted(self.waiting), ", ")
        return (f"rank {self.rank} busy alone for {self.seconds:.0f} s ({what}), "
                f"rank{'s' if len(self.waiting) > 1 else ''} {waiting} wait")

    def to_json(self) -> dict[str, object]:
        return {"seconds": round(self.seconds, 1), "doing": self.doing, "host": self.host,
                "bytes_written": self.written}


def busy_alone(states: Sequence[Progress], now: float, limits: Limits) -> list[Busy]:
    """The ranks busy alone now (``Busy``): none unless another rank is frozen."""
    live = [s for s in states if not s.done and s.progress.since is not None]
    stuck = tuple(sorted(s.rank for s in live if limits.frozen(s.progress, now)))
    if not stuck:
        return []
    return [Busy(s.rank, s.host, now - (s.progress.since or now), _doing(s.progress),
                 s.progress.quiet_written, stuck)
            for s in live if s.rank not in stuck and not s.progress.busy
            and now - (s.progress.since or now) > limits.of(s.progress)]


def _doing(progress: RankRecord) -> str:
    how = set(progress.alive_how.split(","))
    if progress.quiet_written and "io" in how:
        return "writing"
    return next((word for key, word in (("io", "reading"), ("children", "in a child process"),
                                        ("cpu", "computing")) if key in how), "busy")


class HangCheck:
    """Node 0's hang check over the job's rank states (``states``, the monitor's), called every
    tick; ``sample`` takes the stacks a node sent; ``on_busy`` is told, on each check, the ranks
    busy alone then (the monitor's display and summary). ``first`` is the first stall seen
    (``summary.json`` keeps it); ``begin_attempt`` forgets the last attempt's, not what the
    limits learnt (``limits``: kept across restarts, as the ranks do the same work again)."""

    def __init__(self, states: Callable[[], Iterable[Progress]], limits: Limits,
                 clock: Callable[[], float] = time.time,
                 on_busy: Callable[[list[Busy]], None] = lambda busy: None) -> None:
        self._states = states
        self.limits = limits
        self._clock = clock
        self._on_busy = on_busy
        self._lessons = Lessons()
        self._next_check = 0.0
        self._due: Optional[float] = None
        self._samples: dict[int, tuple[float, StackSample]] = {}
        self._stall: Optional[Stall] = None
        self.first: Optional[Stall] = None

    def begin_attempt(self) -> None:
        self._lessons.begin_attempt()
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
            self.limits = self._lessons.learn(self.limits, {s.rank: s.progress for s in states},
                                              now)
            self._stall = self._check(states, now)
            if self._due is not None:  # awaiting the nodes' stacks: look again soon
                self._next_check = min(self._next_check, now + 0.05)
            self.first = self.first or self._stall
        return self._stall

    def _check(self, states: list[Progress], now: float) -> Optional[Stall]:
        self._on_busy(busy_alone(states, now, self.limits))
        live = [s for s in states if not s.done and s.progress.since is not None]
        ended = [s for s in states if s.progress.script_ended]
        if not live or not all(self.limits.frozen(s.progress, now) for s in live) \
                or _just_ended(ended, live, now, self.limits):
            self._due = None
            return None
        self._due = self._due or now
        since = max(self.limits.life(s.progress) or 0.0 for s in live)
        fresh = {r: sample for r, (at, sample) in self._samples.items() if at >= since}
        if len(fresh.keys() & {s.rank for s in live}) < len(live) \
                and now - self._due < _EVIDENCE_WAIT:
            return None
        stall = judge(live, fresh, now, self.limits)
        if stall.rank is None and stall.waiting and ended:
            return left_early(stall, ended)
        if stall.rank is None and not stall.waiting:
            # Nobody waits inside a framework, so nobody waits on anybody: look again later.
            self._due, self._next_check = None, now + self.limits.quiet
            return None
        return stall


def _just_ended(ended: Sequence[Progress], live: Sequence[Progress], now: float,
                limits: Limits) -> bool:
    """Whether a rank's script ended less than a limit ago: its last steps were the job's
    progress, and the ranks still in it may be finishing the same steps, their progress not yet
    told (a rank reports at most twice a second, and one that waited on a peer busy alone
    reports nothing until its step is over). They are judged a limit after the last end."""
    last = max((s.progress.script_ended_at or 0.0 for s in ended), default=None)
    return last is not None and any(now - last <= limits.of(s.progress) for s in live)


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
                 waiting=(failed,),
                 how="not inside a step" if not straggler.progress.busy else "its count is behind")
