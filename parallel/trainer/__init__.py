"""The shared trainer: mixed precision, loss scaling, accumulation, clipping, checkpoints, events.

* ``core``: :class:`Trainer`: setup, the step loop and evaluation (MindSpore).
* ``api``: its options, results, callbacks and errors (no MindSpore).
* ``saving``: resume, load, save, prune and last words' saver (a mixin of ``Trainer``).
* ``support``: the meter and the fit's bookkeeping.
* ``cells``: the step's compiled cells and the loss scaler (MindSpore).
* ``amp``: mixed-precision and loss-scale settings; ``schedules``: learning-rate schedules
  (neither imports MindSpore).

User scripts import it as ``parallel.trainer``: the names below. ``Trainer`` is imported on
first use, so this package, ``amp`` and ``schedules`` import without MindSpore.
"""
from typing import TYPE_CHECKING, Any

from parallel.trainer.amp import AmpDtype, AmpError, AmpLevel, LossScaleConfig, LossScaleMode
from parallel.trainer.api import (
    Callback,
    EpochInfo,
    EvalResult,
    FitResult,
    RankLike,
    ResumeMode,
    Signal,
    SimpleRank,
    StepInfo,
    TrainerError,
    TrainerLike,
    TrainOptions,
)
from parallel.trainer.schedules import LrSchedule

if TYPE_CHECKING:
    from parallel.trainer.core import Trainer

__all__ = ["Trainer", "TrainOptions", "Callback", "Signal", "StepInfo", "EpochInfo", "EvalResult",
           "FitResult", "RankLike", "ResumeMode", "SimpleRank", "TrainerError", "TrainerLike",
           "LrSchedule", "AmpLevel", "AmpDtype", "AmpError", "LossScaleConfig", "LossScaleMode"]


def __getattr__(name: str) -> Any:
    """``Trainer``, imported on first use (it needs MindSpore)."""
    if name == "Trainer":
        from parallel.trainer.core import Trainer

        return Trainer
    raise AttributeError(f"module 'parallel.trainer' has no attribute {name!r}")
