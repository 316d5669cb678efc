"""The processes of one node: start, poll, close.

Each process runs in its own session, so ``os.killpg`` reaches whatever it started too. ``close``
is idempotent: SIGTERM to every group still alive, wait to a deadline, SIGKILL the rest, reap, and
finally kill any stray process that still carries this launch's token and node rank in its
environment (a grandchild that called ``setsid``). It never matches processes by command name or
by the user-visible job id: either could belong to another job. A node's group also starts the
launch's guardian (``strays.Guardian``), which does that sweep if this launcher dies unclosed.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from typing import Mapping, Optional

import psutil

from launcher.plan.launch_plan import ProcessSpec
from launcher.run.output import LineSink, Pump
from launcher.run.spares import Spare, process_env
from launcher.run.stdin_feed import StdinFeed
from launcher.run.strays import Guardian, kill_job_strays, kill_orphans
from parallel import contract

_POLL_INTERVAL = 0.02


@dataclasses.dataclass(frozen=True)
class Exit:
    """How one process ended: ``returncode`` as Popen reports it (negative for a signal)."""

    spec: ProcessSpec
    pid: int
    returncode: int
    time: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class ProcessGroup:
    """Every process this launcher started on this node, keyed by label."""

    def __init__(self, token: str, base_env: Mapping[str, str], workdir: str,
                 node_rank: Optional[int] = None) -> None:
        self._token = token
        self._node_rank = node_rank
        self._base_env = dict(base_env)
        self._workdir = workdir
        self._running: dict[str, tuple[ProcessSpec, subprocess.Popen]] = {}
        self._pumps: dict[str, Pump] = {}
        self._feeds: dict[str, StdinFeed] = {}
        self.pids: dict[str, int] = {}
        self._closed = False
        self._guardian: Optional[Guardian] = None
        self._started: set[int] = set()
        """Every process this group started or adopted: the rest of a subreaper's children
        that began after ``_since`` are what its ranks left (``strays.kill_orphans``)."""
        self._since: Optional[float] = None
        """When the kernel started this group's first process, on the clock of ``/proc``
        (psutil's ``create_time``; it can differ from ``time.time()`` by a minute on a VM)."""

    def start(self, spec: ProcessSpec, on_line: Optional[LineSink],
              stdin_data: Optional[bytes] = None) -> int:
        """Start ``spec`` with its output pumped to its log and, line by line, to ``on_line``.

        With ``stdin_data`` the process reads that from a pipe which then stays open: a node
        agent takes the pipe's end (``close``, or this launcher dying) as the order to stop.
        The pipe is written from a thread of its own (``StdinFeed``): this returns at once.
        """
        env = self._env(spec)
        self._guard(env)
        read_end, write_end = os.pipe()
        stdin_read, stdin_write = os.pipe() if stdin_data is not None else (None, None)
        try:
            proc = subprocess.Popen(list(spec.command), env=env, cwd=self._workdir,
                                    stdin=subprocess.DEVNULL if stdin_read is None else stdin_read,
                                    stdout=write_end, stderr=write_end, start_new_session=True)
        except OSError:
            os.close(read_end)
            if stdin_write is not None:
                os.close(stdin_write)
            raise
        finally:
            os.close(write_end)
            if stdin_read is not None:
                os.close(stdin_read)
        if stdin_write is not None and stdin_data is not None:
            self._feeds[spec.label] = StdinFeed(stdin_write, spec.label)
            self._feeds[spec.label].put(stdin_data)
        pump = Pump(read_end, spec.log_path, spec.label, on_line)
        pump.start()
        self._running[spec.label] = (spec, proc)
        self._pumps[spec.label] = pump
        self.pids[spec.label] = proc.pid
        self._began(proc.pid)
        return proc.pid

    def start_foreground(self, spec: ProcessSpec) -> int:
        """Start ``spec`` on this terminal (stdin included) in our process group, for pdb."""
        env = self._env(spec)
        self._guard(env)
        proc = subprocess.Popen(list(spec.command), env=env, cwd=self._workdir)
        self._running[spec.label] = (spec, proc)
        self.pids[spec.label] = proc.pid
        self._began(proc.pid)
        return proc.pid

    def _guard(self, env: Mapping[str, str]) -> None:
        """Start this node's guardian with the first process (a node's group: node 0's group
        of agents has no node rank, and each agent guards its own host)."""
        if self._guardian is None and self._node_rank is not None and self._token \
                and not self._closed:
            self._guardian = Guardian(self._token, self._node_rank, env.get(contract.JOB_ID, ""))

    def adopt(self, spare: Spare, spec: ProcessSpec, on_line: Optional[LineSink]) -> Optional[int]:
        """Make ``spare`` (``launcher.run.spares``, taken for ``spec``) the process of ``spec``,
        as if ``start`` had started it: the go with ``spec``'s environment, then its output
        pumped; None when the go could not be given (the spare is ended: start ``spec``)."""
        env = self._env(spec)
        if self._closed or not spare.go(env):
            spare.end()
            return None
        self._guard(env)
        pump = Pump(spare.output, spec.log_path, spec.label, on_line)
        pump.start()
        self._running[spec.label] = (spec, spare.proc)
        self._pumps[spec.label] = pump
        self.pids[spec.label] = spare.proc.pid
        self._began(spare.proc.pid)
        return spare.proc.pid

    def _began(self, pid: int) -> None:
        self._started.add(pid)
        if self._since is None:
            try:
                self._since = psutil.Process(pid).create_time()
            except psutil.Error:  # gone already: anything after it still counts
                self._since = 0.0

    def _env(self, spec: ProcessSpec) -> dict[str, str]:
        return process_env(self._base_env, spec)

    def send(self, data: bytes) -> None:
        """Write ``data`` to every running process started with a stdin pipe (the node agents),
        after what each was given before."""
        for label in self._running:
            feed = self._feeds.get(label)
            if feed is not None:
                feed.put(data)

    def poll(self) -> list[Exit]:
        """The processes that ended since the last call."""
        ended = []
        for label, (spec, proc) in list(self._running.items()):
            code = proc.poll()
            if code is not None:
                del self._running[label]
                ended.append(Exit(spec, proc.pid, code, time.time()))
        return ended

    def running(self) -> list[ProcessSpec]:
        return [spec for spec, _ in self._running.values()]

    def drain(self, label: str, timeout: float) -> None:
        """Wait for the last output of an ended process to reach its log."""
        pump = self._pumps.get(label)
        if pump is not None:
            pump.join(timeout)

    def close(self, grace: float) -> list[Exit]:
        """Stop everything still running (SIGTERM, ``grace`` seconds, SIGKILL); idempotent."""
        if self._closed:
            return []
        self._closed = True
        ended = self._stop_agents_politely(grace)
        self._signal_all(signal.SIGTERM)
        self._signal_all(signal.SIGCONT)  # one stopped (kill -STOP) acts on it, not on the SIGKILL
        ended += self._wait_until(time.monotonic() + grace)
        self._signal_all(signal.SIGKILL)
        ended += self._wait_until(time.monotonic() + 5.0)
        if self._node_rank is not None and self._token:
            # Gone, not only signalled: a stray dying as the launcher exits is still running.
            # The orphans are this process's children: the wait reaps them.
            psutil.wait_procs(kill_job_strays(self._token, self._node_rank)
                              + kill_orphans(self._started, self._since or 0.0), timeout=5.0)
        if self._guardian is not None:
            self._guardian.dismiss()
        for pump in self._pumps.values():
            pump.join(1.0)
        return ended

    def _stop_agents_politely(self, grace: float) -> list[Exit]:
        """Close the stdin of processes fed through a pipe (node agents) and give them time to
        stop their own ranks: killing the ssh client at once would leave the remote side
        unattended while it tears down."""
        fed = any(label in self._feeds for label in self._running)
        for feed in self._feeds.values():  # those of ended processes too: their threads end
            feed.close()
        if not fed:
            return []
        return self._wait_until(time.monotonic() + grace + 5.0)

    def _signal_all(self, sig: signal.Signals) -> None:
        for label, (_, proc) in self._running.items():
            if label in self._pumps:
                _signal_group(proc.pid, sig)
            else:  # a foreground rank shares our process group: signal it alone
                proc.send_signal(sig)

    def _wait_until(self, deadline: float) -> list[Exit]:
        ended = []
        while self._running and time.monotonic() < deadline:
            self._sweep_exited_groups()
            ended += self.poll()
            if self._running:
                time.sleep(_POLL_INTERVAL)
        return ended

    def _sweep_exited_groups(self) -> None:
        """A leader may be gone while the rest of its group still runs: SIGKILL the group of
        each leader that exited, while its exit is not yet reaped. Once reaped, its number is
        free, and on a busy host (pid_max 32768 here) the kernel can give it to an unrelated
        process group: a sweep after the reap could kill a process this launch never started.
        A member that outlives a leader reaped between two sweeps carries the launch's token:
        ``kill_job_strays`` ends it."""
        for label, (_, proc) in self._running.items():
            if label in self._pumps and proc.returncode is None and _exited_unreaped(proc.pid):
                _signal_group(proc.pid, signal.SIGKILL)


def _exited_unreaped(pid: int) -> bool:
    """Whether our child ``pid`` exited (it is not reaped: ``WNOWAIT``)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
