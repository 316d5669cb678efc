"""Bounded fan-out: how node 0 reaches many hosts at once without setting up every ssh
connection at the same moment (``--fanout K``).

Preflight's probes and ``--sync-workdir``'s copies are short ssh commands: at most K run at
once (``workers``). The node agents' ssh clients live for the whole job, so they cannot be
counted by whether they still run: an agent is *connecting* from its start until its first
control line arrives (``control.AgentUp``, which it sends first thing) or it exits, and
``Admission`` lets the next agent start only while fewer than K are connecting. The ssh
processes stay, their handshakes are staggered. srun and mpirun start every node's agent with
one process of their own and fan out themselves.

Node 0 holds a few descriptors per agent (its output and stdin pipes, its log, one log per rank
that prints), more than the usual soft limit of 1024 past about 250 hosts: ``raise_open_files``
lifts the soft limit towards the hard one before the agents start.
"""
from __future__ import annotations

import collections
import resource
import threading
from typing import Callable, Generic, Iterable, TypeVar

T = TypeVar("T")

DESCRIPTORS_PER_AGENT = 5
"""Node 0's per agent: output pipe, stdin pipe, the agent's log, its first rank's log, and the
pipe to its host's ssh control master (``launcher.cluster.backends.ssh_mux``)."""
DESCRIPTORS_SPARE = 256
"""Node 0's own files, sockets (the payload server's connections) and the ssh clients' start."""


def workers(fanout: int, hosts: int) -> int:
    """Threads for a short ssh command on each of ``hosts``: at most ``fanout`` at once."""
    return max(1, min(fanout, hosts))


class Admission(Generic[T]):
    """Items to start at most ``bound`` at a time in their set-up, in order.

    ``due`` hands out the items that may start now and counts each as setting up until
    ``set_up`` is called with its key (from any thread), or ``ended`` (it exited first).
    """

    def __init__(self, items: Iterable[T], key: Callable[[T], str], bound: int) -> None:
        if bound < 1:
            raise ValueError(f"bound must be at least 1, got {bound}")
        self._waiting = collections.deque(items)
        self._key = key
        self._bound = bound
        self._setting_up: set[str] = set()
        self._lock = threading.Lock()

    def due(self) -> list[T]:
        """The items to start now (each counted as setting up from here)."""
        with self._lock:
            started = []
            while self._waiting and len(self._setting_up) < self._bound:
                item = self._waiting.popleft()
                self._setting_up.add(self._key(item))
                started.append(item)
            return started

    def set_up(self, key: str) -> bool:
        """The item ``key`` is set up; True if it was counted as setting up until now."""
        with self._lock:
            if key in self._setting_up:
                self._setting_up.discard(key)
                return True
            return False

    def ended(self, key: str) -> bool:
        """The item ``key`` exited: it sets up no more."""
        return self.set_up(key)

    @property
    def waiting(self) -> int:
        """Items not started yet."""
        with self._lock:
            return len(self._waiting)

    @property
    def setting_up(self) -> int:
        with self._lock:
            return len(self._setting_up)


def open_files_needed(agents: int, ranks: int) -> int:
    """Descriptors node 0 may hold for ``agents`` agents streaming ``ranks`` ranks' logs."""
    return DESCRIPTORS_PER_AGENT * agents + max(0, ranks - agents) + DESCRIPTORS_SPARE


def raise_open_files(needed: int) -> int:
    """Lift this process's soft limit on open files to ``needed`` (at most the hard limit)
    when it is lower; the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft
