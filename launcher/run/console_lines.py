"""What node 0's console makes of the ranks' lines: MindSpore's own chatter kept to the log files,
and a line that several ranks print alike shown once.

MindSpore's runtime log lines (glog style: ``[WARNING] DISTRIBUTED(20481,7f12...,python3.11):
2026-12-01-16:15:27.504.479 [mindspore/ccsrc/...] ...``, and from its Python side ``[INFO]
ME(18850:1402210...,MainProcess):...``) at DEBUG, INFO and WARNING go to the rank's log file
only (``--runtime-logs`` shows them); ERROR and above still reach the console. A rank's stdout
and stderr share one pipe, so such a line can come glued to the end of a line the rank had not
ended (``print("compiling ... ", end="")`` then ``[WARNING] COMMON(...) ...`` or the compile
cache's ``[WARNING] PIPELINE(...) ... Check the consistency of dependency files hash failed.
...``): the console shows the rank's part alone.

Identical lines: each rank line waits up to ``WINDOW`` seconds for the same text from other
ranks, then is shown once as ``[vm:0-7] text`` (ranks grouped by host: ``[a:0-1 b:2-3]``), or as
soon as every shown rank has printed it. Lines leave in the order they first came, so each rank's
lines keep their order; a rank that says the same thing twice is two lines. ``--no-merge-lines``
shows every line as it comes. Nothing here touches the log files.

Attempts: each line carries its attempt, and lines of two attempts are never merged. When a
restart begins, what still waits is shown at once (``flush``), before the restart line; the
console tags a line of an attempt that is over (``[vm:0-1 attempt 0] text``).
"""
from __future__ import annotations

import dataclasses
import re
import threading
import time
from typing import Callable, Optional

from launcher.ranks.ranges import label

WINDOW = 0.25
"""Seconds a line waits for the same line from other ranks."""
_RUNTIME_LOG = re.compile(rb"\[(?:DEBUG|INFO|WARNING)\] [A-Z_]+\(\d+[,:][0-9a-fA-F]+,")
"""MindSpore's C++ (``DISTRIBUTED(pid,thread hex,...``, ``PIPELINE(...``) and Python
(``ME(pid:thread,...``) logs."""

Write = Callable[[str, int, bytes], None]
"""``write_rank_line(label, attempt, line)`` of the console (``launcher.run.output.Console``),
which shows ``[label] line`` and tags a line of an attempt that is over."""


def is_runtime_chatter(line: bytes) -> bool:
    """A MindSpore runtime log line below ERROR."""
    return _RUNTIME_LOG.match(line) is not None


def without_runtime_chatter(line: bytes) -> Optional[bytes]:
    """``line`` as the console shows it without MindSpore's chatter: None for a runtime log line
    below ERROR, the rank's own text for one with such a line glued to its end."""
    found = _RUNTIME_LOG.search(line)
    if found is None:
        return line
    own = line[:found.start()]
    return own if own.strip() else None


@dataclasses.dataclass
class _Pending:
    text: bytes
    since: float
    ranks: dict[int, str]
    """rank -> host"""
    attempt: int
    """The attempt of the ranks that printed it: lines of two attempts are never merged."""


class RankLines:
    """The console's view of rank lines: filtered, and merged when ``merge``; ``ranks`` is how
    many ranks the console shows (a line all of them printed leaves at once)."""

    def __init__(self, write: Write, ranks: int, merge: bool, runtime_logs: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self._ranks = ranks
        self._merge = merge and ranks > 1
        self._runtime_logs = runtime_logs
        self._clock = clock
        self._queue: list[_Pending] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def show(self, host: str, rank: int, line: bytes, attempt: int = 0) -> None:
        """One line of ``rank`` on ``host`` in ``attempt``, without its prefix."""
        if not self._runtime_logs:
            kept = without_runtime_chatter(line)
            if kept is None:
                return
            line = kept
        if not self._merge or self._closed:
            self._write(f"{host}:{rank}", attempt, line)
            return
        with self._lock:
            for pending in self._queue:
                if pending.text == line and rank not in pending.ranks \
                        and pending.attempt == attempt:
                    pending.ranks[rank] = host
                    break
            else:
                self._queue.append(_Pending(line, self._clock(), {rank: host}, attempt))
            self._flush_due(self._clock())
        self._start()

    def flush(self) -> None:
        """Show what waits now (an attempt ends: its lines go before the restart line)."""
        with self._lock:
            self._flush_due(float("inf"))

    def close(self) -> None:
        """Show what still waits; later lines are shown as they come."""
        with self._lock:
            self._closed = True
            self._flush_due(float("inf"))
        self._wake.set()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-merge", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(WINDOW / 5)
            with self._lock:
                self._flush_due(self._clock())

    def _flush_due(self, now: float) -> None:
        """Under the lock: show the queue's head while it is complete or has waited enough."""
        while self._queue:
            head = self._queue[0]
            if len(head.ranks) < self._ranks and now - head.since < WINDOW:
                return
            self._queue.pop(0)
            self._write(label(head.ranks), head.attempt, head.text)

