"""The script's own checkpoints, told to npu-launch (via ``rank_hook``): each file its
``save_checkpoint`` completes (``ModelCheckpoint`` saves through it too) becomes a ``saved``
event, and the file its ``load_checkpoint`` read last is remembered (``parallel.hook.mid_epoch``).

A ``saved`` event is sent only once the file is whole: after ``save_checkpoint`` returns, or,
for ``async_save=True`` (a thread), once that thread has ended. ``async_save="process"`` saves
are not told: the process is MindSpore's to reap, and nothing here can learn its end without
racing it. The shared trainer's files (their ``append_dict`` carries its data position,
``npu_launch.*``) are not told here either: it sends ``checkpoint`` events of its own.

Where the save stands: inside a ``Model.train`` (``parallel.hook.model_train`` says which fit runs),
the fit's epoch, the step within it and the steps an epoch has; otherwise, the epoch and step
of a ``ModelCheckpoint`` name (``PREFIX-EPOCH_STEP.ckpt``), when the file has one.

Nothing here imports MindSpore.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import threading
from typing import Any, Callable, Optional

from parallel import contract, events

TRAINER_EXTRAS = "npu_launch."
"""The prefix of the shared trainer's own ``append_dict`` keys (``parallel.checkpoints.checkpoint``)."""
ASYNC_THREAD = "asyn_save_ckpt"
"""The name MindSpore 2.10 gives the thread of an ``async_save`` (``train/serialization.py``)."""
_NAME = re.compile(r"-(\d+)_(\d+)\.(?:ckpt|safetensors)$")


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a checkpoint stands in training: ``epoch`` (from 1) and ``epoch_step`` (from 1
    within it), as ``ModelCheckpoint`` names its files; ``epoch_steps`` when known."""

    epoch: int
    epoch_step: int
    epoch_steps: Optional[int] = None

    @property
    def mid_epoch(self) -> bool:
        return self.epoch_steps is not None and self.epoch_step < self.epoch_steps

    def fields(self) -> dict[str, int]:
        known = {"epoch": self.epoch, "epoch_step": self.epoch_step}
        if self.epoch_steps is not None:
            known.update(epoch_steps=self.epoch_steps,
                         step=(self.epoch - 1) * self.epoch_steps + self.epoch_step)
        return known


def named_place(path: str) -> Optional[Place]:
    """The epoch and step a ``ModelCheckpoint`` file's name holds; None for another name."""
    found = _NAME.search(os.path.basename(path))
    if found is None or int(found.group(1)) < 1 or int(found.group(2)) < 1:
        return None
    return Place(int(found.group(1)), int(found.group(2)))


class _Fit:
    """The fit that runs now (its ``cb_params``, set by ``parallel.hook.model_train``) and the file
    ``load_checkpoint`` read last."""

    def __init__(self) -> None:
        self.params: Any = None
        self.loaded = ""


_now = _Fit()


def fit_began(params: Any) -> None:
    _now.params = params


def fit_ended() -> None:
    _now.params = None


def last_loaded() -> str:
    """The absolute path ``load_checkpoint`` read last in this rank, "" before any."""
    return _now.loaded


def _fit_place() -> Optional[Place]:
    """Where the running fit stands: its step numbered as ``ModelCheckpoint`` names files."""
    params = _now.params
    try:
        epoch, step, steps = int(params.cur_epoch_num), int(params.cur_step_num), int(params.batch_num)
    except (AttributeError, TypeError, ValueError):
        return None
    if epoch < 1 or step < 1 or steps < 1:
        return None
    return Place(epoch, (step - 1) % steps + 1, steps)


def reporting_save(real: Callable[..., Any]) -> Callable[..., Any]:
    """``save_checkpoint``, telling npu-launch of each file it completes."""
    def save_checkpoint(save_obj: Any, ckpt_file_name: Any, *args: Any, **kwargs: Any) -> Any:
        before = _async_threads()
        result = real(save_obj, ckpt_file_name, *args, **kwargs)
        if not _scripts(args, kwargs):
            return result
        path = _final_path(ckpt_file_name, kwargs.get("format", "ckpt"))
        place = _fit_place() or named_place(path)
        pending = _async_threads() - before
        if pending:
            threading.Thread(target=_tell_after, args=(pending, path, place),
                             name="npu-launch-saved", daemon=True).start()
        elif _async(args, kwargs) != "process":
            _tell(path, place)
        return result
    return functools.update_wrapper(save_checkpoint, real)


def recording_load(real: Callable[..., Any]) -> Callable[..., Any]:
    """``load_checkpoint``, remembering the file it read (once it returned)."""
    def load_checkpoint(ckpt_file_name: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(ckpt_file_name, *args, **kwargs)
        if isinstance(ckpt_file_name, str):
            _now.loaded = os.path.realpath(ckpt_file_name)
        return result
    return functools.update_wrapper(load_checkpoint, real)


def _scripts(args: tuple, kwargs: dict) -> bool:
    """Not the shared trainer's save (it tells its own files)."""
    extras = args[2] if len(args) > 2 else kwargs.get("append_dict")
    return not (isinstance(extras, dict) and any(str(k).startswith(TRAINER_EXTRAS) for k in extras))


def _async(args: tuple, kwargs: dict) -> Any:
    return args[1] if len(args) > 1 else kwargs.get("async_save", False)


def _final_path(name: Any, format: Any) -> str:
    """The file MindSpore wrote: its real path, with the format's suffix added when missing."""
    path = os.path.realpath(str(name))
    return path if path.endswith(str(format)) else f"{path}.{format}"


def _async_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == ASYNC_THREAD}


def _tell_after(threads: set[threading.Thread], path: str, place: Optional[Place]) -> None:
    for thread in threads:
        thread.join()
    _tell(path, place)


def _tell(path: str, place: Optional[Place]) -> None:
    try:
        size = os.path.getsize(path)
    except OSError:
        return  # not written after all (another rank's share, a save that failed quietly)
    events.emit(contract.EVENT_SAVED, path=path, size=size, **(place.fields() if place else {}))
