"""The bounds on what npu-launch accepts, and the helpers that apply them.

Every input a user (or a hostile file) can make large has a bound here, so a typo or a
``/dev/zero`` gets one line instead of an allocation without end. The README's "How a job
ends" table lists them; keep the two in step.
"""
from __future__ import annotations

import errno
import os
import re
import select
import shlex
import stat
from typing import Optional

from launcher.errors import ConfigError
from parallel.contract import MAX_SHOWN, shown

__all__ = ["MAX_SHOWN", "shown"]  # re-exported: the host side takes its bounds from here

MAX_RANKS_PER_NODE = 64
"""``--cards`` and hostfile ``slots``: an Ascend server holds 8 or 16 cards; CPU ranks on one
host past this are a typo, not a job."""
MAX_NODES = 1024
"""Hosts in a hostfile, Slurm allocation or ``--nnodes``."""
MAX_DEVICE_ID = 15
"""Physical card ids: ``/dev/davinci0`` .. ``/dev/davinci15``."""
MAX_FILE_BYTES = 1 << 20
"""A hostfile, job config or env file: a page of text."""
MAX_RANK_TABLE_BYTES = 16 << 20
"""An HCCL rank table: about 150 bytes per device, so room for tens of thousands of cards."""
MAX_JSON_DEPTH = 32
"""Nesting of a rank table or summary; the real formats need 6."""
MAX_TIMEOUT = 7 * 24 * 3600.0
"""Seconds: the longest timeout that is not a typo (a week)."""
MAX_RESTARTS = 1000

_WHOLE = re.compile(r"[0-9]{1,12}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""An environment variable a user may name: ASCII, as POSIX shells accept."""


def whole_number(text: str) -> Optional[int]:
    """``text`` as a non-negative integer written in ASCII digits, else None.

    ``str.isdigit`` accepts ``'²'`` and ``int`` accepts ``'١٢'`` and 4,300 digits; neither is
    a number a user means here.
    """
    return int(text) if _WHOLE.fullmatch(text) else None


def read_bounded_text(path: str, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of ``path``, refused past ``limit`` bytes (``/dev/zero`` is a file too)
    or when it is no text; errors name ``what`` and the path, or ``path:line``."""
    try:
        data = read_at_most(path, limit + 1)
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror}") from None
    except ValueError:  # a NUL byte in the path
        raise ConfigError(f"{what} {path!r}: not a path") from None
    if len(data) > limit:
        raise ConfigError(f"{what} {path}: larger than {limit // 1024} KiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text") from None


PIPE_WAIT = 30.0
"""Seconds a pipe (``--rank-table <(...)``) may stay silent before its read is given up."""


def read_at_most(path: str, size: int) -> bytes:
    """Up to ``size`` bytes of ``path``, never waiting without end: a FIFO nobody writes to
    reads as empty, and one whose writer goes silent for ``PIPE_WAIT`` seconds is an error."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISFIFO(mode):
            os.set_blocking(fd, True)
        return _read_fd(fd, size)
    finally:
        os.close(fd)


def _read_fd(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        try:
            chunk = os.read(fd, min(left, 1 << 16))
        except BlockingIOError:  # a pipe with a writer and nothing written yet
            if not select.select([fd], [], [], PIPE_WAIT)[0]:
                raise OSError(errno.ETIMEDOUT, f"a pipe silent for {PIPE_WAIT:.0f} s") from None
            continue
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


MAX_WORDS_CHARS = 4096
"""One ``--ssh-option`` or ``--launcher-args`` value: ``shlex`` is quadratic in a quoted
word's length, so 5 MB would take minutes."""


def shell_words(option: str, text: str) -> tuple[str, ...]:
    """The words of an option's value, split as a shell would (``-F "a b"``); an unbalanced
    quote, a NUL or a value past ``MAX_WORDS_CHARS`` is a ``ConfigError`` naming ``option``."""
    if len(text) > MAX_WORDS_CHARS:
        raise ConfigError(f"{option} {shown(text)}: longer than {MAX_WORDS_CHARS} characters")
    if "\0" in text:
        raise ConfigError(f"{option} {shown(text)}: contains a NUL character")
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise ConfigError(f"{option} {shown(text)}: {e} (quote it as in a shell)") from None
