"""Learning-rate schedules: the curves (pure Python), and the MindSpore schedule the optimizer
steps through (the one test marked mindspore; the module imports MindSpore only there)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from parallel.trainer.schedules import LrSchedule, optimizer_steps


def test_warmup_cosine_rises_linearly_then_falls_to_min_lr() -> None:
    schedule = LrSchedule.warmup_cosine(0.4, total_steps=10, warmup_steps=4, min_lr=0.1)
    values = schedule.values()
    assert values[:4] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert values[4] == pytest.approx(0.4) and values[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[4:], values[5:]))
    middle = 0.1 + 0.15 * (1 + math.cos(math.pi * 2 / 5))
    assert values[6] == pytest.approx(middle)
    assert schedule.value(50) == values[-1]


def test_step_decay_and_constant() -> None:
    assert LrSchedule.step_decay(1.0, 7, step_size=3, gamma=0.5).values() == [
        1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25]
    assert LrSchedule.constant(0.3, 4).values() == [0.3] * 4


@pytest.mark.parametrize("kwargs", [
    {"total_steps": 0}, {"total_steps": 5, "warmup_steps": 6}, {"total_steps": 5, "min_lr": 2.0}])
def test_bad_schedules_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        LrSchedule.warmup_cosine(1.0, **kwargs)


def test_optimizer_steps_counts_short_last_windows() -> None:
    assert optimizer_steps(10, epochs=3, accumulation=4) == 9
    assert optimizer_steps(8, epochs=2) == 16


@pytest.mark.mindspore
def test_built_schedule_gives_the_same_rate_at_every_step_and_keeps_the_last(lone_rank: Any) -> None:
    import mindspore as ms

    assert ms.get_context("mode") == ms.GRAPH_MODE, "parallel.init() selects GRAPH, as optimizers run"
    schedule = LrSchedule.warmup_cosine(0.5, total_steps=6, warmup_steps=2)
    cell = schedule.build()
    got = [float(cell(ms.Tensor([step], ms.int32)).asnumpy()) for step in range(9)]
    np.testing.assert_allclose(got, schedule.values() + [schedule.values()[-1]] * 3, rtol=1e-6)
