"""The compiled cells of the trainer's step: MindSpore compiles each ``construct`` once.

One step = ``value_and_grad`` of the (scaled) loss, the data-parallel gradient all-reduce,
unscaling, the finiteness check, clipping, the optimizer and the loss scaler's adjustment, all in
one graph (a bare ``@ms.jit`` function was 1.5-4x slower on CPU). ``parallel.trainer`` builds
and drives them.
"""
from __future__ import annotations

from typing import Any, Optional

import mindspore as ms
from mindspore import amp as ms_amp
from mindspore import nn, ops

from parallel.trainer import amp
from parallel.trainer.api import TrainOptions


class LossScaler:
    """The loss scale as plain ops inside the step's graph: dynamic or fixed.

    The same rule as ``mindspore.amp.DynamicLossScaler`` (halve on an overflow, never below 1,
    and reset the count; grow by ``factor`` after ``window`` clean steps) and the same state
    (``scale_value``, ``counter``), but MindSpore's scalers run every call as a ``jit`` function
    of its own, a sub-graph call inside the step: in a 2-rank CPU job that cost about 8% of the
    step's time.
    """

    def __init__(self, init_scale: float, factor: int, window: int, dynamic: bool) -> None:
        self.scale_value = ms.Parameter(ms.Tensor(init_scale, ms.float32), name="scale_value",
                                        requires_grad=False)
        self.counter = (ms.Parameter(ms.Tensor(0, ms.int32), name="counter", requires_grad=False)
                        if dynamic else None)
        self.dynamic = dynamic
        self.factor = float(factor)
        self.window = window
        self.hyper_map = ops.HyperMap()

    def scale(self, loss: Any) -> Any:
        return loss * self.scale_value

    def unscale(self, loss: Any) -> Any:
        return loss / self.scale_value

    def unscale_grads(self, grads: Any) -> Any:
        return self.hyper_map(ops.partial(_times, 1.0 / self.scale_value), grads)

    def adjust(self, finite: Any) -> Any:
        if self.counter is not None:  # dynamic (a fixed scale has no counter)
            grown = self.scale_value * self.factor
            kept = ops.select(self.counter == self.window - 1,
                              ops.select(ops.isfinite(grown), grown, self.scale_value),
                              self.scale_value)
            shrunk = ops.maximum(ops.ones((), ms.float32), self.scale_value / self.factor)
            ops.assign(self.scale_value, ops.select(finite, kept, shrunk))
            ops.assign(self.counter, ((self.counter + 1) % self.window) * finite.astype(ms.int32))
        return finite


def make_scaler(config: amp.LossScaleConfig) -> Optional[LossScaler]:
    """The loss scaler for ``config``; ``None`` for ``none``."""
    if config.mode is amp.LossScaleMode.NONE:
        return None
    return LossScaler(float(config.init_scale), config.factor, config.window,
                      dynamic=config.mode is amp.LossScaleMode.DYNAMIC)


def all_finite(grads: Any) -> Any:
    """Whether every gradient is finite: ``g * 0`` is 0 where ``g`` is finite and NaN where it is
    not, so one sum per gradient decides, without a sum that could itself overflow.

    Only where overflow makes inf/NaN (CPU, GPU): Ascend 910 saturates float16 instead, and only
    its status registers, which ``mindspore.amp.all_finite`` reads there, see the overflow.
    """
    return ops.isfinite(ops.addn([ops.sum(grad * 0) for grad in grads]))


def _times(factor: Any, grad: Any) -> Any:
    return grad * factor.astype(grad.dtype)


def _after(everything: Any, grad: Any) -> Any:
    return ops.depend(grad, everything)


class NetWithLoss(nn.Cell):
    """``loss_fn(network(*inputs), label)`` for a batch ``(*inputs, label)``."""

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.network = network
        self.loss_fn = loss_fn

    def construct(self, *batch: Any) -> Any:
        return self.loss_fn(self.network(*batch[:-1]), batch[-1])


class ScaledLoss(nn.Cell):
    """The loss times the loss scale: what the backward pass differentiates."""

    def __init__(self, net_with_loss: nn.Cell, scaler: Any) -> None:
        super().__init__(auto_prefix=False)
        self.net_with_loss = net_with_loss
        self.scaler = scaler
        self.scaled = scaler is not None

    def construct(self, *batch: Any) -> Any:
        loss = self.net_with_loss(*batch)
        if self.scaled:
            loss = self.scaler.scale(loss)
        return loss


