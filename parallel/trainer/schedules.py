"""Learning-rate schedules the trainer's optimizer steps through.

A schedule is a frozen value; :meth:`LrSchedule.build` turns it into a MindSpore
``LearningRateSchedule`` to pass as an optimizer's ``learning_rate``::

    sched = LrSchedule.warmup_cosine(0.1, total_steps=optimizer_steps(len_ds, epochs))
    opt = nn.Momentum(net.trainable_params(), learning_rate=sched.build(), momentum=0.9)

The optimizer indexes it with its own ``global_step``, which counts optimizer updates (not
micro-batches under gradient accumulation, not updates skipped on overflow) and is saved and
restored with the optimizer state, so a resumed run continues on the same curve.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any


class ScheduleKind(str, enum.Enum):
    """The shape of the curve."""

    CONSTANT = "constant"
    WARMUP_COSINE = "warmup_cosine"
    STEP_DECAY = "step_decay"


@dataclasses.dataclass(frozen=True)
class LrSchedule:
    """A learning rate for steps ``0 .. total_steps - 1``; later steps keep the last one."""

    kind: ScheduleKind
    base_lr: float
    total_steps: int
    warmup_steps: int = 0
    min_lr: float = 0.0
    step_size: int = 1
    gamma: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ScheduleKind(self.kind))
        if self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(f"schedule needs total_steps >= 1 and 0 <= warmup_steps <= "
                             f"total_steps, got {self.total_steps} and {self.warmup_steps}")
        if self.base_lr <= 0 or not 0 <= self.min_lr <= self.base_lr or self.step_size < 1:
            raise ValueError("schedule needs base_lr > 0, 0 <= min_lr <= base_lr, step_size >= 1")

    @classmethod
    def constant(cls, lr: float, total_steps: int = 1) -> "LrSchedule":
        """The same rate at every step."""
        return cls(ScheduleKind.CONSTANT, lr, total_steps)

    @classmethod
    def warmup_cosine(cls, base_lr: float, total_steps: int, warmup_steps: int = 0,
                      min_lr: float = 0.0) -> "LrSchedule":
        """Linear warm-up to ``base_lr``, then a half cosine down to ``min_lr`` at the last step."""
        return cls(ScheduleKind.WARMUP_COSINE, base_lr, total_steps, warmup_steps, min_lr)

    @classmethod
    def step_decay(cls, base_lr: float, total_steps: int, step_size: int,
                   gamma: float = 0.1) -> "LrSchedule":
        """``base_lr * gamma ** (step // step_size)``."""
        return cls(ScheduleKind.STEP_DECAY, base_lr, total_steps, step_size=step_size, gamma=gamma)

    def value(self, step: int) -> float:
        """The learning rate at optimizer step ``step`` (0-based)."""
        step = min(max(step, 0), self.total_steps - 1)
        if self.kind is ScheduleKind.STEP_DECAY:
            return self.base_lr * self.gamma ** (step // self.step_size)
        if self.kind is ScheduleKind.CONSTANT:
            return self.base_lr
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        return self._cosine(step - self.warmup_steps, self.total_steps - self.warmup_steps)

    def values(self) -> list[float]:
        """Every step's rate, ``total_steps`` of them."""
        return [self.value(step) for step in range(self.total_steps)]

    def build(self) -> Any:
        """A ``mindspore.nn.LearningRateSchedule`` giving :meth:`value` at the optimizer's step."""
        return _table_schedule(self.values())

    def _cosine(self, step: int, span: int) -> float:
        progress = step / max(span - 1, 1)
        return self.min_lr + 0.5 * (self.base_lr - self.min_lr) * (1 + math.cos(math.pi * progress))


def optimizer_steps(batches_per_epoch: int, epochs: int, accumulation: int = 1) -> int:
    """How many optimizer updates ``epochs`` epochs make (a short last window still updates)."""
    return epochs * math.ceil(batches_per_epoch / accumulation)


def _table_schedule(values: list[float]) -> Any:
    import mindspore as ms
    import numpy as np
    from mindspore import ops
    from mindspore.nn.learning_rate_schedule import LearningRateSchedule

    class TableSchedule(LearningRateSchedule):
        """Looks the rate up in a constant table; past its end it keeps the last entry."""

        def __init__(self, table: np.ndarray) -> None:
            super().__init__()
            # A constant tensor, not a Parameter: the schedule is configuration, so it stays out
            # of checkpoints and a resumed run may change it.
            self.table = ms.Tensor(table, ms.float32)
            self.last = len(table) - 1

        def construct(self, global_step: Any) -> Any:
            index = ops.minimum(global_step.reshape(()), self.last)
            return ops.gather(self.table, index, 0)

    return TableSchedule(np.asarray(values, dtype=np.float32))
