"""Ranks that run without npu-launch's rank hook, found from their processes.

The rank hook says ``framework`` as a rank begins importing MindSpore, which is when MindSpore's
scheduler is started. A rank whose Python did not run the hook (a script that re-runs itself
with ``python -E`` or ``-I``, which ignore ``PYTHONPATH``, or under an interpreter too old for
it) says nothing of it: its MindSpore would wait for a scheduler that never starts, and
npu-launch, which times only the ranks that said they began ``init()``, would wait with it. So
on the node that runs the scheduler, from ``AFTER`` seconds after the start until the scheduler
starts, the supervisor looks every ``EVERY`` seconds for MindSpore's library in the memory maps
of the processes of each rank that named no framework (``with_mindspore``; a plain Python
rank's maps are a hundred lines), and a rank found with it counts as having said it imports
MindSpore (``said_for``).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

import psutil

from launcher.config import frameworks
from parallel import contract
from parallel.contract import Event

AFTER = 3.0
"""Seconds from the start before the first look: the hook speaks as the import begins."""
WINDOW = 300.0
"""How long the looks go on without a start-up timeout (``--startup-timeout 0``)."""
EVERY = 1.0
"""Seconds between two looks."""
LIBRARY = os.sep + os.path.join("mindspore", "_c_expression")
"""MindSpore's core extension module, mapped by every process that imported MindSpore."""


class Looks:
    """When the supervisor looks at its ranks' processes: every ``EVERY`` seconds from ``AFTER``
    seconds after ``started`` until ``until`` (the start-up timeout's end): a rank that loads
    MindSpore without the hook later than that waits for the scheduler as before."""

    def __init__(self, started: float, until: float) -> None:
        self._next = started + AFTER
        self._until = until

    def due(self, now: float) -> bool:
        if now < self._next or now > self._until:
            return False
        self._next = now + EVERY
        return True


def with_mindspore(ranks: Mapping[int, int]) -> dict[int, str]:
    """Of ``ranks`` (rank -> pid), those whose process, or one of its descendants, has
    MindSpore loaded, with that process's executable."""
    found = {}
    for rank, pid in ranks.items():
        tree, seen = [pid], 0
        while seen < len(tree):
            tree += _children(tree[seen])
            seen += 1
        python = next((exe for exe in map(_mindspore_exe, tree) if exe), None)
        if python is not None:
            found[rank] = python
    return found


def _children(pid: int) -> list[int]:
    """The kernel's list of ``pid``'s children (``/proc/PID/task/TID/children``, one read per
    thread); psutil's pass over the whole process table where the kernel has no such list."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        found: list[int] = []
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
        return found
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}"):
            return []
    except (OSError, ValueError):
        return []
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def _mindspore_exe(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            if any(LIBRARY in line for line in maps):
                return psutil.Process(pid).exe()
    except (OSError, psutil.Error):
        pass
    return None


def said_for(rank: int, host: str, python: str, now: float) -> Event:
    """The ``framework`` event the rank hook would have sent, marked as npu-launch's
    (``hook: false``, with the Python found running MindSpore)."""
    record = {"event": contract.EVENT_FRAMEWORK, "rank": rank, "host": host,
              "name": "mindspore", frameworks.HOOK: False, "python": python, "time": now}
    return Event.parse(record) or Event(contract.EVENT_FRAMEWORK, rank)
