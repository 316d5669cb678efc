"""What makes a fake host a machine of its own beyond its network: hostname, files, processes.

Each host has one long-lived *init*: PID 1 of the host's own PID namespace, in the host's
network namespace and in its own UTS (hostname), IPC and mount namespaces. It is started as::

    nsenter --net=/run/netns/<host> unshare --uts --ipc --mount --propagation private \\
        --pid --fork --kill-child --mount-proc sh -c 'mount -t tmpfs ... /tmp; hostname <host>; exec init'

so the host has

* its own filesystem where jobs live: a fresh tmpfs on each of ``PRIVATE_DIRS`` (``/tmp``, which
  holds pytest's temporary directories and so every launch and log directory the tests use,
  ``/var/tmp`` and ``/dev/shm``). What one host writes there no other host and not the root
  namespace sees. Everything else (the Python, the installed packages, the repository, ``/etc``,
  the cluster's ssh and Slurm configuration under ``/run/npl-clusters``) stays shared, as on
  hosts built from one image, even where it lies under one of those directories (a checkout in
  ``/tmp``: ``shared_image_paths`` are bound back over the tmpfs). A job's directory gets onto a host by copying (``hostfiles.py``).
* its own process table: ``/proc`` is remounted for the PID namespace, so ``ps`` in a host lists
  that host's processes only, under the host's own pids, and ``kill`` reaches only them.
  When the init dies, the kernel kills every process of the host.

Everything started in a host (sshd, slurmd, ``run_on``/``popen_on``) enters all of those
namespaces through ``nsenter --target <init> --net --uts --ipc --mount --pid``; ssh sessions and
Slurm tasks are children of the host's sshd and slurmd and so live there too. nsenter forks
into the PID namespace and waits for its child, so a ``Popen`` of it is not the process itself:
``HostPopen`` signals the process from inside the host, by its pid there.
"""
from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import psutil
from polling import wait_for

from .common import ClusterError

PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
"""The directories every host has to itself, each a fresh tmpfs."""

_INIT = str(Path(__file__).with_name("host_init.py"))
_MOUNT_AND_RUN = r"""set -e; name=$1; n=$2; shift 2
# The image's own paths under a private directory (a checkout in /tmp, as CI may make) are
# bound aside first and back after the tmpfs covers them: hosts built from one image share it.
stage=$(mktemp -d /run/npl-keep.XXXXXX); i=0
for k in "$@"; do [ "$i" -lt "$n" ] || break; mkdir "$stage/$i"; mount --bind "$k" "$stage/$i"; i=$((i+1)); done
j=0
for d in "$@"; do [ "$j" -lt "$n" ] || mount -t tmpfs -o mode=1777 npl-host "$d"; j=$((j+1)); done
i=0
for k in "$@"; do [ "$i" -lt "$n" ] || break
  mkdir -p "$k"; mount --bind "$stage/$i" "$k"; umount "$stage/$i"; rmdir "$stage/$i"; i=$((i+1)); done
rmdir "$stage"
hostname "$name"; exec "$PYTHON_FOR_INIT" -I -S "$INIT_SCRIPT" "$name"
"""


def shared_image_paths() -> list[str]:
    """The repository and the Python, where they lie under a private directory: every host
    must still see them (the one image hosts are built from)."""
    repo = Path(__file__).resolve().parents[2]
    candidates = [repo, Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent]
    private = [Path(d) for d in PRIVATE_DIRS]
    kept: list[Path] = []
    for path in candidates:
        if any(path == d or d in path.parents for d in private) and \
                not any(k == path or k in path.parents for k in kept):
            kept = [k for k in kept if path not in k.parents] + [path]
    return [str(k) for k in kept]


@dataclasses.dataclass(frozen=True)
class HostInit:
    """The init of one host: ``pid`` as the root namespace sees it, ``started`` its create time."""

    host: str
    pid: int
    started: float


