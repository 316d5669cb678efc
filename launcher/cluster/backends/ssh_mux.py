"""One ssh handshake per host: an OpenSSH control master that preflight opens and every later
ssh to that host (the probe, the node agent, a card re-check before a restart) rides on.

Each master is a child of this launcher, in a session of its own: ``sh -c 'ssh "$@"; rm -rf
DIR'`` around ``ssh -o ControlMaster=yes -o ControlPersist=no HOST 'exec cat >/dev/null'``,
its stdin a pipe held here, its socket in a private directory of its own (0700,
``tempfile.mkdtemp`` under ``$TMPDIR``: a socket path must stay under about 100 bytes).
Clients say ``ControlMaster=no`` with the same ``ControlPath``: with no socket (no master, or
it died) OpenSSH connects on its own, as before. How it ends, whatever ends the launcher (even
SIGKILL): the pipe closes (``close``, or the launcher's death), the remote ``cat`` reads EOF,
the master exits once the last session riding on it has ended, and its ``sh`` removes the
directory. ``close`` waits for that, then signals what is left of its own process group.
"""
from __future__ import annotations

import dataclasses
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import IO, Optional, Sequence

from launcher.cluster.backends.common import split_ssh_options

CONNECT_TIMEOUT_S = 10
"""ssh's ``ConnectTimeout`` for every connection npu-launch makes."""
CLOSE_WAIT_S = 5.0


