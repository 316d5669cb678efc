"""Hang detection, all of it: which rank stopped making progress, and where it is stuck.

Progress is what the ranks report: the rank hook's ``progress`` events (``parallel.progress``:
top-level Cell calls, dataset batches, checkpoint loads, whatever loop the script runs), the
trainer's ``step`` events, and ``initialised``. ``RankProgress`` folds them, with the launcher's
clock when each arrived (not the rank's, so clock skew between hosts cannot fake or hide a
stall). A rank is silent past its limit after ``--hang-timeout`` seconds without progress, or
``--hang-grace`` while it is in grace: since ``init()`` until its first progress, and since a
checkpoint load until its next (graph compilation on Ascend can take many minutes).

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
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable, Iterable, Mapping, Optional, Protocol, Sequence

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


@dataclasses.dataclass(frozen=True)
class Limits:
    """``--hang-timeout`` and ``--hang-grace``, in seconds; a timeout of 0 turns detection off."""

    timeout: float
    grace: float

    def of(self, progress: "RankProgress") -> float:
        return max(self.grace, self.timeout) if progress.in_grace else self.timeout


@dataclasses.dataclass
class RankProgress:
    """One rank's progress in this attempt, as the launcher saw its events arrive."""

    since: Optional[float] = None
    """Last progress: ``initialised``, a step, a higher count, a checkpoint load."""
    stepped_at: Optional[float] = None
    """Last step or higher count (not ``initialised``, not a load)."""
    count: int = 0
    busy: bool = False
    loads: int = 0
    in_grace: bool = True

    def observe(self, event: Event, now: float) -> None:
        kind = event.kind
        if kind == contract.EVENT_INITIALISED:
            self.since = self.since or now
        elif kind == contract.EVENT_STEP:
            self.since = self.stepped_at = now
            self.in_grace = False
        elif kind == contract.EVENT_PROGRESS:
            self.busy = bool(event.busy)
            if event.loads is not None and event.loads > self.loads:
                self.loads, self.since, self.in_grace = event.loads, now, True
            elif event.count is not None and event.count > self.count:
                self.since = self.stepped_at = now
                self.in_grace = False
            self.count = max(self.count, event.count or 0)


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


def describe_stall(stall: Stall, job_id: str) -> str:
    """The block printed when the job is stopped because of ``stall``."""
    if stall.others_advanced:
        where = (f"at step {stall.last_step}" if stall.last_step is not None
                 else "before its first step")
        head = (f"npu-launch: job {job_id} stopped: rank {stall.rank} on {stall.host} stalled "
                f"{where}: no progress for {stall.silent_for:.0f} s while other ranks advanced")
    else:
        window = f"{stall.silent_for:.0f} s (--hang-timeout {stall.timeout:g})"
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
    return ", ".join(map(str, ranks)) or "none"


def find_stall(ranks: Iterable[Progress], now: float, limits: Limits) -> Optional[Stall]:
    """The rank silent longest past its limit while another stepped within the timeout, and
    went on for at least half the timeout after it went quiet (ranks of a synchronous job that
    all stop together stop a hair apart: that is every rank silent, not one falling behind)."""
    states = list(ranks)
    recent = [s for s in states if s.progress.stepped_at is not None
              and now - s.progress.stepped_at <= limits.timeout]

    def behind(s: Progress) -> bool:
        since = s.progress.since
        return since is not None and any(
            r.rank != s.rank and (r.progress.stepped_at or 0.0) - since > limits.timeout / 2
            for r in recent)

    silent = [(s.progress.since, s.rank, s) for s in states
              if not s.done and s.progress.since is not None
              and now - s.progress.since > limits.of(s.progress) and behind(s)]
    if not silent:
        return None
    since, _, worst = min(silent, key=lambda item: item[:2])
    return Stall(worst.rank, worst.host, worst.step, now - since, timeout=limits.timeout)


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
                 others_advanced=False, timeout=limits.timeout, also=tuple(guilty[1:]),
                 waiting=tuple(waiting), how=how,
                 stacks=tuple((r, stacked[r].frames) for r in shown[:4] if r in stacked),
                 framework=framework)


class HangCheck:
    """Node 0's hang check over the job's rank states (``states``, the monitor's), called every
    tick; ``sample`` takes the stacks a node sent. ``first`` is the first stall seen
    (``summary.json`` keeps it); ``begin_attempt`` forgets the last attempt's."""

    def __init__(self, states: Callable[[], Iterable[Progress]], limits: Limits,
                 clock: Callable[[], float] = time.time) -> None:
        self._states = states
        self._limits = limits
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
            self._stall = self._check(list(self._states()), now)
            if self._due is not None:  # awaiting the nodes' stacks: look again soon
                self._next_check = min(self._next_check, now + 0.05)
            self.first = self.first or self._stall
        return self._stall

    def _check(self, states: list[Progress], now: float) -> Optional[Stall]:
        behind = find_stall(states, now, self._limits)
        if behind is not None:
            return behind
        live = [s for s in states if not s.done and s.progress.since is not None]
        if not live or any(now - (s.progress.since or now) <= self._limits.of(s.progress)
                           for s in live):
            self._due = None
            return None
        self._due = self._due or now
        since = max(s.progress.since or 0.0 for s in live)
        fresh = {r: sample for r, (at, sample) in self._samples.items() if at >= since}
        if len(fresh.keys() & {s.rank for s in live}) < len(live) \
                and now - self._due < _EVIDENCE_WAIT:
            return None
        stall = judge(live, fresh, now, self._limits)
        if stall.rank is None and not stall.waiting:
            # Nobody waits inside a framework, so nobody waits on anybody: look again later.
            self._due, self._next_check = None, now + self._limits.timeout
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
        progress = [self._progress.get(r) for r in running]
        if any(p is None or p.since is None or now - p.since <= self.limits.of(p)
               for p in progress):
            return False
        self._next_check = now + self.limits.timeout
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
