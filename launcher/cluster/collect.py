"""Node 0's collection of checkpoint files from the hosts that share no storage with it.

What a restart needs from node 0 alone is decided on the launcher and carried in the plan
(``LaunchPlan.collect_ranks``): every rank's slice of a sliced (model- or pipeline-parallel)
layout that is not on the launcher's host (``launcher_node``), and in data parallelism one
replica, the lowest rank's, when the launcher's host runs no rank; nothing with
``--no-checkpoint-collect``. And, in a replicated layout, any rank's last words
(``launcher.run.last_words``): the one file a restart resumes every rank from, which the
other hosts then fetch from node 0.

Shared storage: before the agents start, the launcher writes its launch token to
``<log dir>/.npu_launch_storage`` (``mark_storage``). An agent that reads the same token there
(``shares_storage``) is on storage node 0 sees: its ranks' files stay where they are, it sends
nothing, and says so in one line.

Otherwise each agent sends its collected ranks' files to the launcher's payload server
(``launcher.cluster.payload``, which hands them to node 0's ledger) as their ``checkpoint`` events pass
through it, from a thread of its own (``Uploader``): no rank waits for it, inside its train step
or out. Only each rank's newest file waits its turn (node 0 keeps only the newest collected
step). When the agent's ranks are done it sends what is left before it reports; after a
failure, for ``--kill-timeout`` at most.
"""
from __future__ import annotations

import hmac
import os
import socket
import threading
from typing import Callable, Optional, Sequence

from launcher.checkpoints.ledger import reported
from launcher.checkpoints.uploads import FILE_NAME, Upload
from launcher.errors import LaunchError
from parallel import contract
from parallel.checkpoints.manifest import atomic_write_bytes
from parallel.contract import Event

STORAGE_MARKER = ".npu_launch_storage"

Send = Callable[[Upload, str], None]
"""Sends the file at the path as the upload says (``LaunchError`` when it cannot)."""


def mark_storage(log_dir: str, token: str) -> None:
    """The launcher's mark in its log directory, for agents to look for."""
    atomic_write_bytes(os.path.join(log_dir, STORAGE_MARKER), token.encode())


def shares_storage(log_dir: str, token: str) -> bool:
    """This host sees the launcher's log directory: its marker holds this launch's token."""
    try:
        with open(os.path.join(log_dir, STORAGE_MARKER), "rb") as f:
            found = f.read(len(token) + 1)
    except OSError:
        return False
    return bool(token) and hmac.compare_digest(found, token.encode())


def launcher_node(hosts: Sequence[str]) -> Optional[int]:
    """The index of the host this process runs on: one named as this host is, or resolving to
    an address of this host; None when none of them is."""
    names = {socket.gethostname().lower(), socket.getfqdn().lower(), "localhost"}
    for index, host in enumerate(hosts):
        if host.lower() in names or _is_own_address(host):
            return index
    return None


def _is_own_address(host: str) -> bool:
    """``host`` resolves to an address this host can bind (only its own ones)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address[0], 0))
                return True
            except OSError:
                continue
    return False


def upload_of(event: Event) -> Optional[tuple[Upload, str]]:
    """The upload a checkpoint event's file makes, and its path; None when the event does not
    describe a file."""
    file = reported(event)
    if file is None or event.step is None:
        return None
    name = os.path.basename(file.path)
    if not FILE_NAME.fullmatch(name) or ".." in name:
        name = f"rank_{event.rank}"  # a name the server would refuse: node 0 names it
    return Upload(event.rank, event.step, name, file.file.size, file.file.sha256), file.path


class Uploader:
    """An agent's sending of its ``ranks``' checkpoint files to node 0, in a thread of its own;
    ``say`` tells the agent's console what could not be sent."""

    def __init__(self, send: Send, ranks: frozenset[int], say: Callable[[str], None],
                 last_words: bool = False) -> None:
        self._send = send
        self._ranks = ranks
        self._last_words = last_words
        """Send last words too: this host does not share node 0's storage."""
        self._say = say
        self._pending: dict[int, tuple[Upload, str]] = {}
        self._closed = False
        self._wake = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    def offer(self, event: Event) -> None:
        """A rank's event as the agent forwards it: a checkpoint of a collected rank, or any
        rank's last words (the restart's other hosts need them), is queued (replacing that
        rank's older one that has not gone yet)."""
        if event.kind != contract.EVENT_CHECKPOINT or not (
                event.rank in self._ranks or (self._last_words and event.flag("last_words"))):
            return
        item = upload_of(event)
        if item is None:
            return
        with self._wake:
            if self._closed:
                return
            self._pending[event.rank] = item
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="checkpoint-upload",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self, timeout: Optional[float]) -> None:
        """Send what is queued, for ``timeout`` seconds at most (None: as long as it takes);
        nothing is queued after this."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if not self._pending:
                    return
                upload, path = self._pending.pop(min(self._pending))
            try:
                self._send(upload, path)
            except LaunchError as e:
                self._say(f"checkpoints: rank {upload.rank}'s file of step {upload.step} was "
                          f"not sent to node 0: {e.message}")