def ssh_base(port: Optional[int], ssh_options: Sequence[str],
             ours: Sequence[str] = ()) -> list[str]:
    """``ssh`` and the options every connection gets: BatchMode, the connect timeout, ``ours``,
    the port, then the user's ``--ssh-option`` words (ssh keeps the first value it is given of
    an option: ours win)."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", *ours]
    if port is not None:
        argv += ["-p", str(port)]
    return argv + list(split_ssh_options(ssh_options))


def destination(host: str, user: Optional[str]) -> str:
    return f"{user}@{host}" if user else host


@dataclasses.dataclass(frozen=True)
class FirstSession:
    """What the command of a master's own session did: its exit status (None: no end within
    the time given), its output, and what the ssh and the command said on stderr."""

    returncode: Optional[int]
    stdout: str
    stderr: str


@dataclasses.dataclass
class _Master:
    process: subprocess.Popen
    stderr: IO[str]
    directory: str

    def release_output(self) -> None:
        """Its first session is read: node 0 keeps no more of its output (the master writes
        none: its session's ``cat`` goes to /dev/null, its own messages to its copy of the
        file)."""
        self.stderr.close()
        if self.process.stdout is not None:
            self.process.stdout.close()


_EXIT_MARK = "npl-first-session-exit:"
"""What the master's session prints after its command, with the command's exit status."""

_WRAPPER = 'ssh "$@"; status=$?; rm -rf -- "$0"; exit $status'
"""The master's ssh, then its directory removed: by the master's own shell, so that it goes
even when the launcher was killed."""


class SshMasters:
    """The control masters of one launch, one per host, opened on first use (``open``) and
    all closed by ``close`` (or leaving the ``with`` block)."""

    def __init__(self) -> None:
        self._paths: dict[str, str] = {}
        self._masters: dict[str, _Master] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> "SshMasters":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path_for(self, host: str, user: Optional[str], port: Optional[int]) -> Optional[str]:
        """The control socket for this destination (None: no master was opened for it)."""
        return self._paths.get(_key(host, user, port))

    def open(self, host: str, user: Optional[str], port: Optional[int],
             ssh_options: Sequence[str], command: str, timeout: float) -> Optional[FirstSession]:
        """Connect a master to ``host`` whose own session runs ``command`` (a remote shell
        line: preflight's probe) before it waits on its pipe; ``command``'s outcome, read until
        its end marker (at most ``timeout`` s). None: this host has a master already (run the
        command as a client of it), or the launch is ending."""
        key = self._start(host, user, port, ssh_options, command)
        if key is None:
            return None
        master = self._masters[key]
        deadline = time.monotonic() + timeout
        out = _read_until(master.process, _EXIT_MARK, deadline)
        text, mark, rest = (out or "").rpartition(_EXIT_MARK)
        # The command's stderr comes on a channel of its own, which may lag its stdout: its
        # mark there says all of it is in.
        said = _text_until(master.stderr, _EXIT_MARK if mark else None, deadline)
        said = said.rpartition(f"\n{_EXIT_MARK}")[0] if _EXIT_MARK in said else said
        master.release_output()  # one descriptor per host stays: the pipe to its stdin
        if out is None:
            return FirstSession(None, "", said)
        if not mark:  # the master ended before the command did: ssh's own failure
            return FirstSession(master.process.wait(), out, said)
        return FirstSession(int(rest.split()[0]) if rest.split() else 1,
                            text.removesuffix("\n"), said)

    def _start(self, host: str, user: Optional[str], port: Optional[int],
               ssh_options: Sequence[str], command: str) -> Optional[str]:
        key = _key(host, user, port)
        with self._lock:
            if self._closed or key in self._masters:
                return None
            directory = tempfile.mkdtemp(prefix="npl-ssh-")  # 0700
            path = os.path.join(directory, "master")
            ours = ["-o", "ControlMaster=yes", "-o", f"ControlPath={path}",
                    "-o", "ControlPersist=no"]
            remote = (f"{command}; s=$?; printf '\\n{_EXIT_MARK}%d\\n' \"$s\"; "
                      f"printf '\\n{_EXIT_MARK}%d\\n' \"$s\" >&2; exec cat >/dev/null")
            argv = ["sh", "-c", _WRAPPER, directory] + ssh_base(port, ssh_options, ours)[1:] + [
                "--", destination(host, user), remote]
            stderr = tempfile.TemporaryFile("w+")  # unlinked already: nothing to leave behind
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=stderr, start_new_session=True)
            self._masters[key] = _Master(process, stderr, directory)
            self._paths[key] = path
            return key

    @property
    def opened(self) -> int:
        """Masters started so far."""
        return len(self._masters)

    def close(self) -> None:
        """End every master: its pipe closed, then (after ``CLOSE_WAIT_S`` in all) SIGTERM,
        SIGKILL to its process group; its directory goes. Idempotent."""
        with self._lock:
            self._closed = True
            masters = list(self._masters.values())
            self._masters.clear()
            self._paths.clear()
        for master in masters:
            if master.process.stdin is not None:
                try:
                    master.process.stdin.close()
                except OSError:
                    pass
        deadline = time.monotonic() + CLOSE_WAIT_S
        for master in masters:
            _end(master.process, deadline)
            master.stderr.close()
            shutil.rmtree(master.directory, ignore_errors=True)


def _key(host: str, user: Optional[str], port: Optional[int]) -> str:
    return f"{user or ''}@{host}:{port or ''}"


def _end(process: subprocess.Popen, deadline: float) -> None:
    """Wait for the master to end by itself until ``deadline``, then signal its process group
    (its own session: the ``sh`` and its ``ssh``, nothing else)."""
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and process.poll() is None:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()) if sig is None else 2.0)
            return
        except subprocess.TimeoutExpired:
            continue


def _read_until(process: subprocess.Popen, mark: str, deadline: float) -> Optional[str]:
    """The process's output up to the line after ``mark``, or all of it if it ends first;
    None when neither happens by ``deadline``."""
    if process.stdout is None:
        return None
    fd = process.stdout.fileno()
    data = b""
    while True:
        text = data.decode(errors="replace")
        at = text.find(mark)
        if at >= 0 and "\n" in text[at:]:
            return text
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return text
        data += chunk


def _text(stderr: IO[str]) -> str:
    """What the master wrote to ``stderr`` so far. Read with ``pread``: the master's ssh writes
    at the file offset it shares with this descriptor, so a seek here would make its next
    message overwrite the beginning of what it said."""
    fd = stderr.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def _text_until(stderr: IO[str], mark: Optional[str], deadline: float) -> str:
    """What the master wrote to ``stderr`` so far, once it holds ``mark`` (None: now), or at
    ``deadline``."""
    while True:
        text = _text(stderr)
        if mark is None or mark in text or time.monotonic() >= deadline:
            return text
        time.sleep(0.01)
