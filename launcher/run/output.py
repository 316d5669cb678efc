"""Rank output: the raw bytes to each rank's log file, whole lines to the console.

One thread per process reads its merged stdout/stderr pipe. The log file gets every byte as the
rank wrote it (progress bars with ``\\r`` included). The console gets ``[host:rank] line`` written
in one call under a lock, so lines of different ranks never interleave mid-line. Text without a
newline (a progress bar, a prompt) is shown once it has sat unchanged for a moment, and a
carriage-return-rewritten line shows its latest state, at most once a second.

Attempts: every rank line carries the attempt (``NPU_LAUNCH_RESTART``) whose process printed it.
Once the console is told a restart begins (``Console.begin_attempt``, just before the launcher
prints ``restart K of N``), a line of an earlier attempt, which a pump still behind on a
dying rank's last output may show later, says so: ``[vm:1 attempt 0] line``. In the rank's log,
each attempt's output after the first begins below a line of its own (``attempt_mark``).
"""
from __future__ import annotations

import os
import select
import sys
import threading
import time
from typing import IO, Any, BinaryIO, Callable, Optional, Protocol

LineSink = Callable[[bytes], None]


class RankLinesView(Protocol):
    """``launcher.run.console_lines.RankLines`` as the console uses it."""

    def show(self, host: str, rank: int, line: bytes, attempt: int = 0) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

_READ_SIZE = 65536
_PARTIAL_LINE_DELAY = 1.0
CONSOLE_LINE_MAX = 64 << 10
"""Bytes of one line the console shows; the rank's log keeps all of it. A line of 100 MB was
copied whole at every read (quadratic: 97 s for one such line) and shown again each second."""


