"""One live job per log directory: an exclusive ``flock`` held for the whole launch.

Two launches that name the same job id (two CI pipelines passing ``--job-id nightly``) would
otherwise write into one log directory; the second is refused before it starts anything. The
lock is the kernel's, so it goes when the process holding it dies, however it dies: no stale
lock files to clean up.
"""
from __future__ import annotations

import fcntl
import os
import re
from typing import Optional

from launcher.errors import ConfigError

LOCK_NAME = ".npu_launch.lock"
_MSRUN_LOG = re.compile(r"scheduler\.log|worker_\d+\.log")
"""The logs msrun leaves in its ``--log_dir``."""


def check_log_dir(log_dir: str) -> None:
    """Refuse, before anything starts or is created, a log directory that cannot be made or
    written (one that is a file, lies under a file, or whose nearest existing folder is
    read-only or not ours to write), or an existing folder of other files (``--log-dir .``):
    npu-launch's files would replace the user's."""
    existing = log_dir
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    where = f"log directory {log_dir}"
    if not os.path.isdir(existing):
        what = "is a file" if existing == log_dir else f"lies under {existing}, a file"
        raise ConfigError(f"{where}: {what}, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        why = "is on a read-only file system" if read_only else "is not writable by this user"
        raise ConfigError(f"{where}: {existing} {why}")
    if existing == log_dir and not _ours_or_empty(log_dir):
        raise ConfigError(f"{where}: holds files that are no job's of npu-launch (no {LOCK_NAME}); "
                          "give a new or empty folder: plan.json, summary.json and the rank logs "
                          "would replace or join them")


def _ours_or_empty(folder: str) -> bool:
    """Whether ``folder`` is an earlier launch's log directory (its lock file stays: the same
    command resumes there) or holds nothing but a file system's ``lost+found`` and msrun's own
    logs (``npu-launch msrun --log_dir msrun_log`` after msrun ran there: npu-launch appends to
    a ``scheduler.log`` and writes ``rank_N.log``, never ``worker_N.log``). Looked at one entry
    at a time: ``--log-dir /`` must not list a whole tree to be refused."""
    if os.path.lexists(os.path.join(folder, LOCK_NAME)):
        return True
    try:
        with os.scandir(folder) as entries:
            return all(entry.name == "lost+found" or _MSRUN_LOG.fullmatch(entry.name)
                       for entry in entries)
    except OSError:
        return True  # unreadable: writing there fails with its own message


class LogDirLock:
    """Holds ``log_dir``'s lock from :meth:`acquire` until :meth:`release` (or process exit)."""

    def __init__(self, log_dir: str, job_id: str) -> None:
        self.path = os.path.join(log_dir, LOCK_NAME)
        self.job_id = job_id
        self._fd: Optional[int] = None

    def acquire(self) -> "LogDirLock":
        """Take the lock, or raise ``ConfigError`` naming the live job's pid."""
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except IsADirectoryError:
            raise ConfigError(f"log directory {os.path.dirname(self.path)}: {LOCK_NAME} is a "
                              "folder, not npu-launch's lock file") from None
        except OSError as exc:
            raise ConfigError(f"log directory {os.path.dirname(self.path)}: {exc.strerror}") \
                from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise ConfigError(
                f"job {self.job_id}: log directory {os.path.dirname(self.path)} is in use by a "
                f"live job (npu-launch pid {holder}); give this one another --job-id or "
                f"--log-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the lock go; idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    except OSError:
        return "?"
