"""Taking a cluster down: its state file, ending its processes, and clusters of killed runs.

State is kept in ``/run/npl-clusters/<tag>/state.json`` from before the first change (owner pid
and start time, subnet, work dir, hosts, daemons), so a cluster left by a killed run (its owner
is gone) is destroyed by the next ``setup()`` of any cluster. Processes are ended by pid,
checked against their start time, never by name: first the recorded daemons (the hosts' inits
last, whose death ends every process of their host), then anything still in a host's network
namespace.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Iterable, Optional

import psutil

from .common import STATE_ROOT, ClusterError, locked
from .netns import (
    NETNS_DIR,
    delete_network,
    edit_hosts_file,
    leftover_namespaces,
    ns_inode,
    tags_of_leftover_namespaces,
)


@dataclasses.dataclass(frozen=True)
class Daemon:
    """A process the cluster started; ``started`` (psutil create time) guards against pid reuse.

    ``pid`` is as the root namespace sees it; ``host_pid`` as its host does (None in the root
    namespace). Roles: ``init`` (one per host), ``sshd``, ``slurmd``, ``munged``, ``slurmctld``.
    """

    role: str
    host: Optional[str]
    pid: int
    started: float
    host_pid: Optional[int] = None

    def alive(self) -> bool:
        """True while this very process (not a later one with the same pid) runs."""
        return live_process(self.pid, self.started) is not None


def live_process(pid: int, started: float) -> Optional[psutil.Process]:
    """The process pid if it is the one created at ``started`` and not a zombie, else None."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - started) < 0.01 and p.status() != "zombie" else None
    except psutil.NoSuchProcess:
        return None


def started(pid: int) -> float:
    return psutil.Process(pid).create_time()


def unique_tag(prefix: str) -> str:
    """A tag no other live process uses: prefix + this process's pid in base 36 (<= 5 digits)."""
    pid, digits = os.getpid(), ""
    while pid:
        pid, r = divmod(pid, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
    return prefix + digits


# ---------------------------------------------------------------------- state
def load_state(d: Path) -> Optional[dict]:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return None


def save_state(d: Path, state: dict) -> None:
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(d / "state.json")


def recorded_subnets() -> list[int]:
    """The subnets that recorded clusters (live or not yet cleaned) hold."""
    states = [load_state(d) for d in STATE_ROOT.iterdir()] if STATE_ROOT.is_dir() else []
    return [s["subnet"] for s in states if s and s.get("subnet") is not None]


def owner_alive(state: dict) -> bool:
    return live_process(state["owner_pid"], state["owner_started"]) is not None


def owned_by_us(state: dict) -> bool:
    return state["owner_pid"] == os.getpid() and owner_alive(state)


def recorded_daemons(tag: str) -> list[Daemon]:
    """The daemons recorded for a cluster tag (also of a killed run), or [] if none is."""
    state = load_state(STATE_ROOT / tag)
    return [Daemon(**d) for d in state.get("daemons", [])] if state else []


# ---------------------------------------------------------------------- stale clusters
def clean_stale(own_tag: Optional[str] = None) -> list[str]:
    """Destroy clusters whose owner process is gone, and leftovers named for own_tag.

    Returns the tags cleaned. A cluster whose owner is alive is left alone, except own_tag held by
    this very process (an earlier Cluster object that was never torn down). ``setup()`` runs it.
    """
    STATE_ROOT.mkdir(mode=0o755, exist_ok=True)
    with locked(STATE_ROOT / "alloc.lock"):
        return clean_stale_locked(own_tag)


def clean_stale_locked(own_tag: Optional[str]) -> list[str]:
    """``clean_stale`` for a caller that holds ``alloc.lock`` already."""
    cleaned = []
    tags = {p.name for p in STATE_ROOT.iterdir() if p.is_dir()} if STATE_ROOT.exists() else set()
    tags |= tags_of_leftover_namespaces()
    for tag in sorted(tags):
        state = load_state(STATE_ROOT / tag)
        alive = state is not None and owner_alive(state)
        if alive and not (tag == own_tag and owned_by_us(state)):
            if tag == own_tag:
                raise ClusterError(f"tag {tag!r} is in use by live process {state['owner_pid']}")
            continue
        destroy(state or {"tag": tag, "hosts": [], "daemons": []})
        cleaned.append(tag)
    return cleaned


def destroy(state: dict) -> None:
    """End every process of the cluster, then delete its network, hosts lines and directories."""
    tag = state["tag"]
    daemons = [Daemon(**d) for d in state.get("daemons", [])]
    # Inits last: their death kills the rest of their host at once, so the daemons get their
    # SIGTERM first (and the grace to exit cleanly).
    for group in ([d for d in reversed(daemons) if d.role != "init"],
                  [d for d in daemons if d.role == "init"]):
        terminate([p for d in group if (p := live_process(d.pid, d.started)) is not None])
    names = {h["name"] for h in state.get("hosts", [])} | leftover_namespaces(tag)
    inodes = {ino for n in names if (ino := ns_inode(NETNS_DIR / n)) is not None}
    terminate(processes(pids_with_ns("net", inodes)))
    delete_network(tag, names)
    edit_hosts_file(tag, [])
    if state.get("workdir"):
        shutil.rmtree(state["workdir"], ignore_errors=True)
    shutil.rmtree(STATE_ROOT / tag, ignore_errors=True)


# ---------------------------------------------------------------------- ending processes
def terminate(procs: list[psutil.Process], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace`` seconds."""
    for p in procs:
        _signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace)


def reap(p: subprocess.Popen) -> None:
    """Wait for a child the cluster started (killing it if it does not exit)."""
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def pids_with_ns(kind: str, inodes: set[int]) -> set[int]:
    """Pids whose namespace of that kind is one of inodes (compared through /proc/<pid>/ns)."""
    found: set[int] = set()
    if not inodes:
        return found
    for pid in psutil.pids():
        try:
            if os.stat(f"/proc/{pid}/ns/{kind}").st_ino in inodes:
                found.add(pid)
        except OSError:
            continue
    return found


def processes(pids: Iterable[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return procs


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass
