"""A launch's processes on one node, found by its token, and the guardian that ends them when
the launcher cannot.

Every process a launch starts, and whatever those start, carries the launch's secret token and
node rank in its environment (``contract.TOKEN``, ``contract.NODE_RANK``): ``job_processes``
finds them by that and nothing else (never by command name or job id, which another job may
share), and ``kill_job_strays`` ends them. ``ProcessGroup.close`` sweeps them as it closes.

A launcher killed by SIGKILL (or the OOM killer) closes nothing: its ranks die with it (the rank
hook's parent-death signal), but what they started (a helper server, a ``subprocess`` of the
script, a data worker that does not watch its parent) would run on. So each node's group starts
a ``Guardian`` with its first process: a small process in a session of its own, reading a pipe
whose other end only the launcher holds. The launcher kills it once its group is closed and
swept (its job is done then, and nothing waits on it); if the pipe ends first, the launcher
died, and the guardian sweeps the launch's processes on this node, three times, then exits. It
imports nothing until it sweeps: it starts beside the ranks, whose start it must not slow.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Mapping, Optional

if TYPE_CHECKING:
    import psutil

GUARDIAN_OF = "NPU_LAUNCH_GUARDIAN_OF"
"""The guardian's environment names the job it guards (not ``contract.JOB_ID``: it is none of
the job's processes), for whoever checks that a job left nothing behind."""
_SWEEPS = 3
"""Sweeps after the launcher died: a process forking as the first one ran is caught by the next."""
_SWEEP_GAP = 0.2


_PR_SET_CHILD_SUBREAPER = 36
_reaping = False


def become_subreaper() -> None:
    """Make this process (the ``npu-launch`` command, a node agent) the one that takes the
    orphans of whatever it starts: a process a rank started and left behind, which the kernel
    would give to init. A rank's child in a session of its own and with its environment cleared
    (a daemon) carries no token; this is how the teardown still finds it (``kill_orphans``).
    Linux only; elsewhere nothing changes."""
    global _reaping
    import ctypes

    try:
        _reaping = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _reaping = False


def kill_orphans(started: "set[int]", since: float) -> "list[psutil.Process]":
    """SIGKILL this subreaper's children that it did not start itself (``started``: its group's
    processes) and that began after ``since`` (the group's first start): what the ranks left.
    Not a spare of the next attempt (``launcher.run.spares``) nor a guardian, which this
    process started too. Nothing unless ``become_subreaper`` took effect."""
    if not _reaping:
        return []
    import psutil

    from parallel import contract

    killed = []
    for child in psutil.Process().children():
        if child.pid in started:
            continue
        try:
            if child.create_time() < since:
                continue
            env = child.environ()
            if contract.SPARE in env or GUARDIAN_OF in env:
                continue
            child.kill()
            killed.append(child)
        except psutil.ZombieProcess:
            killed.append(child)  # ended on its own: reaped with the others
        except psutil.Error:
            continue
    return killed


def kill_job_strays(token: str, node_rank: int) -> "list[psutil.Process]":
    """SIGKILL every process whose environment carries this launch's ``token`` and node rank;
    the ones signalled.

    The node rank matters where several "hosts" share one process table (containers, network
    namespaces): each node agent must sweep only its own node's processes.
    """
    import psutil

    killed = []
    for proc in job_processes(token, node_rank):
        try:
            proc.kill()
            killed.append(proc)
        except psutil.Error:
            pass
    return killed


def job_processes(token: str, node_rank: int) -> "list[psutil.Process]":
    """Processes (not this one) whose environment has this launch's token and node rank."""
    import psutil

    from parallel import contract

    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env: Mapping[str, str] = proc.environ()
            if env.get(contract.TOKEN) == token and env.get(contract.NODE_RANK) == str(node_rank):
                found.append(proc)
        except psutil.Error:
            continue
    return found


class Guardian:
    """The launcher's end of one node's guardian (see the module's docstring)."""

    def __init__(self, token: str, node_rank: int, job_id: str) -> None:
        from parallel import contract

        read_end, self._pipe = os.pipe()  # neither end is inherited by the ranks
        env = {k: v for k, v in os.environ.items() if k != contract.TOKEN}  # not its own prey
        tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
        try:
            self._proc: Optional[subprocess.Popen] = subprocess.Popen(
                [sys.executable, "-m", "launcher.run.strays"], stdin=read_end, cwd="/",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                env={**env, GUARDIAN_OF: job_id})
            os.write(self._pipe, f"{token} {node_rank}\n".encode())
        except OSError:  # no guardian: the launcher's own teardown still covers every other end
            self._proc = None
        finally:
            os.close(read_end)

    def dismiss(self) -> None:
        """The group is closed and swept: the guardian is killed before the pipe ends (it would
        sweep nothing, and nothing should wait for it to start and read)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        os.close(self._pipe)


def main() -> None:
    """The guardian: read whose processes it guards, wait for the pipe to end (the launcher
    died: a live one kills the guardian first), then sweep."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 256)
        if not chunk:
            return  # the launcher died before it said whose processes: nothing to tell apart
        data += chunk
    token, node_rank = data.split(b"\n", 1)[0].decode().split()
    while os.read(0, 256):
        pass
    import psutil

    for _ in range(_SWEEPS):
        psutil.wait_procs(kill_job_strays(token, int(node_rank)), timeout=_SWEEP_GAP)
        time.sleep(_SWEEP_GAP)


if __name__ == "__main__":
    main()