class Console:
    """The launcher's stdout, shared by every pump. Once given a view of rank lines (node 0's
    console: ``launcher.run.console_lines.RankLines``, writing through ``write_line``), rank lines are
    filtered and merged on their way."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._rank_lines: Optional[RankLinesView] = None
        self._lost = False
        self._attempt = 0
        """The attempt whose lines go without saying so; an earlier one's are tagged."""

    def show_rank_lines(self, view: "RankLinesView") -> None:
        self._rank_lines = view

    def rank_sink(self, host: str, rank: int, attempt: int = 0) -> LineSink:
        """Where the lines of ``rank`` in ``attempt`` go to be shown as ``[host:rank] line``."""
        if self._rank_lines is None:
            return self.sink(f"{host}:{rank}", attempt)
        view = self._rank_lines
        return lambda line: view.show(host, rank, line, attempt)

    def rank_line(self, host: str, rank: int, line: bytes, attempt: int = 0) -> None:
        """One line of a rank that reached node 0 already split off its ``[host:rank]``."""
        if self._rank_lines is None:
            self.write_rank_line(f"{host}:{rank}", attempt, line)
        else:
            self._rank_lines.show(host, rank, line, attempt)

    def begin_attempt(self, attempt: int) -> None:
        """Before the launcher says ``restart K of N``: the lines waiting to be merged are shown
        (they are the ending attempt's), and from now on any line of an attempt before
        ``attempt`` says which it is from (``write_rank_line``). The old processes' pumps were
        joined as their group closed, for a bounded time; what they show later is tagged."""
        if self._rank_lines is not None:
            self._rank_lines.flush()
        with self._lock:
            self._attempt = attempt

    def close(self) -> None:
        """Show whatever rank lines still wait to be merged."""
        if self._rank_lines is not None:
            self._rank_lines.close()

    def write_rank_line(self, label: str, attempt: int, line: bytes) -> None:
        """``[label] line``, or ``[label attempt K] line`` when attempt K is over (a restart
        began since): the check and the write under one lock, so a line shown after the
        restart line is always tagged."""
        with self._lock:
            tag = f" attempt {attempt}" if attempt < self._attempt else ""
            self._write(f"[{label}{tag}] ".encode(), line)

    def write_line(self, prefix: bytes, line: bytes) -> None:
        with self._lock:
            self._write(prefix, line)

    def _write(self, prefix: bytes, line: bytes) -> None:
        """Under the lock."""
        if self._lost:
            return
        try:
            self._stream.write(prefix + line + b"\n")
            self._stream.flush()
        except (OSError, ValueError) as e:  # a full disk, a closed pipe or a closed file
            self._give_up(e)

    def _give_up(self, error: Exception) -> None:
        """Under the lock: stop writing to a console that cannot take lines. The job goes on;
        the pumps keep writing every rank's log file, so nothing but the console copy is lost."""
        self._lost = True
        why = getattr(error, "strerror", None) or str(error)
        quiet_at_exit(self._stream)
        try:
            sys.stderr.write(f"npu-launch: cannot write rank lines to standard output ({why}); "
                             "they go to the rank logs only\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # stderr is gone too: nobody to tell
            pass

    def sink(self, label: str, attempt: int = 0) -> LineSink:
        """Where the lines of a process of ``attempt`` go to be shown as ``[label] line``."""
        return lambda line: self.write_rank_line(label, attempt, line)


class Pump(threading.Thread):
    """Copies one process's output to its log file and each whole line to ``on_line``."""

    def __init__(self, fd: int, log_path: str, label: str, on_line: Optional[LineSink]) -> None:
        super().__init__(name=f"pump {label}", daemon=True)
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._log = open(log_path, "ab", buffering=0)
        self._on_line = on_line
        self._pending = bytearray()
        """The line not ended yet, at most ``CONSOLE_LINE_MAX`` of it (its latest ``\\r`` state)."""
        self._left_out = 0
        """Bytes of that line past ``CONSOLE_LINE_MAX``, left out of the console."""
        self._shown_pending = b""
        self._pending_since = 0.0

    def run(self) -> None:
        try:
            while self._pump_once():
                pass
            self._flush_pending()
        finally:
            self._log.close()
            os.close(self._fd)

    def _pump_once(self) -> bool:
        # poll, not select: node 0 of a job of some hundred hosts holds descriptors past
        # select's FD_SETSIZE (1024).
        if not self._poll.poll(_PARTIAL_LINE_DELAY * 1000):
            self._show_pending()
            return True
        try:
            chunk = os.read(self._fd, _READ_SIZE)
        except OSError:
            return False
        if not chunk:
            return False
        self._log.write(chunk)
        if self._on_line is not None:
            self._split_lines(chunk)
            if time.monotonic() - self._pending_since >= _PARTIAL_LINE_DELAY:
                self._show_pending()
        return True

    def _split_lines(self, chunk: bytes) -> None:
        on_line = self._on_line
        if on_line is None:
            return
        had_pending = bool(self._pending)
        if b"\n" not in chunk:  # the line goes on: appended, never copied whole again
            self._pending += chunk
            self._bound_pending()
            if not had_pending:
                self._pending_since = time.monotonic()
            return
        first, *lines, rest = chunk.split(b"\n")
        self._pending += first
        self._bound_pending()
        on_line(self._pending_line())
        for line in lines:
            on_line(_shown(_latest_state(line), 0))
        self._pending, self._left_out, self._shown_pending = bytearray(rest), 0, b""
        self._pending_since = time.monotonic()

    def _bound_pending(self) -> None:
        """Keep the line not ended yet within ``CONSOLE_LINE_MAX``: from its last ``\\r`` (a
        progress bar's latest state is all the console shows of it), else its start."""
        if len(self._pending) <= CONSOLE_LINE_MAX:
            return
        rewrite = self._pending.rfind(b"\r", 0, len(self._pending) - 1)
        if rewrite > 0:
            del self._pending[:rewrite]
            self._left_out = 0
        if len(self._pending) > CONSOLE_LINE_MAX:
            self._left_out += len(self._pending) - CONSOLE_LINE_MAX
            del self._pending[CONSOLE_LINE_MAX:]

    def _pending_line(self) -> bytes:
        return _shown(_latest_state(bytes(self._pending)), self._left_out)

    def _show_pending(self) -> None:
        if self._on_line is None or not self._pending:
            return
        line = self._pending_line()
        if line == self._shown_pending:
            return
        self._on_line(line)
        self._shown_pending = line
        self._pending_since = time.monotonic()

    def _flush_pending(self) -> None:
        if self._on_line is not None and self._pending:
            line = self._pending_line()
            if line != self._shown_pending:
                self._on_line(line)
        self._pending, self._left_out = bytearray(), 0


def _shown(line: bytes, left_out: int) -> bytes:
    """A rank's line as the console shows it: at most ``CONSOLE_LINE_MAX`` bytes of it."""
    left_out += max(0, len(line) - CONSOLE_LINE_MAX)
    if not left_out:
        return line
    return line[:CONSOLE_LINE_MAX] + f" ...({left_out} bytes more in the rank's log)".encode()


def quiet_at_exit(stream: IO[Any]) -> None:
    """Point a failed stream's file descriptor at /dev/null: Python flushes standard output
    once more at exit, and would print a traceback for the text the failed write left behind."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's BytesIO): no flush
        pass


ATTEMPT_MARK = b"==== npu-launch: job "
"""How the line that opens an attempt's output in a rank's log begins (``mark_attempt``)."""


def mark_attempt(log_path: str, job_id: str, attempt: int, now: float) -> None:
    """Open ``attempt``'s part of a rank's log that already holds output (an earlier attempt's,
    or an earlier launch's into the same log directory) with one line of its own, on a line of
    its own: ``==== npu-launch: job J, attempt 1 (restart 1), 2026-12-04 17:18:16 ====``.
    An empty or missing log gets none."""
    try:
        with open(log_path, "ab+") as f:  # appended as the pumps write: O_APPEND
            end = f.seek(0, os.SEEK_END)
            if end == 0:
                return
            f.seek(end - 1)
            ended = f.read(1) == b"\n"
            restart = f" (restart {attempt})" if attempt else ""
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            f.write((b"" if ended else b"\n") + ATTEMPT_MARK
                    + f"{job_id}, attempt {attempt}{restart}, {when} ====\n".encode())
    except OSError:  # no log yet, or none to be had: the pump says so when it opens it
        pass


def this_attempt(data: bytes) -> bytes:
    """What of a log's ``data`` follows its last attempt mark: the current attempt's output
    (all of ``data`` when it holds no mark)."""
    at = data.rfind(b"\n" + ATTEMPT_MARK)
    at = at + 1 if at >= 0 else (0 if data.startswith(ATTEMPT_MARK) else -1)
    if at < 0:
        return data
    end = data.find(b"\n", at)
    return b"" if end < 0 else data[end + 1:]


def _latest_state(line: bytes) -> bytes:
    """What a terminal would show for a line rewritten with ``\\r``."""
    line = line.rstrip(b"\r")
    return line.rsplit(b"\r", 1)[-1]


def tail(path: str, lines: int = 20, max_bytes: int = 65536) -> list[str]:
    """The last ``lines`` lines of a log file (each ``\\r``-rewrite collapsed), of the current
    attempt only (after the log's last ``mark_attempt`` line)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    data = this_attempt(data)
    text = [_latest_state(line).decode(errors="replace") for line in data.split(b"\n")]
    while text and not text[-1].strip():
        text.pop()
    return text[-lines:]
