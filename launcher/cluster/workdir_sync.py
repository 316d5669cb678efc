"""``--sync-workdir``: copy the launch directory to the hosts that lack it or differ, over ssh.

Like Ray's ``working_dir``, for hosts that share no storage. Preflight names each host whose
launch directory is missing or whose files the job names are missing or different
(``HostCheck.stale``); when that is all that keeps the job from starting, the directory is made
into one tar archive here and unpacked by ``tar`` on each of those hosts, through the same kind
of ssh connection preflight uses, and then every host is asked again. Files there that are not
here are kept (as ``rsync`` without ``--delete``). Left out: the job's log directory and
``npu_launch_logs/`` when inside the launch directory. A launch directory over
``MAX_SYNC_BYTES`` or ``MAX_SYNC_ENTRIES`` is refused before any host is asked: this copies
code and configs, not datasets.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import stat
import subprocess
import tarfile
from typing import Callable, Iterator, Optional, Sequence, TextIO

from launcher.cluster.backends import TransportOptions
from launcher.cluster.backends.ssh import ssh_argv
from launcher.cluster.fanout import workers
from launcher.cluster.preflight import HostCheck
from launcher.config.hostfile import HostSelection, path_shown
from launcher.errors import LaunchError
from launcher.limits import MAX_PATH_BYTES, MAX_SYNC_BYTES, MAX_SYNC_ENTRIES, shown

_MIB = 1024 * 1024
SYNC_TIMEOUT = 300.0
LOG_ROOT = "npu_launch_logs"

_UNPACK = 'mkdir -p -- "$1" && cd -- "$1" && exec tar --no-same-owner -xf -'
"""What each host runs, fed the archive: the directory arrives as ``$1``, a word of data (quoted
by ``ssh_argv`` like every remote word), never part of this code."""


@dataclasses.dataclass(frozen=True)
class Tally:
    """What a copy holds: bytes of file content, and entries (files, directories, links)."""

    size: int = 0
    entries: int = 0

    def __str__(self) -> str:
        amount = f"{self.size / _MIB:.1f} MiB" if self.size >= _MIB else f"{self.size} bytes"
        return f"{amount} in {self.entries} entries"


@dataclasses.dataclass(frozen=True)
class LaunchDir:
    """The launch directory (absolute) and the directories in it that are not copied."""

    path: str
    excluded: frozenset[str]

    @classmethod
    def of(cls, workdir: str, log_dir: Optional[str]) -> "LaunchDir":
        """``workdir`` without ``npu_launch_logs/`` and the job's ``log_dir`` (relative to
        ``workdir``, as the launch reads it) where they lie inside it."""
        path = os.path.abspath(workdir)
        excluded = {os.path.join(path, LOG_ROOT)}
        if log_dir:
            excluded.add(os.path.normpath(os.path.join(path, log_dir)))
        return cls(path, frozenset(excluded - {path}))

    def measure(self) -> Tally:
        """What a copy would hold; ``LaunchError`` as soon as it passes a cap."""
        tally = Tally()
        for _, info in self._capped():
            tally = Tally(tally.size + _content(info), tally.entries + 1)
        return tally

    def archive(self) -> tuple[bytes, Tally]:
        """The directory as an uncompressed tar archive (its entries relative to it), and what
        it holds."""
        buffer, tally = io.BytesIO(), Tally()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for relative, info in self._capped():
                try:
                    tar.add(os.path.join(self.path, relative), arcname=relative, recursive=False)
                except OSError as e:
                    raise LaunchError(f"--sync-workdir: cannot read {path_shown(relative)} in "
                                      f"{path_shown(self.path)}: {e.strerror or e}") from None
                tally = Tally(tally.size + _content(info), tally.entries + 1)
        return buffer.getvalue(), tally

    def _capped(self) -> Iterator[tuple[str, os.stat_result]]:
        size = entries = 0
        for relative, info in self._entries():
            size, entries = size + _content(info), entries + 1
            if size > MAX_SYNC_BYTES:
                self._refuse(f"more than {MAX_SYNC_BYTES // _MIB} MiB")
            if entries > MAX_SYNC_ENTRIES:
                self._refuse(f"more than {MAX_SYNC_ENTRIES} files and directories")
            yield relative, info

    def _refuse(self, what: str) -> None:
        raise LaunchError(f"--sync-workdir: the launch directory {path_shown(self.path)} holds "
                          f"{what}, the most it copies (log directories left out): put data on "
                          "shared storage or outside it, or copy the directory yourself")

    def _entries(self) -> Iterator[tuple[str, os.stat_result]]:
        """Every entry to copy, relative, each directory before what it holds; links are not
        followed."""
        pending = [""]
        while pending:
            folder = pending.pop()
            for name in self._names_in(folder):
                relative = os.path.join(folder, name)
                if os.path.join(self.path, relative) in self.excluded:
                    continue
                info = self._lstat(relative)
                yield relative, info
                if stat.S_ISDIR(info.st_mode):
                    pending.append(relative)

    def _lstat(self, relative: str) -> os.stat_result:
        """An entry's own status; a path longer than the kernel takes (PATH_MAX: it can be
        made step by step, but neither opened by a rank nor unpacked by ``tar``) is refused."""
        path = os.path.join(self.path, relative)
        size = len(os.fsencode(path))
        if size > MAX_PATH_BYTES:
            raise LaunchError(f"--sync-workdir: {path_shown(relative)} in "
                              f"{path_shown(self.path)}: a path of {size} bytes; the system "
                              f"takes at most {MAX_PATH_BYTES}: shorten or move it")
        try:
            return os.lstat(path)
        except OSError as e:
            raise LaunchError(f"--sync-workdir: cannot read {path_shown(relative)} in "
                              f"{path_shown(self.path)}: {e.strerror or e}") from None

    def _names_in(self, folder: str) -> list[str]:
        try:
            return sorted(os.listdir(os.path.join(self.path, folder)))
        except OSError as e:
            raise LaunchError(f"--sync-workdir: cannot read {path_shown(folder or '.')} in "
                              f"{path_shown(self.path)}: {e.strerror or e}") from None


def _content(info: os.stat_result) -> int:
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def unpack_argv(host: HostSelection, path: str, options: TransportOptions) -> list[str]:
    """``ssh`` to ``host`` unpacking a tar archive on its stdin into ``path``, made if
    missing. Every word goes through ``ssh_argv``'s quoting; ``path`` is one of them."""
    remote = ["sh", "-c", _UNPACK, "npu-launch-sync", path]
    return ssh_argv(host.host, host.user, remote, "/", options)