class Update(nn.Cell):
    """The common tail of a step: all-reduce, unscale, finiteness, clipping, update, rescale."""

    def __init__(self, optimizer: nn.Optimizer, scaler: Any, options: TrainOptions,
                 reduce_degree: int) -> None:
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.scaler = scaler
        self.scaled = scaler is not None
        self.check_finite = options.checks_finite
        self.on_ascend = ms.get_context("device_target") == "Ascend"
        self.clip = options.clip_grad_norm is not None
        self.clip_norm = float(options.clip_grad_norm or 1.0)
        self.reduce = reduce_degree > 1
        self.reducer = (nn.DistributedGradReducer(self.weights, True, reduce_degree)
                        if self.reduce else nn.Identity())
        self.hyper_map = ops.HyperMap()

    def unscale_loss(self, loss: Any) -> Any:
        if self.scaled:
            loss = self.scaler.unscale(loss)
        return loss

    def update(self, grads: Any) -> Any:
        if self.reduce:
            # One all-reduce per gradient, and without this each update would run once its own
            # had: a peer that died with some of a step's all-reduces done would leave this rank
            # with part of the step applied, which last words would then save as the step
            # before. After every all-reduce, the step is applied whole or not at all.
            grads = self.reducer(grads)
            grads = self.hyper_map(ops.partial(_after, grads), grads)
        if self.scaled:
            grads = self.scaler.unscale_grads(grads)
        finite = True
        if self.check_finite and self.on_ascend:
            finite = ms_amp.all_finite(grads)
        elif self.check_finite:
            finite = all_finite(grads)
        if self.clip:
            grads = ops.clip_by_global_norm(grads, self.clip_norm)
        if finite:
            self.optimizer(grads)
        if self.scaled:
            self.scaler.adjust(finite)
        return finite


class TrainStep(Update):
    """One batch, one update."""

    def __init__(self, scaled_loss: nn.Cell, optimizer: nn.Optimizer, scaler: Any,
                 options: TrainOptions, reduce_degree: int) -> None:
        super().__init__(optimizer, scaler, options, reduce_degree)
        self.scaled_loss = scaled_loss
        self.grad_fn = ms.value_and_grad(scaled_loss, None, self.weights)

    def construct(self, *batch: Any) -> Any:
        loss, grads = self.grad_fn(*batch)
        return self.unscale_loss(loss), self.update(grads)


class Accumulators:
    """Buffers the accumulate and apply steps share: one per weight, plus the loss sum."""

    def __init__(self, weights: Any) -> None:
        self.grads = weights.clone(prefix="npu_launch_accum", init="zeros")
        self.loss = ms.Parameter(ms.Tensor(0.0, ms.float32), name="npu_launch_accum_loss",
                                 requires_grad=False)


class AccumulateStep(nn.Cell):
    """Adds one micro-batch's (scaled) gradients and loss to the accumulators."""

    def __init__(self, scaled_loss: nn.Cell, weights: Any, buffers: Accumulators) -> None:
        super().__init__(auto_prefix=False)
        self.scaled_loss = scaled_loss
        self.grad_fn = ms.value_and_grad(scaled_loss, None, weights)
        self.grads = buffers.grads
        self.loss = buffers.loss
        self.hyper_map = ops.HyperMap()

    def construct(self, *batch: Any) -> Any:
        loss, grads = self.grad_fn(*batch)
        self.hyper_map(ops.assign_add, self.grads, grads)
        ops.assign_add(self.loss, loss)
        return loss


class ApplyAccumulated(Update):
    """Averages the accumulators over the window, updates, and zeroes them."""

    def __init__(self, optimizer: nn.Optimizer, scaler: Any, options: TrainOptions,
                 reduce_degree: int, buffers: Accumulators) -> None:
        super().__init__(optimizer, scaler, options, reduce_degree)
        self.grads = buffers.grads
        self.loss = buffers.loss

    def construct(self, inv_count: Any) -> Any:
        grads = self.hyper_map(ops.partial(ops.mul, inv_count), self.grads)
        loss = self.unscale_loss(self.loss * inv_count)
        finite = self.update(grads)
        self.hyper_map(ops.assign, self.grads, self.hyper_map(ops.zeros_like, self.grads))
        ops.assign(self.loss, ops.zeros_like(self.loss))
        return loss, finite


class EvalStep(nn.Cell):
    """Forward only: ``(loss, logits)``."""

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell) -> None:
        super().__init__(auto_prefix=False)
        self.network = network
        self.loss_fn = loss_fn

    def construct(self, *batch: Any) -> Any:
        logits = self.network(*batch[:-1])
        return self.loss_fn(logits, batch[-1]), logits


class RowGather(nn.Cell):
    """AllGather of one small float32 row per rank over the world group."""

    def __init__(self) -> None:
        super().__init__()
        self.all_gather = ops.AllGather()

    def construct(self, row: Any) -> Any:
        return self.all_gather(row)