def start_init(name: str, netns: Path, env: dict[str, str], log: Path,
               timeout: float = 20) -> tuple[subprocess.Popen, HostInit]:
    """Start the host's init (see the module docstring) and wait until its mounts are made."""
    keep = shared_image_paths()
    argv = ["nsenter", f"--net={netns}", "--", "unshare", "--uts", "--ipc", "--mount",
            "--propagation", "private", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
            "sh", "-c", _MOUNT_AND_RUN, "sh", name, str(len(keep)), *keep, *PRIVATE_DIRS]
    env = {**env, "PYTHON_FOR_INIT": sys.executable, "INIT_SCRIPT": _INIT}
    with open(log, "ab") as err:
        # unshare stays in between and waits for the init (its only child).
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, start_new_session=True)
    line = proc.stdout.readline()
    proc.stdout.close()
    if line != b"up\n":
        proc.wait(timeout=10)
        raise ClusterError(f"the init of host {name} did not start (exit {proc.returncode}): "
                           f"{log.read_text(errors='replace')[-2000:]}")
    child = wait_for(lambda: _only_child(proc.pid), f"init of {name}", timeout, every=0.1,
                     failure=ClusterError)
    return proc, HostInit(name, child.pid, child.create_time())


def enter_argv(init: HostInit, cwd: Optional[str] = None) -> list[str]:
    """The command prefix that puts a process into the host, in ``cwd`` there (a path of the
    host's own filesystem, resolved after entering it). ``ClusterError`` once the host is down:
    never the namespaces of a later process that got the init's pid."""
    if not _is_running(init):
        raise ClusterError(f"host {init.host} is down (its init {init.pid} has exited)")
    argv = ["nsenter", f"--target={init.pid}", "--net", "--uts", "--ipc", "--mount", "--pid"]
    return argv + ([f"--wdns={cwd}"] if cwd is not None else []) + ["--"]


def pid_in_host(root_pid: int) -> int:
    """A process's pid as its host sees it (the last ``NSpid`` in the root's ``/proc``)."""
    for line in Path(f"/proc/{root_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise ClusterError(f"no NSpid for pid {root_pid}")


def entered_child(nsenter_pid: int, timeout: float = 10) -> psutil.Process:
    """The process nsenter forked into the host (nsenter itself stays outside and waits)."""
    return wait_for(lambda: _only_child(nsenter_pid), f"the child of nsenter {nsenter_pid}", timeout,
                    every=0.1, failure=ClusterError)


class HostPopen(subprocess.Popen):
    """A process started inside a host through nsenter. ``host_pid`` is its pid in the host;
    ``send_signal`` (so ``kill``, ``terminate``) runs ``kill`` inside the host, as a user there
    would: nsenter, the ``Popen``'s own process, does not pass signals on."""

    def __init__(self, argv: Sequence[str], *, host: str, init: HostInit, env: dict[str, str],
                 **kwargs: object) -> None:
        self.host = host
        self._init = init
        self._env = env
        self._host_pid: Optional[int] = None
        super().__init__(list(argv), env=env, **kwargs)

    @property
    def host_pid(self) -> int:
        """The pid as the host numbers it (looked up once, while the process runs)."""
        if self._host_pid is None:
            self._host_pid = pid_in_host(entered_child(self.pid).pid)
        return self._host_pid

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        name = signal.Signals(sig).name.removeprefix("SIG")
        try:
            argv = enter_argv(self._init) + ["kill", "-s", name, str(self.host_pid)]
        except (ClusterError, OSError):
            return  # it, or its whole host, ended before it could be looked up
        subprocess.run(argv, env=self._env, capture_output=True, timeout=30)


def _is_running(init: HostInit) -> bool:
    try:
        return abs(psutil.Process(init.pid).create_time() - init.started) < 0.01
    except psutil.NoSuchProcess:
        return False


def _only_child(pid: int) -> Optional[psutil.Process]:
    """The child of pid once it has one (and pid still runs), else None."""
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        raise ClusterError(f"process {pid} exited before its child could be found") from None
    return children[0] if children else None
