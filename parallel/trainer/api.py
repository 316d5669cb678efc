"""The shared trainer's vocabulary: its options, what it reports, and its callbacks.

Re-exported by ``parallel.trainer``; nothing here imports MindSpore.
"""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any, Optional, Protocol, Union

from parallel.trainer import amp


class TrainerError(ValueError):
    """A trainer option, or combination of options, that cannot work."""


class ResumeMode(str, enum.Enum):
    """``auto`` continues from the newest complete checkpoint in ``ckpt_dir`` (if any)."""

    AUTO = "auto"
    NEVER = "never"


class Signal(enum.Enum):
    """What a callback asks for; returning ``None`` means continue."""

    CONTINUE = "continue"
    STOP = "stop"


class RankLike(Protocol):
    """Anything saying who this rank is (``parallel.mode.topology.RankInfo``, ``RankIdentity``)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class SimpleRank:
    """A rank identity made by hand."""

    rank: int = 0
    world_size: int = 1


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """Everything about how :class:`Trainer` trains, validated on construction.

    ``loss_scale`` ``None`` means dynamic for O1-O3 and none for O0. With loss scaling an update
    whose gradients hold inf/nan is always skipped; ``skip_nonfinite`` does that without scaling
    too (off by default: the check and its branch cost about 2-4% of a small CNN's step on CPU).
    Steps count optimizer updates; ``ckpt_every_steps`` and ``ckpt_every_epochs`` may both be set.
    """

    amp_level: amp.AmpLevel = amp.AmpLevel.O0
    amp_dtype: amp.AmpDtype = amp.AmpDtype.FLOAT16
    loss_scale: amp.LossScaleConfig = None  # type: ignore[assignment]  # None: chosen by amp_level in __post_init__
    skip_nonfinite: bool = False
    grad_accumulation: int = 1
    clip_grad_norm: Optional[float] = None
    log_every: int = 10
    eval_every_epochs: int = 1
    ckpt_dir: Optional[Union[str, Path]] = None
    ckpt_every_steps: Optional[int] = None
    ckpt_every_epochs: Optional[int] = 1
    keep_last: int = 3
    resume: ResumeMode = ResumeMode.NEVER
    verify_checksums: bool = True

    def __post_init__(self) -> None:
        level = amp.parse_level(self.amp_level)
        object.__setattr__(self, "amp_level", level)
        object.__setattr__(self, "amp_dtype", amp.parse_dtype(self.amp_dtype))
        object.__setattr__(self, "loss_scale", amp.LossScaleConfig.of(self.loss_scale, level))
        object.__setattr__(self, "resume", _parse_resume(self.resume))
        self._check_counts()
        if self.resume is ResumeMode.AUTO and self.ckpt_dir is None:
            raise TrainerError("resume='auto' needs a ckpt_dir")

    def _check_counts(self) -> None:
        positive = {"grad_accumulation": self.grad_accumulation, "log_every": self.log_every,
                    "eval_every_epochs": self.eval_every_epochs, "keep_last": self.keep_last,
                    "ckpt_every_steps": self.ckpt_every_steps or 1,
                    "ckpt_every_epochs": self.ckpt_every_epochs or 1}
        bad = [f"{name}={value}" for name, value in positive.items() if value < 1]
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            bad.append(f"clip_grad_norm={self.clip_grad_norm}")
        if bad:
            raise TrainerError(f"trainer options must be positive: {', '.join(bad)}")

    @property
    def checks_finite(self) -> bool:
        """Whether each update checks its gradients and skips non-finite ones."""
        return self.skip_nonfinite or self.loss_scale.mode is not amp.LossScaleMode.NONE


def _parse_resume(value: Union[ResumeMode, str, None]) -> ResumeMode:
    try:
        return ResumeMode(value or ResumeMode.NEVER)
    except ValueError:
        raise TrainerError(f"resume must be auto|never, got {value!r}") from None


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """Passed to :meth:`Callback.on_step_end` after every optimizer step."""

    global_step: int
    epoch: int
    batch_in_epoch: int
    loss: Any
    """The step's loss as a MindSpore tensor; ``float(info.loss.asnumpy())`` waits for it."""


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Evaluation over the whole eval dataset (every rank's shard in data parallel)."""

    loss: float
    accuracy: Optional[float]
    samples: int


@dataclasses.dataclass(frozen=True)
class EpochInfo:
    """Passed to :meth:`Callback.on_epoch_end`."""

    epoch: int
    global_step: int
    train_loss: float
    eval: Optional[EvalResult]


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What :meth:`Trainer.fit` returns.

    ``samples_per_s`` is this rank's steady-state training throughput (without the first step,
    which compiles, and without evaluation and checkpoint time); ``global_samples_per_s`` is it
    times the world size. ``final_loss`` is the mean training loss of the last (partial) epoch.
    """

    steps: int
    steps_run: int
    epochs: int
    final_loss: float
    eval: Optional[EvalResult]
    samples_per_s: float
    global_samples_per_s: float
    skipped_steps: int
    loss_scale: float
    resumed_from: Optional[int]
    stopped_early: bool
    last_checkpoint: Optional[str]

    @property
    def accuracy(self) -> Optional[float]:
        """The last evaluation's accuracy, if there was one."""
        return self.eval.accuracy if self.eval else None


class TrainerLike(Protocol):
    """The trainer a callback's :meth:`Callback.on_fit_start` is given: the
    :class:`parallel.trainer.core.Trainer` about to fit, seen through what a callback may read or
    change (this module sits below the trainer, so it names it by what it has)."""

    options: TrainOptions
    network: Any
    rank: int
    world_size: int


class Callback:
    """Hooks into :meth:`Trainer.fit`; override what you need. Returning ``Signal.STOP`` from a
    step or epoch hook ends training after that step (a checkpoint is saved if configured)."""

    def on_fit_start(self, trainer: TrainerLike) -> None:
        """Before the first step."""

    def on_step_end(self, info: StepInfo) -> Optional[Signal]:
        """After every optimizer step."""
        return None

    def on_epoch_end(self, info: EpochInfo) -> Optional[Signal]:
        """After every epoch, once evaluated."""
        return None

    def on_checkpoint(self, step: int, path: str) -> None:
        """After this rank's checkpoint of ``step`` is in place."""

    def on_fit_end(self, result: FitResult) -> None:
        """After the last step."""
