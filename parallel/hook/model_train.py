"""A save on preemption for scripts that train with MindSpore's ``Model.train`` (or ``fit``) and
save with its ``ModelCheckpoint``, without a line of them changed (the rank hook wraps both).

While a ``train`` runs under npu-launch, a callback after the script's own reports each step (a
``step`` event with the step's loss when the first step ends, then at most twice a second;
``saves_on_stop``: whether the call has a ``ModelCheckpoint``; ``last_words`` false) and looks
once a step for npu-launch's stop request (``contract.STOP_REQUEST_FILE``), which node 0
writes when at least one rank saves and every rank said whether it does. At the step named
there, or past it, every
``ModelCheckpoint`` of the call saves the step through its own ``end``: in its directory, under
the name its periodic saves take (``PREFIX-EPOCH_STEP.ckpt``), with what they hold; then the rank
exits 0. A rank without one stops at the same step (a data-parallel script often saves on rank 0
alone: its peers must not leave it waiting in the step's all-reduce). A rank signalled itself
(Slurm signals every process of a job step) waits for that word as the shared trainer's do
(``parallel.hook.preemption``).

Resuming is the script's own: it loads its newest checkpoint as after any stop (npu-launch
hands it the path, ``{checkpoint}``). Resumed the tutorials' way from a save made mid-epoch,
the call trains the rest of that epoch first (``parallel.hook.mid_epoch``). The running fit's place
goes to ``parallel.hook.script_saves``, which tells npu-launch of each file the script saves.

Nothing here imports MindSpore: ``Model.train``'s module has loaded it when this runs.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from typing import Any, Callable, Optional

from parallel import contract, events
from parallel.hook import mid_epoch, preemption, script_saves

REPORT_EVERY = 0.5
"""Seconds between two ``step`` events at most (the first step's is sent at once)."""


def stopping_train(real: Callable[..., Any]) -> Callable[..., Any]:
    """``Model.train`` (or ``fit``), with the stop callback added under npu-launch."""
    import inspect  # not at the rank's boot: the hook loads this module in every rank

    signature = inspect.signature(real)

    def train(*args: Any, **kwargs: Any) -> Any:
        path = preemption.stop_file()
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # MindSpore's own message, unchanged
            return real(*args, **kwargs)
        if not path:
            return real(*args, **kwargs)
        given = bound.arguments.get("callbacks")
        listed = list(given) if isinstance(given, (list, tuple)) else [] if given is None else [given]
        bound.arguments["callbacks"] = [*listed, _stop_callback(path, _checkpointers(listed))]
        rest = mid_epoch.rest_of_epoch(bound.arguments)
        resumed = mid_epoch.training_rest(bound.arguments["self"], bound.arguments, rest) \
            if rest is not None else contextlib.nullcontext()
        try:
            with preemption.deferred_sigterm(path), resumed:
                return real(*bound.args, **bound.kwargs)
        finally:
            script_saves.fit_ended()
    return functools.update_wrapper(train, real)


def _checkpointers(callbacks: list[Any]) -> list[Any]:
    """The ``ModelCheckpoint``s among ``callbacks`` (none in a MindSpore that has no such class)."""
    try:
        from mindspore.train.callback import ModelCheckpoint
    except ImportError:
        return []
    return [c for c in callbacks if isinstance(c, ModelCheckpoint)]


def _stop_callback(path: str, savers: list[Any]) -> Any:
    """The callback, a subclass of MindSpore's ``Callback`` made when one is needed."""
    from mindspore.train.callback import Callback

    class StopAndSave(Callback):
        """Reports steps; saves (with ``savers``) and stops at the step npu-launch asks for."""

        def __init__(self) -> None:
            super().__init__()
            self.reported = 0.0
            self.stop = preemption.StopStep(path)

        def on_train_begin(self, run_context: Any) -> None:
            script_saves.fit_began(run_context.original_args())

        def on_train_step_end(self, run_context: Any) -> None:
            params = run_context.original_args()
            step = int(params.cur_step_num)
            self._report(params, step)
            if not self.stop.reached(step):
                return
            for saver in savers:
                saver.end(run_context)  # forced; a no-op when a periodic save just took this step
            names = ", ".join(str(saver.latest_ckpt_file_name) for saver in savers)
            rank = contract.RankIdentity.from_environ(os.environ).rank
            preemption.stop_now(f"npu-launch: rank {rank} saved step {step} ({names}) and stops, "
                                "as asked" if savers else f"npu-launch: rank {rank} stops at step "
                                f"{step}, as asked (it has no ModelCheckpoint: another rank saves)")

        def _report(self, params: Any, step: int) -> None:
            now = time.monotonic()
            first = not self.reported
            if not first and now - self.reported < REPORT_EVERY:
                return
            self.reported = now
            said = {"log_every": 1, "saves_on_stop": bool(savers), "last_words": False} \
                if first else {}
            loss = _loss(getattr(params, "net_outputs", None))
            events.emit(contract.EVENT_STEP, step=step, epoch=int(params.cur_epoch_num),
                        **({"loss": loss} if loss is not None else {}), **said)

    return StopAndSave()


def _loss(outputs: Any) -> Optional[float]:
    """The step's loss from what the train network returned: a scalar, or the first of a tuple
    (a loss-scaling cell's ``(loss, overflow, scale)``); None when it is not one number."""
    if isinstance(outputs, (tuple, list)):
        outputs = outputs[0] if outputs else None
    try:
        value = outputs.asnumpy() if hasattr(outputs, "asnumpy") else outputs
        loss = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return loss if math.isfinite(loss) else None
