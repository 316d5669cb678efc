"""The shared trainer's bookkeeping and the small helpers of its loop (``parallel.trainer``)."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Optional

import mindspore as ms
import numpy as np

from parallel import contract
from parallel.config import ExecMode
from parallel.trainer.api import EvalResult, RankLike, TrainerError

log = logging.getLogger("parallel.trainer")
"""The trainer's own logger: its warnings are the trainer's, wherever the code that says them lives."""


# Throughput --------------------------------------------------------------------------------------

class Meter:
    """Samples per second of training, from the end of the first step on, minus pauses."""

    def __init__(self) -> None:
        self.started: Optional[float] = None
        self.paused = 0.0
        self.samples = 0

    def start(self) -> None:
        self.started = time.perf_counter()

    def add(self, samples: int) -> None:
        if self.started is not None:
            self.samples += samples

    def pause_since(self, since: float) -> None:
        if self.started is not None:
            self.paused += time.perf_counter() - since

    def rate(self) -> float:
        if self.started is None or self.samples == 0:
            return 0.0
        return self.samples / max(time.perf_counter() - self.started - self.paused, 1e-9)


@dataclasses.dataclass
class Run:
    """Mutable bookkeeping of one :meth:`Trainer.fit` call."""

    meter: Meter
    steps_run: int = 0
    epoch_losses: list = dataclasses.field(default_factory=list)
    last_epoch_loss: float = float("nan")
    pending_finite: list = dataclasses.field(default_factory=list)
    skipped: int = 0
    stop: bool = False
    eval: Optional[EvalResult] = None
    last_loss: Any = None
    exec_mode: ExecMode = ExecMode.GRAPH
    mode_reported: bool = False


# Helpers ------------------------------------------------------------------------------------------

DATA_PARALLEL_MODES = ("data_parallel", "hybrid_parallel")


def rank_of(info: Optional[RankLike]) -> tuple[int, int]:
    if info is None:
        info = contract.RankIdentity.from_environ(os.environ)
    rank, world = int(info.rank), int(info.world_size)
    if world < 1 or not 0 <= rank < world:
        raise TrainerError(f"rank {rank} is not in a world of {world}")
    return rank, world


def exec_mode() -> ExecMode:
    """How MindSpore runs the step cells now: what a script set after ``parallel.init()`` counts."""
    return ExecMode.GRAPH if ms.get_context("mode") == ms.GRAPH_MODE else ExecMode.PYNATIVE


def parallel_mode() -> str:
    return str(ms.get_auto_parallel_context("parallel_mode"))


def warn_about_context(world_size: int, info: Optional[RankLike]) -> None:
    if ms.get_context("mode") == ms.PYNATIVE_MODE:
        log.warning("PyNative mode (%s): the train step runs eagerly, about 2x slower than in "
                    "GRAPH_MODE", pynative_source(info))
    if world_size > 1 and parallel_mode() == "stand_alone":
        log.warning("world size %d but parallel mode stand_alone: gradients are not all-reduced, "
                    "each rank trains on its own (call parallel.init() first)", world_size)


def pynative_source(info: Optional[RankLike]) -> str:
    """Who put the rank in PyNative, as far as this rank can tell."""
    # Read by name: a RankInfo says who chose its mode, other RankLike values (RankIdentity) do not.
    chosen = getattr(info, "exec_mode", None)
    if chosen is None:
        return ("MindSpore's default: parallel.init() selects GRAPH_MODE, or call "
                "mindspore.set_context(mode=mindspore.GRAPH_MODE)")
    source = getattr(info, "exec_mode_source")  # noqa: B009 (RankLike has no such attribute)
    if chosen is ExecMode.PYNATIVE:
        return f"chosen by {source}"
    return f"set after {source} selected GRAPH_MODE"


def batches_per_epoch(dataset: Any) -> int:
    if not hasattr(dataset, "create_tuple_iterator") or not hasattr(dataset, "set_init_step"):
        raise TrainerError(f"train_ds must be a mindspore.dataset.Dataset, got {type(dataset)}")
    size = int(dataset.get_dataset_size())
    if size < 1:
        raise TrainerError("train_ds is empty")
    return size


def as_numpy(value: Any) -> Any:
    return value.asnumpy() if hasattr(value, "asnumpy") else value


def eval_counts(loss: float, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    count = logits.shape[0]
    if labels.ndim == logits.ndim:  # one-hot
        labels = labels.argmax(axis=-1)
    is_class = labels.dtype.kind in "iu"
    correct = float((logits.argmax(axis=-1) == labels).sum()) if is_class else float("nan")
    return np.array([loss * count, correct, count], dtype=np.float64)
