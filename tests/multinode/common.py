"""What every part of the fake cluster shares: where its state lives, its errors, running the
system tools (``ip``, ``ssh-keygen`` ...) and waiting for daemons."""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Iterator

from polling import wait_for

STATE_ROOT = Path("/run/npl-clusters")
NAME_PREFIX = "npl-"
TAG_RE = re.compile(r"^[a-z0-9]{1,8}$")  # 8: interface names are limited to 15 characters

HOST_BINARIES = ("ip", "nsenter", "unshare", "mount", "tar", "ps")
SSH_BINARIES = HOST_BINARIES + ("sshd", "ssh", "ssh-keygen")
SLURM_BINARIES = HOST_BINARIES + ("munged", "slurmctld", "slurmd", "srun", "sinfo")


class ClusterError(RuntimeError):
    """Setting up or using the fake cluster failed."""


class ClusterUnavailable(ClusterError):
    """This machine cannot host fake clusters at all (not root, no namespaces, binaries missing)."""


def missing_binaries(binaries: Iterable[str]) -> list[str]:
    """The binaries of ``binaries`` that neither PATH nor the sbin dirs hold."""
    return [b for b in binaries if shutil.which(b, path=sbin_path()) is None]


def need_binaries(binaries: Iterable[str]) -> None:
    """Raise ``ClusterUnavailable`` naming the missing ones, if any is."""
    missing = missing_binaries(binaries)
    if missing:
        raise ClusterUnavailable(f"missing binaries: {' '.join(missing)} (run .ci/install-system-deps)")


FAKE_ASCEND_DIR = "/tmp/npl-ascend"
"""A host's fake Ascend driver: ``bin`` (tools), ``dev`` (device nodes), ``faults``; under the
host's own ``/tmp`` (see ``ascend.py``)."""


def sbin_path() -> str:
    """The caller's PATH with the sbin dirs appended (sshd, slurmd and ip live there)."""
    parts = os.environ.get("PATH", "").split(os.pathsep)
    extra = [p for p in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
             if p not in parts]
    return os.pathsep.join([p for p in parts if p] + extra)


def run_checked(argv: list[str]) -> None:
    """Run a system tool; ``ClusterError`` with its stderr when it fails."""
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError(f"{shlex.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on path (between processes; not re-entrant within one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def free_port(address: str) -> int:
    """A TCP port nothing listens on at address right now."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_for_port(address: str, port: int, timeout: float, alive_check: Callable[[], None]) -> None:
    """Until address:port accepts a connection; ``alive_check`` raises once its daemon died."""
    def accepting() -> bool:
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            return False
    wait_for(accepting, f"{address}:{port} accepting", timeout, every=0.1, check=alive_check,
             failure=ClusterError)


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a daemon's log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
