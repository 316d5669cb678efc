"""Each node's side of hang detection: reading its ranks' stacks once they are all silent.

``StallWatch`` says when every rank of this node went silent past its limit; ``sample_stacks``
then has each rank dump every thread's Python stack (faulthandler, on SIGUSR1) into its stack
file, and py-spy's native stacks follow from a thread when py-spy is installed. A ``Stacks``
becomes the ``stack`` event node 0 judges by (``launcher.hangs.stalls``); ``StackSample`` is what a
rank's main-thread stack says: inside a framework's step or collective, or elsewhere.
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
from typing import Callable, Iterable, Mapping, Optional, Sequence

from launcher.files import read_text, write_text
from launcher.hangs.hang_limits import Lessons, Limits
from launcher.ranks.record import RankRecord
from parallel import contract
from parallel.contract import Event

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


_CHECK_EVERY = 0.25
"""Seconds between two looks at this node's ranks (the watch loop ticks every 20 ms)."""


_DUMP_WAIT = 0.5


_NATIVE_WAIT = 5.0


MAX_STACK_TEXT = 64 * 1024
"""Characters of one rank's stacks sent to node 0 (the file on the rank's host keeps all)."""


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
        return cls(event.rank, tuple(str(f) for f in event.items("frames") or ()))


class StallWatch:
    """On each node: once every running rank here has been frozen past its limit (not alive:
    ``RankRecord.life``, from its progress and ``liveness.LifeWatch``'s readings), read their
    stacks (``sample``) for node 0's judgement; then again only after another timeout. It reads
    the node's records of its ranks (``records``, rank -> ``RankRecord``, folded by the
    supervisor)."""

    def __init__(self, limits: Limits, records: Mapping[int, RankRecord]) -> None:
        self.limits = limits
        self._records = records
        self._lessons = Lessons()
        self._next_check = 0.0

    def due(self, running: Sequence[int], now: float) -> bool:
        if not running or now < self._next_check:
            return False
        self._next_check = now + _CHECK_EVERY
        self.limits = self._lessons.learn(self.limits, self._records, now)
        progress = [self._records.get(r) for r in running]
        if any(p is None or not self.limits.frozen(p, now) for p in progress):
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
    python = {rank: Stacks(StackSample(rank, _main_frames(read_text(path),
                                                          main_threads.get(rank, ""))),
                           read_text(path)) for rank, path in stack_files.items()}

    def natives() -> dict[int, Stacks]:
        found = {}
        for rank, dump in native.items():
            text = dump.wait_text()
            if text:
                write_text(native_path(stack_files[rank]), text)
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
