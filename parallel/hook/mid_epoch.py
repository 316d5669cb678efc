"""A ``Model.train`` resumed from a mid-epoch checkpoint trains the rest of that epoch first.

The way MindSpore's tutorials and model zoo resume: load the newest ``PREFIX-EPOCH_STEP.ckpt``,
parse EPOCH from its name and pass ``initial_epoch=EPOCH`` to ``Model.train``, which then
starts at epoch EPOCH+1. That is exact for a save at an epoch's end; for one in the middle of
an epoch (npu-launch's save on preemption, ``parallel.hook.model_train``; a ``ModelCheckpoint``
whose ``save_checkpoint_steps`` does not divide the epoch) it silently skips the epoch's other
steps. So when the file ``load_checkpoint`` read last (``parallel.hook.script_saves``) is such a save
of epoch E at its step S of N, and the script asks to start at ``initial_epoch=E``, the call
starts at epoch E instead, its data at step S+1 (``Dataset.set_init_step``, MindSpore 2.10: the
global step) and its step count at (E-1)*N+S, so that ``ModelCheckpoint`` names and spaces its
saves as in the run that was not stopped. The rank prints one line when it does.

A save at an epoch's end (S = N) resumed that way starts at the right epoch, but its data would
start at the dataset's first epoch, whose shuffle is not epoch E+1's: the parameters would
differ from the run never stopped. Its data starts at step E*N too, so every epoch is read in
its own order.

Not done (the call runs as asked): in dataset sink mode off the CPU (a sink's data is moved
whole: MindSpore rounds the start down to an epoch), when the data already has a start of the
script's own (``get_init_step``), or when the epoch's length is not the dataset's.

Nothing here imports MindSpore.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any, Iterator, Optional

from parallel.hook.script_saves import Place, last_loaded, named_place


@dataclasses.dataclass(frozen=True)
class Rest:
    """The rest of epoch ``place.epoch`` to train before the epochs the script asked for."""

    path: str
    place: Place

    @property
    def done(self) -> int:
        """Steps of the whole run the checkpoint holds, as the uninterrupted run counts them."""
        steps = self.place.epoch_steps or 0
        return (self.place.epoch - 1) * steps + self.place.epoch_step

    @property
    def first_epoch(self) -> int:
        """``initial_epoch`` as ``Model.train`` counts it (from 0): the checkpoint's own epoch
        when steps of it are left, else the next."""
        return self.place.epoch - 1 if self.place.mid_epoch else self.place.epoch


def rest_of_epoch(arguments: dict[str, Any]) -> Optional[Rest]:
    """What is left of the epoch the loaded checkpoint stopped in, when ``arguments`` (a
    ``Model.train`` or ``fit`` call's, bound) start at that epoch; else None."""
    initial, path = arguments.get("initial_epoch", 0), last_loaded()
    named = named_place(path) if path else None
    if not isinstance(initial, int) or named is None or named.epoch != initial or initial < 1:
        return None
    dataset: Any = arguments.get("train_dataset")
    steps = _epoch_steps(dataset, arguments)
    if steps is None or named.epoch_step > steps or dataset.get_init_step() != 0:
        return None
    return Rest(path, dataclasses.replace(named, epoch_steps=steps))


def _epoch_steps(dataset: Any, arguments: dict[str, Any]) -> Optional[int]:
    """Steps in an epoch of the call: the dataset's size; None in a sink mode that moves data by
    sinks (not on the CPU, where MindSpore runs sink mode step by step)."""
    try:
        size = int(dataset.get_dataset_size())
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    sink, sink_size = arguments.get("dataset_sink_mode", False), arguments.get("sink_size", -1)
    if sink and sink_size not in (-1, size) or sink and not _on_cpu():
        return None
    return size if size > 0 else None


def _on_cpu() -> bool:
    import mindspore  # loaded: Model.train's module imported it

    return mindspore.get_context("device_target") == "CPU"


@contextlib.contextmanager
def training_rest(model: Any, arguments: dict[str, Any], rest: Rest) -> Iterator[None]:
    """While the block runs, ``model``'s call (``arguments``, changed in place) starts at the
    checkpoint's epoch and step."""
    dataset = arguments["train_dataset"]
    arguments["initial_epoch"] = rest.first_epoch
    dataset.set_init_step(rest.done)
    own = model.__dict__.get("_train")
    model._train = functools.partial(model._train, initial_step=rest.done)
    steps = rest.place.epoch_steps or 0
    if rest.place.mid_epoch:
        print(f"npu-launch: {os.path.basename(rest.path)} was saved at step {rest.place.epoch_step} "
              f"of epoch {rest.place.epoch}'s {steps}: this rank trains its other "
              f"{steps - rest.place.epoch_step} step(s) first, then the epochs after it "
              f"(initial_epoch={rest.place.epoch} would skip them)", flush=True)
    try:
        yield
    finally:
        if own is None:
            del model._train
        else:
            model._train = own
        dataset.set_init_step(0)
