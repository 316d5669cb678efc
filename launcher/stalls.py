"""Hang detection, all of it: which rank stopped making progress, and where it is stuck.

Progress is what the ranks report: the rank hook's ``progress`` events (``parallel.progress``:
top-level Cell calls, dataset batches, checkpoint loads, whatever loop the script runs), the
trainer's ``step`` events, and ``initialised``. ``RankProgress`` folds them, with the launcher's
clock when each arrived (not the rank's, so clock skew between hosts cannot fake or hide a
stall). A rank is silent past its limit (``Limits``) after ``--hang-timeout`` seconds without
progress, or, with no ``--hang-timeout`` given, after a limit learnt from the job: 5 x the
longest quiet interval any rank showed between two progress events, at least 10 s (kept across
restarts); or ``--hang-grace`` while it is in grace: since ``init()`` until its first progress,
and since a checkpoint load until its next (graph compilation on Ascend can take many minutes).
A rank inside a checkpoint save or an evaluation (a ``section``) has the limit of that kind:
5 x the longest one seen, or the grace while none ended yet; its peers that wait meanwhile are
not judged while it is within it.

Two ways a hang shows, both judged on node 0 over every rank of every host (``HangCheck``):

* One rank silent past its limit while others still advance (``find_stall``).
* Every rank silent past its limit: in synchronous data parallelism the healthy ranks soon wait
  inside MindSpore's collectives for the one that hangs. Each node's supervisor then reads its
  ranks' stacks (``StallWatch``: faulthandler on SIGUSR1, every thread, and py-spy's native
  stacks when py-spy is installed), keeps them under the log directory and sends them to node 0
  as ``stack`` events. The rank whose main thread is anywhere else (user code, a sleep, a data
  loader) is the straggler; without stacks, the one not inside a top-level call while the others
  are, or the one whose count is behind. Ranks that all wait inside MindSpore with nobody
  standing out are a hang too (a lost collective), named as such; ranks that are all outside
  MindSpore wait on nobody (an evaluation in numpy, a long save), and are left alone.

A rank that fails with a communication timeout after another stopped making progress is the
victim: ``stalled_before`` names the stalled one as the root cause (``launch`` rewrites the
result). ``HANG_EXIT_CODE`` (124, as ``timeout(1)``) is the job's exit code for a hang.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

from launcher.console_lines import runs_text
from parallel import contract
from parallel.contract import Event

HANG_EXIT_CODE = 124
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)$')
"""A frame as faulthandler writes it; the file name may hold quotes (it is not escaped)."""
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")


def _folder(*parts: str) -> str:
    return os.sep + os.path.join(*parts) + os.sep


_FRAMEWORKS = (("MindSpore", _folder("mindspore"), _folder("mindspore", "dataset")),
               ("torch", _folder("torch_npu"), ""),
               ("torch", _folder("torch"), _folder("torch", "utils", "data")))
"""(name, where its files are, where its data pipeline's are): a main thread whose innermost
frame is in the framework but not its data pipeline waits in a step or a collective."""
_DUMP_WAIT = 0.5
_NATIVE_WAIT = 5.0
_CHECK_INTERVAL = 0.5
_EVIDENCE_WAIT = 2.0
"""Seconds node 0 waits, once every rank is silent, for the nodes' stack samples."""
MAX_STACK_TEXT = 64 * 1024
"""Characters of one rank's stacks sent to node 0 (the file on the rank's host keeps all)."""
_SHOWN_FRAMES = 6


LEARN_FACTOR = 5.0
"""The learnt limit is this many times the longest quiet interval seen (NVIDIA's resiliency
extension uses 5 too)."""
LEARN_FLOOR = 10.0
"""Seconds a learnt limit is at least: a progress event may lag its step by half a second
(``parallel.progress.INTERVAL``), a busy machine stretches a step twofold."""
LEARN_AFTER = 2
"""Quiet intervals a rank must have shown before the limit is learnt from them."""
LEARNT_FILE = "hang_limits.json"
"""In the log directory: what the hang limits learnt, for the next launch of the same job."""
DEFAULT_TIMEOUT = 600.0
"""The limit while nothing is learnt yet (no ``--hang-timeout`` given)."""


@dataclasses.dataclass(frozen=True)
class Learnt:
    """What the job has shown so far: the longest quiet interval between two progress events of
    one rank outside grace and sections, how many such intervals one rank showed (at most), and
    the longest section of each kind (a save, an evaluation)."""

    longest: float = 0.0
    intervals: int = 0
    sections: tuple[tuple[str, float], ...] = ()

    def merge(self, other: "Learnt") -> "Learnt":
        kinds = dict(self.sections)
        for kind, seconds in other.sections:
            kinds[kind] = max(kinds.get(kind, 0.0), seconds)
        return Learnt(max(self.longest, other.longest), max(self.intervals, other.intervals),
                      tuple(sorted(kinds.items())))

    @classmethod
    def of(cls, progress: Iterable["RankProgress"]) -> "Learnt":
        learnt = cls()
        for p in progress:
            learnt = learnt.merge(cls(p.longest, p.intervals, p.section_longest))
        return learnt

    def section(self, kind: str) -> Optional[float]:
        return dict(self.sections).get(kind)

    def save(self, log_dir: str, command: Sequence[str]) -> None:
        """Keep what was learnt in ``log_dir`` (``LEARNT_FILE``) for the next launch there of
        the same ``command`` (the script and its arguments): it resumes the same job."""
        record = {"command": list(command), "longest": self.longest,
                  "intervals": self.intervals, "sections": dict(self.sections)}
        try:
            with open(os.path.join(log_dir, LEARNT_FILE), "w") as f:
                json.dump(record, f)
        except OSError:
            pass

    @classmethod
    def load(cls, log_dir: str, command: Sequence[str]) -> "Learnt":
        """What an earlier launch of ``command`` into ``log_dir`` learnt; nothing when it was
        another command (another job's pace says nothing of this one's) or cannot be read."""
        try:
            with open(os.path.join(log_dir, LEARNT_FILE)) as f:
                record = json.load(f)
            if record["command"] != list(command):
                return cls()
            sections = tuple(sorted((str(k), float(v)) for k, v in record["sections"].items()))
            learnt = cls(float(record["longest"]), int(record["intervals"]), sections)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return cls()
        finite = all(map(math.isfinite, [learnt.longest, *dict(sections).values()]))
        return learnt if finite and learnt.longest >= 0 else cls()


@dataclasses.dataclass(frozen=True)
class Limits:
    """``--hang-timeout`` (None: not given, learnt from the job; 0 turns detection off) and
    ``--hang-grace``, in seconds, with what the job has shown so far (``learning``).

    Learnt: ``LEARN_FACTOR`` x the longest quiet interval, at least ``LEARN_FLOOR``, once a rank
    showed ``LEARN_AFTER`` intervals (``DEFAULT_TIMEOUT`` before). A rank in grace gets the
    grace; a rank inside a section (a save, an evaluation) gets ``LEARN_FACTOR`` x the longest
    section of that kind seen, at least the step limit, or the grace while none ended yet."""

    timeout: Optional[float]
    grace: float
    learnt: Learnt = Learnt()

    @property
    def on(self) -> bool:
        return self.timeout is None or self.timeout > 0

    @property
    def quiet(self) -> float:
        """The limit in force between two progress events, in seconds."""
        if self.timeout is not None:
            return self.timeout
        if self.learnt.intervals < LEARN_AFTER:
            return DEFAULT_TIMEOUT
        return max(LEARN_FLOOR, LEARN_FACTOR * self.learnt.longest)

    @property
    def why(self) -> str:
        """The limit and where it comes from, for the message that names a hang."""
        if self.timeout is not None:
            return f"--hang-timeout {self.timeout:g}"
        if self.learnt.intervals < LEARN_AFTER:
            return (f"limit {DEFAULT_TIMEOUT:g} s, the default: fewer than {LEARN_AFTER} "
                    "intervals seen to learn from")
        return (f"limit {_seconds(self.quiet)} s learnt: {LEARN_FACTOR:g} x "
                f"{_seconds(self.learnt.longest, 2)} s longest interval, floor {LEARN_FLOOR:g} s")

    def learning(self, learnt: Learnt) -> "Limits":
        return dataclasses.replace(self, learnt=self.learnt.merge(learnt))

    def of(self, progress: "RankProgress") -> float:
        if progress.in_grace:
            return max(self.grace, self.quiet)
        if progress.section:
            seen = self.learnt.section(progress.section)
            return self.grace if seen is None else max(self.quiet, LEARN_FACTOR * seen)
        return self.quiet

    def why_for(self, progress: "RankProgress") -> str:
        """``why``, or the grace's or a section's limit when that is what ``progress`` had."""
        if progress.in_grace and self.grace > self.quiet:
            return f"--hang-grace {self.grace:g}: compiling"
        if progress.section and not progress.in_grace:
            return f"limit {_seconds(self.of(progress))} s inside a {progress.section}"
        return self.why


def _seconds(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, whole from 100 on (never ``1e+03``)."""
    return f"{value:.{digits}g}" if value < 10 ** digits else f"{value:.0f}"


@dataclasses.dataclass
class RankProgress:
    """One rank's progress in this attempt, as the launcher saw its events arrive."""

    since: Optional[float] = None
    """Last progress: ``initialised``, a step, a higher count, a checkpoint load, a section's
    start or end."""
    stepped_at: Optional[float] = None
    """Last step or higher count outside a section (not ``initialised``, not a load)."""
    count: int = 0
    busy: bool = False
    loads: int = 0
    in_grace: bool = True
    section: str = ""
    """``save`` or ``eval`` while the rank is inside one, else ""."""
    section_since: float = 0.0
    sections: int = 0
    grace_count: int = 0
    """The count when the grace began: it lasts until the count is 2 higher (a first batch is
    fetched before the step that compiles), a ``first-step`` or a ``step``."""
    longest: float = 0.0
    """The longest quiet interval ended by a step or a count, outside grace and sections."""
    intervals: int = 0
    section_longest: tuple[tuple[str, float], ...] = ()

    def observe(self, event: Event, now: float) -> None:
        kind = event.kind
        if kind == contract.EVENT_INITIALISED:
            self.since = self.since or now
        elif kind == contract.EVENT_STEP:
            self._stepped(now)
        elif kind == contract.EVENT_FIRST_STEP and self.in_grace:
            self.since, self.in_grace = now, False
        elif kind == contract.EVENT_PROGRESS:
            self.busy = bool(event.busy)
            self._section(event.section or "", event.sections or 0, now)
            if event.loads is not None and event.loads > self.loads:
                self.loads, self.since, self.in_grace = event.loads, now, True
                self.grace_count = max(self.count, event.count or 0)
            elif event.count is not None and event.count > self.count:
                if self.section or (self.in_grace and event.count < self.grace_count + 2):
                    self.since = now
                else:
                    self._stepped(now)
            self.count = max(self.count, event.count or 0)

    def _stepped(self, now: float) -> None:
        if not self.in_grace and self.since is not None:
            self.longest = max(self.longest, now - self.since)
            self.intervals += 1
        self.since = self.stepped_at = now
        self.in_grace = False

    def _section(self, section: str, sections: int, now: float) -> None:
        """A section began or ended (one that began and ended between two events shows only
        in ``sections``: it was short)."""
        if section == self.section and sections == self.sections:
            return
        if self.section and not self.in_grace:
            kinds = dict(self.section_longest)
            kinds[self.section] = max(kinds.get(self.section, 0.0), now - self.section_since)
            self.section_longest = tuple(sorted(kinds.items()))
        self.section, self.sections, self.section_since = section, sections, now
        self.since = now


class Progress(Protocol):
    """What the stall check reads of a rank (the monitor's ``RankState``)."""

    rank: int
    host: str
    step: Optional[int]
    progress: RankProgress
    finished: bool

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


def describe_stall(stall: Stall, job_id: str) -> str:
    """The block printed when the job is stopped because of ``stall``."""
    if stall.others_advanced:
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
    all stop together stop a hair apart: that is every rank silent, not one falling behind)."""
    states = list(ranks)
    quiet = limits.quiet
    recent = [s for s in states if s.progress.stepped_at is not None
              and now - s.progress.stepped_at <= quiet]

    def behind(s: Progress) -> bool:
        since = s.progress.since
        return since is not None and any(
            r.rank != s.rank and (r.progress.stepped_at or 0.0) - since > quiet / 2
            for r in recent)

    silent = [(s.progress.since, s.rank, s) for s in states
              if not s.done and s.progress.since is not None
              and now - s.progress.since > limits.of(s.progress) and behind(s)]
    if not silent:
        return None
    since, _, worst = min(silent, key=lambda item: item[:2])
    return Stall(worst.rank, worst.host, worst.step, now - since,
                 timeout=limits.of(worst.progress), limit=limits.why_for(worst.progress),
                 count=worst.progress.count)


@dataclasses.dataclass(frozen=True)
class StackSample:
    """A rank's main-thread stack, most recent call first, as ``file:line in func``."""

    rank: int
    frames: tuple[str, ...]

    @property
    def waits_in(self) -> Optional[str]:
        """The framework whose step or collective the main thread is inside (MindSpore's graph
        execution, torch's backward or a collective), if any; a data pipeline is not that."""
        top = self.frames[0] if self.frames else ""
        return next((name for name, files, data in _FRAMEWORKS
                     if files in top and not (data and data in top)), None)

    @classmethod
    def of(cls, event: Event) -> "StackSample":
        frames = event.record.get("frames")
        return cls(event.rank, tuple(str(f) for f in frames) if isinstance(frames, list) else ())


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
        if stall.rank is None and not stall.waiting:
            # Nobody waits inside a framework, so nobody waits on anybody: look again later.
            self._due, self._next_check = None, now + self.limits.quiet
            return None
        return stall


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


class StallWatch:
    """On each node: once every running rank here has been silent past its limit, read their
    stacks (``sample``) for node 0's judgement; then again only after another timeout."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._progress: dict[int, RankProgress] = {}
        self._next_check = 0.0

    def observe(self, event: Event, now: float) -> None:
        self._progress.setdefault(event.rank, RankProgress()).observe(event, now)

    def due(self, running: Sequence[int], now: float) -> bool:
        if not running or now < self._next_check:
            return False
        self.limits = self.limits.learning(Learnt.of(self._progress.values()))
        progress = [self._progress.get(r) for r in running]
        if any(p is None or p.since is None or now - p.since <= self.limits.of(p)
               for p in progress):
            return False
        self._next_check = now + self.limits.quiet
        return True


def sample_stacks(pids: Mapping[int, int], stack_files: Mapping[int, str],
                  main_threads: Mapping[int, str]
                  ) -> tuple[dict[int, "Stacks"], Callable[[], dict[int, "Stacks"]]]:
    """Ask each rank (rank -> pid) for its stacks: faulthandler's Python stacks of every thread,
    written to its stack file, at once; and py-spy's native ones, when py-spy is installed,
    from the function returned beside them, which waits for py-spy (a few seconds at most) and
    writes them beside the Python ones (``native_path``)."""
    for rank, path in stack_files.items():
        try:
            open(path, "w").close()
            os.kill(pids[rank], signal.SIGUSR1)
        except (OSError, KeyError):
            continue
    _wait_for_dumps(stack_files.values())
    # py-spy only now: while it has a process stopped under ptrace, faulthandler cannot write.
    native = _native_stacks({r: p for r, p in pids.items() if r in stack_files})
    python = {rank: Stacks(StackSample(rank, _main_frames(_read(path),
                                                          main_threads.get(rank, ""))),
                           _read(path)) for rank, path in stack_files.items()}

    def natives() -> dict[int, Stacks]:
        found = {}
        for rank, dump in native.items():
            text = dump.wait_text()
            if text:
                _write(native_path(stack_files[rank]), text)
                found[rank] = Stacks(StackSample(rank, ()), "", text)
        return found
    return python, natives


def native_path(stack_path: str) -> str:
    """Where py-spy's native stacks of a rank go, beside its Python ones."""
    return stack_path.removesuffix(".txt") + ".native.txt"


@dataclasses.dataclass(frozen=True)
class Stacks:
    """One rank's stacks as read: the main thread's frames, every thread's Python stacks
    (faulthandler's text), and py-spy's native stacks ("" without py-spy)."""

    sample: StackSample
    text: str
    native: str = ""

    def event(self, host: str) -> Event:
        """The ``stack`` event a node sends node 0, each text cut to ``MAX_STACK_TEXT``."""
        record = {"event": contract.EVENT_STACK, "rank": self.sample.rank, "host": host,
                  "time": time.time(), "frames": list(self.sample.frames),
                  "text": self.text[:MAX_STACK_TEXT], "native": self.native[:MAX_STACK_TEXT]}
        return Event.parse(record) or Event(contract.EVENT_STACK, self.sample.rank, host,
                                            record=record)


class _Native:
    """``py-spy dump --native`` of one process, running in the background."""

    def __init__(self, pid: int, py_spy: str) -> None:
        self._out = ""
        self._thread = threading.Thread(target=self._run, args=(pid, py_spy), daemon=True)
        self._thread.start()

    def _run(self, pid: int, py_spy: str) -> None:
        try:
            done = subprocess.run([py_spy, "dump", "--native", "--pid", str(pid)],
                                  capture_output=True, text=True, timeout=_NATIVE_WAIT)
            self._out = done.stdout or done.stderr
        except (OSError, subprocess.SubprocessError) as e:
            self._out = f"py-spy failed: {e}"

    def wait_text(self) -> str:
        self._thread.join(_NATIVE_WAIT + 1)
        return self._out


def _native_stacks(pids: Mapping[int, int]) -> dict[int, _Native]:
    py_spy = shutil.which("py-spy")
    return {rank: _Native(pid, py_spy) for rank, pid in pids.items()} if py_spy else {}


def _wait_for_dumps(paths: Iterable[str]) -> None:
    """Until every stack file has stopped growing, at most ``_DUMP_WAIT`` seconds."""
    deadline = time.monotonic() + _DUMP_WAIT
    sizes: dict[str, int] = {}
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = {p: _size(p) for p in paths}
        if all(now.values()) and now == sizes:
            return
        sizes = now


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass


def _main_frames(text: str, main_thread: str) -> tuple[str, ...]:
    """The frames faulthandler wrote for the thread ``main_thread`` (``hex`` of its ident; the
    dump pads it with zeros), else for the thread that took the signal: the main thread."""
    frames: dict[int, list[str]] = {}
    current: Optional[int] = None
    signalled: Optional[int] = None
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread:
            current = int(thread.group(1), 16)
            frames[current] = []
            if line.startswith("Current thread"):
                signalled = current
        elif current is not None and (frame := _FRAME.match(line)):
            frames[current].append(f"{frame['file']}:{frame['line']} in {frame['func']}")
    wanted = int(main_thread, 16) if re.fullmatch(r"0x[0-9a-f]+", main_thread) else signalled
    return tuple(frames.get(wanted or -1) or frames.get(signalled or -1) or [])
