"""The bounds on what npu-launch accepts, and the helpers that apply them.

Every input a user (or a hostile file) can make large has a bound here, so a typo or a
``/dev/zero`` gets one line instead of an allocation without end. ``docs/reference/bounds.md``
lists them; keep the two in step.
"""
from __future__ import annotations

import os
import re
import shlex
from typing import Iterable, Mapping, Sequence

from launcher.errors import ConfigError
from parallel.contract import MAX_SHOWN, shown
from rank_tables.bounded import (
    MAX_DEVICE_ID,
    MAX_FILE_BYTES,
    MAX_JSON_DEPTH,
    MAX_RANK_TABLE_BYTES,
    PIPE_WAIT,
    NotUtf8,
    read_at_most,
    utf8_text,
    whole_number,
)

# Re-exported: the host side takes every bound from here (the rank-table library, below the
# launcher, owns the ones it needs itself).
__all__ = ["MAX_SHOWN", "shown", "MAX_DEVICE_ID", "MAX_FILE_BYTES", "MAX_JSON_DEPTH",
           "MAX_RANK_TABLE_BYTES", "PIPE_WAIT", "NotUtf8", "read_at_most", "utf8_text",
           "whole_number"]

MAX_RANKS_PER_NODE = 64
"""``--cards`` and hostfile ``slots``: an Ascend server holds 8 or 16 cards; CPU ranks on one
host past this are a typo, not a job."""
MAX_NODES = 1024
"""Hosts in a hostfile, Slurm allocation or ``--nnodes``."""
MAX_TIMEOUT = 7 * 24 * 3600.0
"""Seconds: the longest timeout that is not a typo (a week)."""
MAX_RESTARTS = 1000
DEFAULT_FANOUT = 32
"""``--fanout``: ssh connections node 0 sets up at once (``launcher.cluster.fanout``)."""
MAX_FANOUT = MAX_NODES
MAX_CPU_ID = 8191
"""``--bind-cores``: the highest core number (Linux numbers at most 8192 CPUs, NR_CPUS)."""

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""An environment variable a user may name: ASCII, as POSIX shells accept."""


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
        return utf8_text(data)
    except NotUtf8 as e:
        raise ConfigError(f"{path}:{e.line}: not UTF-8 text") from None


MAX_HASHED_BYTES = 64 << 20
"""Preflight compares a launch file larger than this by its size alone (hashing it would hold
preflight up)."""
MAX_COMPARED_FILES = 16
"""Preflight compares the script and at most 15 of its arguments that name files."""
MAX_SYNC_BYTES = 100 << 20
"""The most file content ``--sync-workdir`` copies (log directories left out)."""
MAX_SYNC_ENTRIES = 10_000
"""The most files, directories and links ``--sync-workdir`` copies."""
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


MAX_ARG_STRLEN = 32 * 4096
"""Bytes in one argument or one ``NAME=value`` of a process's environment, its NUL included:
Linux refuses a longer one at ``execve`` (E2BIG), after the job would have started."""
EXEC_SHARE = 2
"""What the user's arguments and ``--env`` together may take of the kernel's ``ARG_MAX``:
half, the rest left to the environment the ranks inherit and npu-launch's own variables."""
MAX_PATH_BYTES = 4095
"""Bytes in a path the kernel takes (PATH_MAX, 4096 with the NUL)."""
MAX_NAME_BYTES = 255
"""Bytes in one file name (NAME_MAX)."""
MAX_COMPILED_BYTES = 256 << 10
"""A script larger than this is not compiled to check it is Python (only its first line is
read): compiling takes about 1 ms per KiB here (a 30 KiB trainer 10-15 ms, 1 MiB 0.85 s), and
the launch would wait for it."""


def check_exec_string(what: str, text: str) -> None:
    """Refuse an argument or environment entry longer than ``execve`` takes."""
    size = len(text.encode("utf-8", "surrogateescape"))
    if size + 1 > MAX_ARG_STRLEN:
        raise ConfigError(f"{what}: {size} bytes; a process takes at most {MAX_ARG_STRLEN - 1} "
                          "in one argument or variable (Linux's MAX_ARG_STRLEN)")


def arg_max() -> int:
    """The kernel's bound on a process's arguments and environment together, in bytes."""
    try:
        return max(os.sysconf("SC_ARG_MAX"), 1 << 17)
    except (ValueError, OSError):
        return 1 << 21


def check_exec_total(args: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> None:
    """Refuse script arguments and ``--env`` values that together leave the ranks too little of
    ``ARG_MAX`` (each string counts its pointer and NUL, as the kernel counts them)."""
    strings = [*args, *(f"{k}={v}" for k, v in env)]
    total = sum(len(s.encode("utf-8", "surrogateescape")) + 1 + 8 for s in strings)
    budget = arg_max() // EXEC_SHARE
    if total > budget:
        raise ConfigError(f"the script's arguments and --env values: {total} bytes together; "
                          f"at most {budget} (half of this system's ARG_MAX, "
                          f"{arg_max()}: the ranks' own environment needs the rest)")


def check_path_length(what: str, path: str) -> None:
    """Refuse a path the kernel would refuse (ENAMETOOLONG) where it is used."""
    data = path.encode("utf-8", "surrogateescape")
    if len(data) > MAX_PATH_BYTES:
        raise ConfigError(f"{what}: a path of {len(data)} bytes; the system takes at most "
                          f"{MAX_PATH_BYTES}")
    longest = max((len(part) for part in data.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        raise ConfigError(f"{what}: a name of {longest} bytes in the path; the system takes at "
                          f"most {MAX_NAME_BYTES} per name")


def _exec_bytes(text: str) -> int:
    """What one argument or ``NAME=value`` costs of ``ARG_MAX``: its bytes, its NUL, its pointer."""
    return len(text.encode("utf-8", "surrogateescape")) + 1 + 8


_EXEC_OVERHEAD = 256
"""What ``execve`` counts besides the plan's arguments and variables: the program's path (the
kernel copies it too) and the parent's pid, which the process group adds at the start."""


def check_exec_sizes(processes: Iterable[tuple[str, Sequence[str], Mapping[str, str]]],
                     inherited: Mapping[str, str]) -> None:
    """Refuse a job whose process (named, with its argv and its own variables over the
    ``inherited`` environment) would pass this system's ``ARG_MAX`` at ``execve``."""
    base = {k: _exec_bytes(f"{k}={v}") for k, v in inherited.items()}
    total_base, limit = sum(base.values()), arg_max() - _EXEC_OVERHEAD
    for name, argv, env in processes:
        size = total_base + sum(_exec_bytes(a) for a in argv) + sum(
            _exec_bytes(f"{k}={v}") - base.get(k, 0) for k, v in env.items())
        if size > limit:
            largest = sorted(set(inherited) | set(env), key=lambda k: -len(
                env.get(k, inherited.get(k, ""))))[:2]
            raise ConfigError(f"process {name}: its arguments and environment would take "
                              f"{size + _EXEC_OVERHEAD} bytes; this system's ARG_MAX is "
                              f"{limit + _EXEC_OVERHEAD} (largest variables: "
                              f"{', '.join(largest)}): pass large values through files")
