"""Standard output that may be closed (``>&-``), full (``>/dev/full``) or a pipe nobody reads.

What a command prints as its answer (a ``--dry-run`` plan, ``rank-table show``, ``-o -``) and
cannot write is one error line, exit code 2, as an unwritable ``-o FILE`` is. A launch only
copies rank lines there: it goes on without them (``launcher.run.output.Console``).
"""
from __future__ import annotations

import os
import sys
from typing import TextIO

from launcher.errors import ConfigError
from launcher.run.output import quiet_at_exit


def hold_standard_fds() -> None:
    """Open /dev/null on descriptors 0-2 where they are closed: a file opened later would get
    the number, and a subprocess that inherits it would write into that file (a log, the lock).
    A closed stderr then takes messages nobody can read; ``sys.stdout`` stays ``None``, so
    ``print_out`` can say it is closed."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` itself
            if held != fd:
                os.dup2(held, fd)
                os.close(held)
            os.set_inheritable(fd, True)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)


def print_out(text: str, what: str) -> None:
    """Write ``text`` to standard output, or refuse naming ``what`` ("the plan")."""
    stream = sys.stdout
    if stream is None:
        raise ConfigError(f"cannot write {what} to standard output: it is closed")
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError) as e:  # ValueError: a closed file object
        quiet_at_exit(stream)
        raise ConfigError(f"cannot write {what} to standard output: "
                          f"{getattr(e, 'strerror', None) or e}") from None


def console_stream() -> TextIO:
    """Where a launch's console goes: standard output, or /dev/null when it is closed (said
    once on stderr: the rank lines are only in the rank logs then)."""
    if sys.stdout is not None:
        return sys.stdout
    if sys.stderr is not None:
        sys.stderr.write("npu-launch: cannot write rank lines to standard output (it is closed); "
                         "they go to the rank logs only\n")
    return open(os.devnull, "w")  # open for the whole launch, as standard output is

