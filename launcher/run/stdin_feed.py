"""A process's stdin pipe, written in order without ever blocking the writer.

A node agent's payload is the plan (zlib-compressed, still some hundred KB for a large job,
more than a pipe's 64 KiB), and ssh reads its stdin only once it has connected. Written from the
starter's thread, each agent's start waited for the previous agent's handshake, so the agents
connected one at a time. ``StdinFeed.put`` writes what the pipe takes at once and leaves the
rest to a thread that lives only while something is pending: an agent whose plan has gone
costs no thread.
"""
from __future__ import annotations

import os
import select
import threading

_CHUNK = 65536
_RECHECK = 0.1
"""Seconds a pending write waits for room before it looks whether the pipe is to be closed."""


class StdinFeed:
    """Writes to ``fd`` (a pipe's write end, owned from here on) in the order ``put``."""

    def __init__(self, fd: int, label: str) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._label = label
        self._pending = bytearray()
        self._closing = False
        self._closed = False
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, data: bytes) -> None:
        """Write ``data`` after what was put before (nothing once closing)."""
        with self._lock:
            if self._closing:
                return
            self._pending += data
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_all, daemon=True,
                                                name=f"stdin {self._label}")
                self._writer.start()

    def close(self) -> None:
        """End the pipe now, dropping what is not written yet (the process is being stopped:
        an agent still connecting takes that as the order to stop too); idempotent."""
        with self._lock:
            self._closing = True
            if self._writer is None:
                self._close_fd()

    def _write_all(self) -> None:
        poller = select.poll()  # not select: descriptors past 1024 on a large job's node 0
        poller.register(self._fd, select.POLLOUT)
        while self._write_some(poller):
            pass

    def _write_some(self, poller: select.poll) -> bool:
        """One chunk (or a bounded wait for room); False once nothing is left to do."""
        with self._lock:
            if self._closing or not self._pending:
                self._writer = None
                if self._closing:
                    self._close_fd()
                return False
            chunk = bytes(self._pending[:_CHUNK])
        if not poller.poll(_RECHECK * 1000):
            return True
        try:
            written = os.write(self._fd, chunk)
        except BlockingIOError:
            return True
        except OSError:  # the reader is gone (EPIPE): drop the rest; poll() says it ended
            with self._lock:
                self._pending.clear()
            return True
        with self._lock:
            del self._pending[:written]
        return True

    def _close_fd(self) -> None:
        """Under the lock, with no writer running."""
        if not self._closed:
            self._closed = True
            os.close(self._fd)
