"""The shared trainer: mixed precision, loss scaling, accumulation, clipping, checkpoints, events.

One code path for CPU and Ascend: the step is a ``Cell`` whose ``construct`` runs
``value_and_grad``, the (data-parallel) gradient all-reduce, a finiteness check and the optimizer,
with a loss scaler written as plain graph ops (``cells.LossScaler``: MindSpore's functional
scalers follow the same rule, more slowly). ``Model`` with a loss-scale manager and
``TrainOneStepWithLossScaleCell`` do not run on CPU; a bare ``@ms.jit`` function was 1.5-4x
slower than a compiled ``Cell``.

::

    info = parallel.init()
    trainer = Trainer(net, loss_fn, optimizer, train_ds, eval_ds=eval_ds, amp_level="O1",
                      loss_scale="dynamic", ckpt_dir="ckpt", resume="auto", info=info)
    result = trainer.fit(epochs=10)
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from typing import Any, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import nn

from parallel import contract, events
from parallel.checkpoints import checkpoint, last_words
from parallel.hook import preemption
from parallel.trainer import amp
from parallel.trainer.api import (
    Callback,
    EpochInfo,
    EvalResult,
    FitResult,
    RankLike,
    ResumeMode,
    Signal,
    StepInfo,
    TrainerError,
    TrainOptions,
)
from parallel.trainer.cells import (
    AccumulateStep,
    Accumulators,
    ApplyAccumulated,
    EvalStep,
    NetWithLoss,
    RowGather,
    ScaledLoss,
    TrainStep,
    make_scaler,
)
from parallel.trainer.saving import CheckpointSteps, LastWordsSaver
from parallel.trainer.support import (
    DATA_PARALLEL_MODES,
    Meter,
    Run,
    as_numpy,
    batches_per_epoch,
    eval_counts,
    exec_mode,
    parallel_mode,
    rank_of,
    warn_about_context,
)

log = logging.getLogger("parallel.trainer")


_LINGER = 1.0
"""Seconds a rank whose step raised waits for a last-words request before it goes on dying."""


class Trainer(CheckpointSteps):
    """Trains ``network`` with ``loss_fn`` and ``optimizer`` on ``train_ds`` (a MindSpore dataset
    whose rows are ``(*inputs, label)``), evaluating on ``eval_ds``.

    Options are a :class:`TrainOptions` (``options=``) and/or its fields as keywords. ``info`` is
    this rank (anything with ``rank`` and ``world_size``, such as ``parallel.init()``'s result);
    without it the rank is read from the environment. With world size 1 nothing communicates.
    """

    def __init__(self, network: nn.Cell, loss_fn: nn.Cell, optimizer: nn.Optimizer, train_ds: Any,
                 eval_ds: Any = None, *, info: Optional[RankLike] = None,
                 callbacks: Sequence[Callback] = (), options: Optional[TrainOptions] = None,
                 **overrides: Any) -> None:
        self.options = dataclasses.replace(options or TrainOptions(), **overrides)
        self.rank, self.world_size = rank_of(info)
        self.network, self.loss_fn, self.optimizer = network, loss_fn, optimizer
        self.train_ds, self.eval_ds = train_ds, eval_ds
        self.callbacks = tuple(callbacks)
        self.batches_per_epoch = batches_per_epoch(train_ds)
        self.data_parallel = self.world_size > 1 and parallel_mode() in DATA_PARALLEL_MODES
        warn_about_context(self.world_size, info)
        self.amp_network = self._apply_amp()
        self.scaler = make_scaler(self.options.loss_scale)
        self._build_cells()
        self.position = checkpoint.DataPosition()
        self.resumed_from: Optional[int] = None
        self.last_checkpoint: Optional[str] = None
        self._saved_steps: set[int] = set()
        self._stop_file = preemption.stop_file()
        self._stop = preemption.StopStep(self._stop_file)
        self._pending_manifests: set[int] = set()
        self._confirmed_steps: list[int] = []
        self._gather: Optional[RowGather] = None
        self._replicas_checked = False
        self._save_lock = threading.Lock()
        self._listening = False
        self._progress = last_words.Progress.start(self.position)
        if self.options.resume is ResumeMode.AUTO:
            self._resume()

    # Setup -------------------------------------------------------------------------------------

    def _apply_amp(self) -> nn.Cell:
        level, dtype = self.options.amp_level, self.options.amp_dtype
        note = amp.device_note(level, dtype, ms.get_context("device_target"))
        if note:
            log.warning(note)
        return amp.apply_amp(self.network, level, dtype)

    def _build_cells(self) -> None:
        options, degree = self.options, self.world_size if self.data_parallel else 1
        scaled = ScaledLoss(NetWithLoss(self.amp_network, self.loss_fn), self.scaler)
        if options.grad_accumulation == 1:
            self._step = TrainStep(scaled, self.optimizer, self.scaler, options, degree)
            self._train_cells: tuple[nn.Cell, ...] = (self._step,)
        else:
            buffers = Accumulators(self.optimizer.parameters)
            self._accumulate = AccumulateStep(scaled, self.optimizer.parameters, buffers)
            self._apply = ApplyAccumulated(self.optimizer, self.scaler, options, degree, buffers)
            self._train_cells = (self._accumulate, self._apply)
        self._eval_step = EvalStep(self.amp_network, self.loss_fn)


    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without scaling); reading it waits for the last step."""
        return amp.scaler_state(self.scaler)[0]

    # Training ----------------------------------------------------------------------------------

    def fit(self, epochs: int, max_steps: Optional[int] = None) -> FitResult:
        """Train until epoch ``epochs`` (counted from 0, resumed epochs included) or until
        ``max_steps`` optimizer steps in total, whichever comes first."""
        if epochs < 1 or (max_steps is not None and max_steps < 1):
            raise TrainerError(f"fit needs epochs >= 1 and max_steps >= 1, "
                               f"got {epochs} and {max_steps}")
        run = Run(Meter(), exec_mode=exec_mode())
        self._check_replicas()
        for callback in self.callbacks:
            callback.on_fit_start(self)
        self._progress = last_words.Progress.start(self.position)
        listener = self._last_words_listener()
        self._listening = listener is not None
        try:
            with preemption.deferred_sigterm(self._stop_file):
                self._train(run, epochs, max_steps)
        except BaseException:
            if listener is not None:  # a peer's failure broke the step: its request may come
                listener.linger(_LINGER)
            raise
        finally:
            if listener is not None:
                listener.stop()
        return self._finish(run)

    def _last_words_listener(self) -> Optional[last_words.Listener]:
        """Under npu-launch, with checkpoints and peers: the thread that saves the last completed
        step when npu-launch asks, a peer having failed (``parallel.checkpoints.last_words``)."""
        if self.options.ckpt_dir is None or self.world_size < 2:
            return None
        why_not = "" if self.data_parallel else (
            f"the layout is sliced ({parallel_mode()}), no other rank holds a lost rank's state")
        listener = last_words.Listener.from_environ(self.rank, lambda: self._progress,
                                                    LastWordsSaver(self), why_not)
        return listener.start() if listener is not None else None

    def _train(self, run: Run, epochs: int, max_steps: Optional[int]) -> None:
        if self.position.epoch >= epochs or self._reached(max_steps):
            return
        batches = self._iterator(epochs)
        self._set_train(True)
        try:
            while self.position.epoch < epochs and not run.stop:
                self._train_epoch(run, batches, max_steps)
        finally:
            batches.stop()

    def _iterator(self, epochs: int) -> Any:
        # The pipeline starts at the consumed position, so a resumed run sees the same batches
        # (same per-epoch shuffles) as an uninterrupted one.
        start = self.position.epoch * self.batches_per_epoch + self.position.batch_in_epoch
        self.train_ds.set_init_step(start)
        try:
            return self.train_ds.create_tuple_iterator(num_epochs=epochs)
        finally:
            self.train_ds.set_init_step(0)

    def _train_epoch(self, run: Run, batches: Any, max_steps: Optional[int]) -> None:
        epoch = self.position.epoch
        for batch in batches:
            if self._micro_batch(run, batch):
                self._after_step(run)
                if run.stop or self._reached(max_steps):
                    run.stop = True
                    break
        if self.position.epoch == epoch and not run.stop:
            raise TrainerError(f"train_ds ended after {self.position.batch_in_epoch} batches of "
                               f"epoch {epoch}, but its get_dataset_size() is "
                               f"{self.batches_per_epoch}")
        self._end_epoch(run, epoch)

    def _micro_batch(self, run: Run, batch: Sequence[Any]) -> bool:
        """Feed one batch; True when it completed an optimizer step."""
        run.meter.add(int(batch[0].shape[0]))
        consumed = self.position.batch_in_epoch + 1
        if self.options.grad_accumulation == 1:
            began = self._begin_step()
            loss, finite = self._step(*batch)
        else:
            self._accumulate(*batch)
            window = (consumed - 1) % self.options.grad_accumulation + 1
            if window < self.options.grad_accumulation and consumed < self.batches_per_epoch:
                self.position = dataclasses.replace(self.position, batch_in_epoch=consumed)
                return False
            began = self._begin_step()
            loss, finite = self._apply(ms.Tensor(1.0 / window, ms.float32))
        self._advance(consumed)
        took = time.monotonic() - began if run.steps_run else None  # the first compiled
        held = self._hold() if self._listening else None
        self._progress = self._progress.complete(self.position, took, held)
        run.last_loss = loss
        run.epoch_losses.append(loss)
        run.pending_finite.append(finite)
        return True

    def _begin_step(self) -> float:
        """The call that updates the parameters starts now (for last words: not quiet)."""
        self._progress = self._progress.begin()
        return time.monotonic()

    def _advance(self, consumed: int) -> None:
        step = self.position.global_step + 1
        if consumed >= self.batches_per_epoch:
            self.position = checkpoint.DataPosition(self.position.epoch + 1, 0, step)
        else:
            self.position = checkpoint.DataPosition(self.position.epoch, consumed, step)

    def _after_step(self, run: Run) -> None:
        run.steps_run += 1
        if run.meter.started is None:
            run.last_loss.asnumpy()  # waits for the compiling first step before the clock starts
            run.meter.start()
        step = self.position.global_step
        if step % self.options.log_every == 0:
            self._emit_step(run)
        if self.callbacks:
            self._step_callbacks(run)
        every = self.options.ckpt_every_steps
        if every and step % every == 0:
            self._save(run)
        if self._stop.reached(step):  # a rank without a ckpt_dir stops there too, saving nothing
            self._save(run)
            done = "saved step" if self.options.ckpt_dir is not None else "stops at step"
            preemption.stop_now(f"npu-launch trainer: rank {self.rank} {done} {step} and stops, "
                                "as asked")

    def _step_callbacks(self, run: Run) -> None:
        info = StepInfo(self.position.global_step, self.position.epoch,
                        self.position.batch_in_epoch, run.last_loss)
        for callback in self.callbacks:
            if callback.on_step_end(info) is Signal.STOP:
                run.stop = True

    def _emit_step(self, run: Run) -> None:
        self._count_skipped(run)
        mode = {} if run.mode_reported else {
            "exec_mode": run.exec_mode.value, "log_every": self.options.log_every,
            "saves_on_stop": self.options.ckpt_dir is not None}
        run.mode_reported = True
        events.emit(contract.EVENT_STEP, step=self.position.global_step, epoch=self.position.epoch,
                    loss=float(run.last_loss.asnumpy()), samples_per_s=run.meter.rate(),
                    loss_scale=self.loss_scale, **mode)

    def _count_skipped(self, run: Run) -> None:
        run.skipped += sum(not bool(np.asarray(as_numpy(f))) for f in run.pending_finite)
        run.pending_finite.clear()

    def _reached(self, max_steps: Optional[int]) -> bool:
        return max_steps is not None and self.position.global_step >= max_steps

    def _end_epoch(self, run: Run, epoch: int) -> None:
        if run.epoch_losses:
            run.last_epoch_loss = float(np.mean([as_numpy(loss) for loss in run.epoch_losses]))
            run.epoch_losses.clear()
        if self.position.epoch == epoch:  # stopped part-way: no evaluation, no epoch hooks
            return
        started = time.perf_counter()
        if self.eval_ds is not None and self.position.epoch % self.options.eval_every_epochs == 0:
            run.eval = self.evaluate()
            self._set_train(True)  # evaluation switched the shared network to inference
        run.meter.pause_since(started)
        every = self.options.ckpt_every_epochs
        if every and self.position.epoch % every == 0:
            self._save(run)
        self._epoch_callbacks(run, epoch)

    def _epoch_callbacks(self, run: Run, epoch: int) -> None:
        info = EpochInfo(epoch, self.position.global_step, run.last_epoch_loss, run.eval)
        for callback in self.callbacks:
            if callback.on_epoch_end(info) is Signal.STOP:
                run.stop = True

    def _finish(self, run: Run) -> FitResult:
        if run.last_loss is not None:
            run.last_loss.asnumpy()
        rate = run.meter.rate()
        if run.steps_run:
            self._save(run)
        self._complete_pending()
        self._count_skipped(run)
        result = FitResult(
            steps=self.position.global_step, steps_run=run.steps_run, epochs=self.position.epoch,
            final_loss=run.last_epoch_loss, eval=run.eval, samples_per_s=rate,
            global_samples_per_s=rate * self.world_size, skipped_steps=run.skipped,
            loss_scale=self.loss_scale, resumed_from=self.resumed_from,
            stopped_early=run.stop, last_checkpoint=self.last_checkpoint)
        events.emit(contract.EVENT_FINISHED, steps=result.steps, final_loss=result.final_loss,
                    samples_per_s=result.samples_per_s, exec_mode=run.exec_mode.value)
        for callback in self.callbacks:
            callback.on_fit_end(result)
        return result

    def _set_train(self, mode: bool) -> None:
        for cell in self._train_cells:
            cell.set_train(mode)

    # Evaluation --------------------------------------------------------------------------------

    def evaluate(self) -> EvalResult:
        """Loss and accuracy over ``eval_ds``, summed over every rank's shard in data parallel;
        reported to the launcher as an ``eval`` event."""
        if self.eval_ds is None:
            raise TrainerError("evaluate() needs an eval_ds")
        self._eval_step.set_train(False)
        totals = np.zeros(3, dtype=np.float64)  # loss sum, correct, samples
        for batch in self.eval_ds.create_tuple_iterator(num_epochs=1):
            loss, logits = self._eval_step(*batch)
            totals += eval_counts(float(loss.asnumpy()), logits.asnumpy(), batch[-1].asnumpy())
        if self.data_parallel:
            totals = self._gather_rows(totals.astype(np.float32)).sum(axis=0)
        samples = int(totals[2])
        accuracy = totals[1] / samples if samples and not math.isnan(totals[1]) else None
        result = EvalResult(float(totals[0] / max(samples, 1)), accuracy, samples)
        events.emit(contract.EVENT_EVAL, epoch=self.position.epoch, step=self.position.global_step,
                    loss=result.loss, accuracy=result.accuracy, samples=result.samples)
        return result
