"""Pipeline parallelism the way MindSpore 2.10 expects it.

MindSpore cuts a network into stages by each Cell's ``pipeline_stage`` attribute and runs one
stage per group of ``world / pp`` ranks; ``mindspore.parallel.nn.Pipeline`` (``nn.PipelineCell``
before 2.5) slices every batch into ``micro_batches`` micro-batches and sums their losses, which is
what lets the stages work at the same time. Both need ``pipeline_stages`` in the auto-parallel
context (``parallel.init`` sets it) and run on Ascend only; built here, they run stand-alone on CPU,
where the wrapper still splits the batch and adds up the micro-batch losses.

Training with ``ms.value_and_grad`` instead of ``Model`` also needs
``mindspore.parallel.nn.PipelineGradReducer`` around the optimizer's gradients (MindSpore's docs).
"""
from __future__ import annotations

import itertools
from typing import List, Optional, Sequence

from mindspore import nn

from parallel.config import ParallelConfig


def split_stages(weights: Sequence[float], pp: int) -> List[int]:
    """The stage of each layer: contiguous runs, every stage non-empty, the heaviest stage as light
    as possible (exact, by dynamic programming over cut points)."""
    if pp < 1 or len(weights) < pp:
        raise ValueError(f"cannot split {len(weights)} layers into {pp} non-empty pipeline stages")
    if any(weight < 0 for weight in weights):
        raise ValueError("layer weights must not be negative")
    cuts = _best_cuts(list(itertools.accumulate(weights, initial=0.0)), len(weights), pp)
    return [stage for stage, (start, end) in enumerate(zip(cuts, cuts[1:])) for _ in range(start, end)]


def parameter_weights(cells: Sequence[nn.Cell]) -> List[float]:
    """Each cell's trainable parameter count (plus one, so parameter-free cells count a little)."""
    return [1.0 + sum(p.size for p in cell.trainable_params()) for cell in cells]


def pipeline_network(cells: Sequence[nn.Cell], loss_fn: nn.Cell, config: ParallelConfig,
                     weights: Optional[Sequence[float]] = None) -> nn.Cell:
    """``cells`` in sequence with a loss, cut into ``config.pp`` stages and micro-batched.

    ``weights`` balance the stages (default: one per cell; see ``parameter_weights``). The loss runs
    on the last stage. With ``pp == 1`` this is a plain ``WithLossCell``: micro-batching without
    stages only adds work.
    """
    backbone = nn.SequentialCell(list(cells))
    with_loss = nn.WithLossCell(backbone, loss_fn)
    if config.pp == 1:
        return with_loss
    stages = split_stages(weights if weights is not None else [1.0] * len(cells), config.pp)
    for cell, stage in zip(cells, stages):
        cell.pipeline_stage = stage
    loss_fn.pipeline_stage = config.pp - 1
    return _pipeline_wrapper()(with_loss, config.micro_batches)


def _pipeline_wrapper() -> type:
    try:
        from mindspore.parallel.nn import Pipeline
    except ImportError:  # MindSpore < 2.5
        return nn.PipelineCell
    return Pipeline


def _best_cuts(prefix: List[float], layers: int, pp: int) -> List[int]:
    # cost[s][i]: lightest possible heaviest stage when the first i layers form s stages.
    infinity = float("inf")
    cost = [[infinity] * (layers + 1) for _ in range(pp + 1)]
    choice = [[0] * (layers + 1) for _ in range(pp + 1)]
    cost[0][0] = 0.0
    for stages in range(1, pp + 1):
        for end in range(stages, layers + 1):
            for start in range(stages - 1, end):
                heaviest = max(cost[stages - 1][start], prefix[end] - prefix[start])
                if heaviest < cost[stages][end]:
                    cost[stages][end], choice[stages][end] = heaviest, start
    cuts = [layers]
    for stages in range(pp, 0, -1):
        cuts.append(choice[stages][cuts[-1]])
    return cuts[::-1]
