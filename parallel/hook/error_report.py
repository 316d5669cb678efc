"""A rank's uncaught exception, reported to the launcher by the rank hook (``parallel.hook.rank_hook``):
``{rank, host, pid, exception, message, traceback, timestamp}`` as JSON in
``$NPU_LAUNCH_ERROR_FILE``, written atomically, after Python printed the traceback. Standard
library only."""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from types import TracebackType
from typing import Any, Callable, Optional, Type

from parallel import contract, events

ExceptHook = Callable[[Type[BaseException], BaseException, Optional[TracebackType]], Any]


def reporting_excepthook(previous: ExceptHook, path: str) -> ExceptHook:
    def hook(exc_type: Type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> None:
        # Print first: the launcher stops the job as soon as the report exists, and the
        # traceback should be in the log by then.
        try:
            previous(exc_type, exc, tb)
        finally:
            sys.stderr.flush()
            write_error_report(path, exc_type, exc, tb)
    return hook


def report_uncaught() -> None:
    """At exit: the error report of an exception that escaped the script, if the excepthook did
    not write it (something replaced ``sys.excepthook`` after the hook was installed; Python
    keeps the exception in ``sys.last_value`` before it calls the hook)."""
    path = os.environ.get(contract.ERROR_FILE)
    exc = getattr(sys, "last_value", None)
    if not path or exc is None or os.path.exists(path):
        return
    try:
        write_error_report(path, type(exc), exc, exc.__traceback__)
    except OSError:
        pass


def write_error_report(path: str, exc_type: Type[BaseException], exc: BaseException,
                       tb: Optional[TracebackType]) -> None:
    """Write the report atomically, so the launcher never reads half of one (not from a process
    the rank forked: its exception is not the rank's)."""
    if not events.in_the_rank():
        return
    identity = contract.RankIdentity.from_environ(os.environ)
    report = {
        "rank": identity.rank,
        "host": os.environ.get(contract.HOST) or socket.gethostname(),
        "pid": os.getpid(),
        "exception": exc_type.__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc_type, exc, tb)),
        "timestamp": time.time(),
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, path)
