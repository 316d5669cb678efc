"""Each node's side of hang detection, as its supervisor (``launcher.run.supervisor``) runs it:
whether its quiet ranks are alive (``liveness.LifeWatch``), and once every rank here is frozen,
their stacks (``stack_samples.StallWatch``, ``sample_stacks``), all sent to node 0 as events.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Mapping, Optional

from launcher.hangs.hang_limits import Limits
from launcher.hangs.liveness import INTERVAL, LifeWatch
from launcher.hangs.stack_samples import Stacks, StackSample, StallWatch, sample_stacks
from launcher.ranks.record import RankRecord
from parallel.contract import Event


class NodeWatch:
    """This node's ranks (``records``, rank -> ``RankRecord``, folded by the supervisor; their
    stack files and hosts in ``stack_paths`` and ``hosts``) watched for hangs under ``limits``:
    ``look`` on each tick, ``send_stacks`` also for a start-up timeout's stuck ranks, ``join``
    before any rank is signalled. ``fold`` takes each ``alive`` event (the supervisor folds it
    into the rank's record and passes it on); ``report`` each ``stack`` event."""

    def __init__(self, limits: Limits, records: Mapping[int, RankRecord],
                 stack_paths: Mapping[int, str], hosts: Mapping[int, str],
                 fold: Callable[[Event], None], report: Callable[[Event], None]) -> None:
        self._records = records
        self._stack_paths = stack_paths
        self._hosts = hosts
        self._fold, self._report = fold, report
        self._stalls = StallWatch(limits, records) if limits.on else None
        # With --hang-timeout only progress counts: nothing to read.
        self._life = LifeWatch(records, next(iter(hosts.values()), "?"),
                               min(INTERVAL, limits.floor / 5)) \
            if limits.on and limits.timeout is None else None
        self._natives: Optional[threading.Thread] = None  # py-spy's dumps, once stacks were read

    def look(self, running: Mapping[int, int]) -> None:
        """``running`` (rank -> pid: the ranks whose script has not ended) read for life, and
        their stacks sent once they are all frozen."""
        for alive in self._life.read(running, time.time()) if self._life else ():
            self._fold(alive)
        if self._stalls is not None and self._stalls.due(sorted(running), time.time()):
            self.send_stacks(running)

    def send_stacks(self, ranks: Mapping[int, int]) -> dict[int, StackSample]:
        """Read the stacks of ``ranks`` (rank -> pid), keep them in their stack files and send
        them to node 0 (py-spy's native stacks follow from a thread when they are ready);
        the main threads' samples."""
        paths = {r: self._stack_paths[r] for r in ranks if self._stack_paths.get(r)}
        threads = {rank: r.main_thread for rank, r in self._records.items() if r.main_thread}
        stacks, natives = sample_stacks(ranks, paths, threads)
        if self._life is not None:  # the dump ran each main thread and wrote its stack file
            self._life.rested(ranks)
        self._send(stacks)
        self._natives = threading.Thread(target=lambda: self._send(natives()),
                                         name="native-stacks", daemon=True)
        self._natives.start()
        return {rank: read.sample for rank, read in stacks.items()}

    def join(self) -> None:
        """py-spy's native stacks are read before any rank is signalled, and no py-spy outlives
        the job (each is bounded by its own timeout)."""
        if self._natives is not None:
            self._natives.join()

    def _send(self, stacks: Mapping[int, Stacks]) -> None:
        for rank, read in stacks.items():
            self._report(read.event(self._hosts.get(rank, "?")))