def copy_launch_dir(source: LaunchDir, hosts: Sequence[HostSelection],
                    options: TransportOptions) -> Tally:
    """Unpack one archive of ``source`` on every host, ``options.fanout`` at once;
    ``LaunchError`` naming each host where that failed. Returns what was copied."""
    archive, tally = source.archive()

    def copy(host: HostSelection) -> Optional[str]:
        return _copy_to(host, source.path, archive, options)

    with concurrent.futures.ThreadPoolExecutor(workers(options.fanout, len(hosts))) as pool:
        failures = [failure for failure in pool.map(copy, hosts) if failure]
    if failures:
        raise LaunchError(f"--sync-workdir: copying {path_shown(source.path)} failed on "
                          f"{'; '.join(failures)}: nothing was started")
    return tally


def _copy_to(host: HostSelection, path: str, archive: bytes,
             options: TransportOptions) -> Optional[str]:
    try:
        out = subprocess.run(unpack_argv(host, path, options), input=archive,
                             capture_output=True, timeout=SYNC_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"{host.host} (no end in {SYNC_TIMEOUT:g} s)"
    if out.returncode == 0:
        return None
    lines = [line for line in out.stderr.decode(errors="replace").splitlines() if line.strip()]
    return f"{host.host} (exit {out.returncode}: {shown(lines[-1] if lines else '')})"


def sync_stale_hosts(source: LaunchDir, hosts: Sequence[HostSelection],
                     checks: list[HostCheck], options: TransportOptions,
                     recheck: Callable[[], list[HostCheck]], err: TextIO,
                     dry_run: bool = False) -> list[HostCheck]:
    """The checks once the launch directory is copied to every ``stale`` host, asked again
    (``recheck``). Nothing is copied when nothing is stale, or when a host fails for another
    reason (the job could not start anyway); with ``dry_run`` nothing either: it says where
    the copy would go and judges the hosts as if it had."""
    stale = [host for host, check in zip(hosts, checks) if check.stale is not None]
    if not stale or any(p != c.stale for c in checks for p in c.problems):
        return checks
    names = ", ".join(host.host for host in stale)
    if dry_run:
        err.write(f"npu-launch: --sync-workdir: would copy {path_shown(source.path)} to "
                  f"{names} (--dry-run copies nothing)\n")
        return [check.assuming_copied() for check in checks]
    tally = copy_launch_dir(source, stale, options)
    err.write(f"npu-launch: --sync-workdir: copied {path_shown(source.path)} ({tally}) to "
              f"{names}\n")
    return recheck()
