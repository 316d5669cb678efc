"""A stop signal that reaches the ranks themselves, not only npu-launch: Slurm signals every
process of a job step on preemption. While the trainer fits, SIGTERM does not kill a rank at
once: a thread waits up to ``WAIT`` seconds for npu-launch's word in the log directory
(``contract.STOP_REQUEST_FILE``, which npu-launch writes as it gets the same signal): a step
(the main thread trains on to it, saves it and exits: ``StopStep``, ``stop_now``) or ``NO_SAVE``
(npu-launch is stopping the job without a save: die at once). Nothing there by then: the
rank dies of the signal, as it would have.

Nothing here imports MindSpore.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Iterator, NoReturn, Optional

from parallel import contract

NO_SAVE = contract.STOP_NO_SAVE
WAIT = 0.5
"""Seconds a signalled rank waits for npu-launch's word; npu-launch writes it within a tick."""


def stop_file() -> str:
    """Where npu-launch's word is, "" outside npu-launch."""
    log_dir = os.environ.get(contract.LOG_DIR)
    return os.path.join(log_dir, contract.STOP_REQUEST_FILE) if log_dir else ""


def read_word(path: str) -> Optional[str]:
    """The file's first word, None when it is missing or empty (being written)."""
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return None
    return words[0] if words else None


class StopStep:
    """The step npu-launch asked every rank to stop at (and those that save, to save), read
    from ``path`` (``stop_file``) with one ``stat`` a step until it holds a step."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.step: Optional[int] = None

    def reached(self, step: int) -> bool:
        """Whether ``step`` is the step asked for, or past it."""
        if self.step is None:
            if not self.path or not os.path.exists(self.path):
                return False
            word = read_word(self.path)
            if word is None or not word.isdigit():  # being written, or no save: not now
                return False
            self.step = int(word)
        return step >= self.step


def stop_now(line: str) -> NoReturn:
    """Print ``line`` and end the rank at once, with exit code 0: every rank stops at this
    step, and MindSpore's exit handlers would wait seconds on the cluster's finalisation,
    which the launcher's ``--kill-timeout`` needs for the save."""
    print(line, flush=True)
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def deferred_sigterm(path: str) -> Iterator[None]:
    """SIGTERM waits for npu-launch's word while the block runs (on the main thread, with no
    handler or wakeup descriptor of the script's own); as before afterwards.

    The word is awaited on a thread woken through ``signal.set_wakeup_fd``: Python's own
    handlers run only when the main thread runs Python, and a rank blocked inside a collective
    (its peer died) must still die at once when npu-launch stops the job."""
    if not path or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    theirs = signal.set_wakeup_fd(write)
    if theirs != -1:  # the script's own: leave it alone
        signal.set_wakeup_fd(theirs)
        os.close(read)
        os.close(write)
        yield
        return
    signal.signal(signal.SIGTERM, _ignore)
    _children_forget((read, write))
    threading.Thread(target=_watch, args=(read, path), name="npu-launch-sigterm",
                     daemon=True).start()
    try:
        yield
    finally:
        _armed.clear()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.close(write)  # the watching thread reads the end and leaves


_armed: list[tuple[int, int]] = []
"""The pipe of the block running in this process, for a child forked inside it."""
_fork_hook: list[bool] = []


def _children_forget(pipe: tuple[int, int]) -> None:
    _armed[:] = [pipe]
    if not _fork_hook:  # once per process: fork hooks cannot be removed
        os.register_at_fork(after_in_child=_forget_in_child)
        _fork_hook.append(True)


def _forget_in_child() -> None:
    """A process forked while SIGTERM waits for the word (a dataset worker, MindSpore's summary
    writer and its pool) gets back SIGTERM's default and no wakeup descriptor: otherwise it
    inherits both, and a SIGTERM meant for it (its pool's ``terminate``) writes into the rank's
    pipe, where the rank's thread takes it for its own and, with no word from npu-launch, kills
    the rank (seen: mindcv's ``StateMonitor`` closing its ``SummaryRecord`` at the end of
    training killed rank 0 of a job that had finished)."""
    if not _armed:
        return
    read, write = _armed.pop()
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread: nothing of ours to put back
        pass
    os.close(read)
    os.close(write)


def _ignore(signum: int, frame: object) -> None:
    """SIGTERM's Python-level handler: the watching thread decides."""


def _watch(read: int, path: str) -> None:
    try:
        while True:
            got = os.read(read, 64)
            if not got:
                return
            if signal.SIGTERM in got:
                _decide(path, signal.SIGTERM)
    finally:
        os.close(read)


def _decide(path: str, signum: int) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        word = read_word(path)
        if word is not None and word.isdigit():
            return  # a save was asked for: the main thread makes it
        if word == NO_SAVE:
            break
        time.sleep(0.01)
    _die(signum)


def _die(signum: int) -> None:
    """End the process by ``signum``'s default action, as if no handler had been installed:
    ``signal.signal`` belongs to the main thread, so the C library puts the default back."""
    try:
        ctypes.CDLL(None, use_errno=True).signal(signum, 0)  # SIG_DFL
    except (OSError, AttributeError):
        os._exit(128 + signum)
    os.kill(os.getpid(), signum)
