"""Pipeline stages and micro-batching, built with MindSpore's own wrapper and run stand-alone on CPU."""
from __future__ import annotations

import itertools

import mindspore as ms
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindspore import nn
from mindspore.parallel.nn import PipelineCell

from parallel.config import ParallelConfig
from parallel.mode.pipeline import parameter_weights, pipeline_network, split_stages

pytestmark = pytest.mark.mindspore  # parallel.mode.pipeline imports MindSpore


def _brute_force_heaviest(weights, pp):
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(weights)), pp - 1):
        bounds = (0, *cuts, len(weights))
        best = min(best, max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


@settings(max_examples=150, deadline=None)
@given(weights=st.lists(st.integers(0, 20), min_size=1, max_size=9), data=st.data())
def test_stages_are_contiguous_non_empty_and_as_balanced_as_possible(weights, data):
    pp = data.draw(st.integers(1, len(weights)))
    stages = split_stages(weights, pp)
    assert stages[0] == 0 and stages[-1] == pp - 1
    assert all(b - a in (0, 1) for a, b in zip(stages, stages[1:]))
    heaviest = max(sum(w for w, s in zip(weights, stages) if s == k) for k in range(pp))
    assert heaviest == _brute_force_heaviest(weights, pp)


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 non-empty pipeline stages"):
        split_stages([1, 1], 3)


def _cells():
    ms.set_seed(3)
    return [nn.Dense(4, 16), nn.ReLU(), nn.Dense(16, 16), nn.ReLU(), nn.Dense(16, 2)]


def test_pipeline_network_assigns_stages_and_puts_the_loss_last():
    cells, loss = _cells(), nn.MSELoss()
    config = ParallelConfig(mode="semi", pp=2, micro_batches=4).validate(4)
    network = pipeline_network(cells, loss, config, weights=parameter_weights(cells))
    # Weights 81, 1, 273, 1, 35: stages 82 | 309 beat 355 | 36.
    assert [cell.pipeline_stage for cell in cells] == [0, 0, 1, 1, 1]
    assert loss.pipeline_stage == 1
    assert isinstance(network, PipelineCell) and network.micro_size == 4


def test_the_wrapped_network_sums_the_losses_of_its_micro_batches():
    cells, loss = _cells(), nn.MSELoss()
    config = ParallelConfig(mode="semi", pp=2, micro_batches=4).validate(2)
    network = pipeline_network(cells, loss, config)
    x = ms.Tensor(np.random.default_rng(0).random((8, 4), np.float32))
    y = ms.Tensor(np.random.default_rng(1).random((8, 2), np.float32))
    with_loss = nn.WithLossCell(nn.SequentialCell(cells), loss)
    per_micro = [float(with_loss(x[2 * i:2 * i + 2], y[2 * i:2 * i + 2]).asnumpy()) for i in range(4)]
    assert float(network(x, y).asnumpy()) == pytest.approx(sum(per_micro), rel=1e-6)
    assert float(network(x, y).asnumpy()) != pytest.approx(float(with_loss(x, y).asnumpy()), rel=1e-3)


def test_without_a_pipeline_it_is_a_plain_loss_cell():
    network = pipeline_network(_cells(), nn.MSELoss(), ParallelConfig().validate(2))
    assert type(network) is nn.WithLossCell
