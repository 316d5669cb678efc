"""Events a rank reports to its launcher: JSON lines appended to ``$NPU_LAUNCH_EVENTS_FILE``.

Each line is one ``write()`` of a complete line on an ``O_APPEND`` descriptor, so a reader never
sees half an event. Outside npu-launch (no variable set) ``emit`` does nothing.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Optional

from parallel import contract

_fd: Optional[int] = None
_path: Optional[str] = None


def emit(event: str, **fields: Any) -> None:
    """Append ``{"event", "rank", "host", "pid", "time", **fields}`` to this rank's events file
    (nothing from a process the rank forked: ``in_the_rank``)."""
    fd = _events_fd()
    if fd is None or not in_the_rank():
        return
    record = {"event": event, "rank": _rank(), "host": _host(), "pid": os.getpid(),
              "time": time.time(), **fields}
    os.write(fd, (json.dumps(record, default=str) + "\n").encode())


def in_the_rank() -> bool:
    """Whether this process is the rank npu-launch started (or what it exec'd into), not one the
    rank started or forked (``contract.RANK_PID``, set by the rank hook)."""
    pid = os.environ.get(contract.RANK_PID)
    return pid is None or pid == str(os.getpid())


def _events_fd() -> Optional[int]:
    global _fd, _path
    path = os.environ.get(contract.EVENTS_FILE)
    if not path:
        return None
    if _fd is None or path != _path:
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _path = path
    return _fd


def _rank() -> int:
    return contract.RankIdentity.from_environ(os.environ).rank


def _host() -> str:
    return os.environ.get(contract.HOST) or socket.gethostname()
