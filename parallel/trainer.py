"""The shared trainer: mixed precision, loss scaling, accumulation, clipping, checkpoints, events.

One code path for CPU and Ascend: the step is a ``Cell`` whose ``construct`` runs
``value_and_grad``, the (data-parallel) gradient all-reduce, a finiteness check and the optimizer,
with a loss scaler written as plain graph ops (``train_cells.LossScaler``: MindSpore's functional
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
import enum
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence, Union

import mindspore as ms
import numpy as np
from mindspore import nn

from parallel import amp, checkpoint, contract, events, preemption
from parallel.config import ExecMode
from parallel.train_cells import (
    AccumulateStep,
    Accumulators,
    ApplyAccumulated,
    EvalStep,
    NetWithLoss,
    RowGather,
    ScaledLoss,
    TrainStep,
)

log = logging.getLogger(__name__)


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
    """Anything saying who this rank is (``parallel.setup.RankInfo``, ``RankIdentity``)."""

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


class Callback:
    """Hooks into :meth:`Trainer.fit`; override what you need. Returning ``Signal.STOP`` from a
    step or epoch hook ends training after that step (a checkpoint is saved if configured)."""

    def on_fit_start(self, trainer: "Trainer") -> None:
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


# Throughput --------------------------------------------------------------------------------------

class _Meter:
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
class _Run:
    """Mutable bookkeeping of one :meth:`Trainer.fit` call."""

    meter: _Meter
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


# The trainer -------------------------------------------------------------------------------------

class Trainer:
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
        self.rank, self.world_size = _rank_of(info)
        self.network, self.loss_fn, self.optimizer = network, loss_fn, optimizer
        self.train_ds, self.eval_ds = train_ds, eval_ds
        self.callbacks = tuple(callbacks)
        self.batches_per_epoch = _batches_per_epoch(train_ds)
        self.data_parallel = self.world_size > 1 and _parallel_mode() in _DATA_PARALLEL_MODES
        _warn_about_context(self.world_size, info)
        self.amp_network = self._apply_amp()
        self.scaler = amp.make_scaler(self.options.loss_scale)
        self._build_cells()
        self.position = checkpoint.DataPosition()
        self.resumed_from: Optional[int] = None
        self.last_checkpoint: Optional[str] = None
        self._saved_steps: set[int] = set()
        self._stop_file = preemption.stop_file()
        self._stop_step: Optional[int] = None
        self._pending_manifests: set[int] = set()
        self._confirmed_steps: list[int] = []
        self._gather: Optional[RowGather] = None
        self._replicas_checked = False
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

    def _resume(self) -> None:
        ckpt_dir = self._ckpt_dir()
        manifest = self._launcher_resume_point(ckpt_dir) or checkpoint.latest_complete(ckpt_dir)
        if manifest is None:
            log.info("resume=auto: no complete checkpoint in %s, starting fresh", ckpt_dir)
            return
        if manifest.world_size != self.world_size:
            raise checkpoint.CheckpointError(
                f"{checkpoint.step_dir(ckpt_dir, manifest.step)}: saved by "
                f"{manifest.world_size} ranks, this run has {self.world_size}")
        self.load(manifest)

    def _launcher_resume_point(self, ckpt_dir: Union[str, Path]) -> Optional[checkpoint.Manifest]:
        """The step npu-launch's restart resumes from (``contract.RESUME_STEP``): complete across
        the job even where this host's directory alone cannot show it (the launcher put the
        manifest beside this rank's file before it started)."""
        text = os.environ.get(contract.RESUME_STEP, "").strip()
        if not text:
            return None
        manifest = checkpoint.read_manifest(ckpt_dir, int(text))
        if manifest is None:
            raise checkpoint.CheckpointError(
                f"{checkpoint.step_dir(ckpt_dir, int(text))}: npu-launch resumes from step {text}, "
                f"but this rank finds no manifest there (is ckpt_dir the one the job wrote?)")
        return manifest

    def load(self, manifest: checkpoint.Manifest) -> None:
        """Restore network, optimizer state, loss scale and data position from ``manifest``."""
        loaded = checkpoint.load_rank(self._ckpt_dir(), manifest, self.rank,
                                      verify=self.options.verify_checksums)
        _load_into(self.network, loaded.params, "network")
        _load_into(self.optimizer, loaded.params, "optimizer")
        amp.restore_scaler(self.scaler, loaded.extras.get("loss_scale", 1.0),
                           int(loaded.extras.get("loss_scale_counter", 0)))
        self.position = loaded.position
        self.resumed_from = manifest.step
        self._saved_steps.add(manifest.step)
        self._confirmed_steps.append(manifest.step)  # complete: every rank saved it
        log.info("resumed from step %d (epoch %d, batch %d)", manifest.step,
                 loaded.position.epoch, loaded.position.batch_in_epoch)

    def _ckpt_dir(self) -> Union[str, Path]:
        if self.options.ckpt_dir is None:
            raise TrainerError("loading a checkpoint needs a ckpt_dir")
        return self.options.ckpt_dir

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
        run = _Run(_Meter(), exec_mode=_exec_mode())
        self._check_replicas()
        for callback in self.callbacks:
            callback.on_fit_start(self)
        with preemption.deferred_sigterm(self._stop_file):
            self._train(run, epochs, max_steps)
        return self._finish(run)

    def _train(self, run: _Run, epochs: int, max_steps: Optional[int]) -> None:
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

    def _train_epoch(self, run: _Run, batches: Any, max_steps: Optional[int]) -> None:
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

    def _micro_batch(self, run: _Run, batch: Sequence[Any]) -> bool:
        """Feed one batch; True when it completed an optimizer step."""
        run.meter.add(int(batch[0].shape[0]))
        consumed = self.position.batch_in_epoch + 1
        if self.options.grad_accumulation == 1:
            loss, finite = self._step(*batch)
        else:
            self._accumulate(*batch)
            window = (consumed - 1) % self.options.grad_accumulation + 1
            if window < self.options.grad_accumulation and consumed < self.batches_per_epoch:
                self.position = dataclasses.replace(self.position, batch_in_epoch=consumed)
                return False
            loss, finite = self._apply(ms.Tensor(1.0 / window, ms.float32))
        self._advance(consumed)
        run.last_loss = loss
        run.epoch_losses.append(loss)
        run.pending_finite.append(finite)
        return True

    def _advance(self, consumed: int) -> None:
        step = self.position.global_step + 1
        if consumed >= self.batches_per_epoch:
            self.position = checkpoint.DataPosition(self.position.epoch + 1, 0, step)
        else:
            self.position = checkpoint.DataPosition(self.position.epoch, consumed, step)

    def _after_step(self, run: _Run) -> None:
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
        if self._stop_at(step):
            self._save(run)
            print(f"npu-launch trainer: rank {self.rank} saved step {step} and stops, as asked",
                  flush=True)
            sys.stderr.flush()
            # Every rank stops at this step: MindSpore's exit handlers would wait seconds on
            # the cluster's finalisation that the launcher's --kill-timeout needs for the save.
            os._exit(0)

    def _stop_at(self, step: int) -> bool:
        """Whether npu-launch asked every rank to save and stop at ``step`` or before
        (``contract.STOP_REQUEST_FILE``; one ``stat`` a step until it exists)."""
        if self._stop_step is None:
            if not self._stop_file or not os.path.exists(self._stop_file):
                return False
            word = preemption.read_word(self._stop_file)
            if word is None or not word.isdigit():  # being written, or no save: not now
                return False
            self._stop_step = int(word)
        return step >= self._stop_step and self.options.ckpt_dir is not None

    def _step_callbacks(self, run: _Run) -> None:
        info = StepInfo(self.position.global_step, self.position.epoch,
                        self.position.batch_in_epoch, run.last_loss)
        for callback in self.callbacks:
            if callback.on_step_end(info) is Signal.STOP:
                run.stop = True

    def _emit_step(self, run: _Run) -> None:
        self._count_skipped(run)
        mode = {} if run.mode_reported else {
            "exec_mode": run.exec_mode.value, "log_every": self.options.log_every,
            "saves_on_stop": self.options.ckpt_dir is not None}
        run.mode_reported = True
        events.emit(contract.EVENT_STEP, step=self.position.global_step, epoch=self.position.epoch,
                    loss=float(run.last_loss.asnumpy()), samples_per_s=run.meter.rate(),
                    loss_scale=self.loss_scale, **mode)

    def _count_skipped(self, run: _Run) -> None:
        run.skipped += sum(not bool(np.asarray(_numpy(f))) for f in run.pending_finite)
        run.pending_finite.clear()

    def _reached(self, max_steps: Optional[int]) -> bool:
        return max_steps is not None and self.position.global_step >= max_steps

    def _end_epoch(self, run: _Run, epoch: int) -> None:
        if run.epoch_losses:
            run.last_epoch_loss = float(np.mean([_numpy(loss) for loss in run.epoch_losses]))
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

    def _epoch_callbacks(self, run: _Run, epoch: int) -> None:
        info = EpochInfo(epoch, self.position.global_step, run.last_epoch_loss, run.eval)
        for callback in self.callbacks:
            if callback.on_epoch_end(info) is Signal.STOP:
                run.stop = True

    def _finish(self, run: _Run) -> FitResult:
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
            totals += _eval_counts(float(loss.asnumpy()), logits.asnumpy(), batch[-1].asnumpy())
        if self.data_parallel:
            totals = self._gather_rows(totals.astype(np.float32)).sum(axis=0)
        samples = int(totals[2])
        accuracy = totals[1] / samples if samples and not math.isnan(totals[1]) else None
        result = EvalResult(float(totals[0] / max(samples, 1)), accuracy, samples)
        events.emit(contract.EVENT_EVAL, epoch=self.position.epoch, step=self.position.global_step,
                    loss=result.loss, accuracy=result.accuracy, samples=result.samples)
        return result

    # Checkpoints -------------------------------------------------------------------------------

    def _save(self, run: _Run) -> None:
        step = self.position.global_step
        if self.options.ckpt_dir is None or step in self._saved_steps:
            return
        started = time.perf_counter()
        entry = checkpoint.save_rank(self.options.ckpt_dir, step, self.rank, self._state_params(),
                                     self.position, self._extras())
        self._saved_steps.add(step)
        self._check_replicas(force=True)  # also the barrier before rank 0 looks for all files
        self._pending_manifests.add(step)
        self._complete_pending()
        self._prune_own(step)
        path = os.path.abspath(checkpoint.step_dir(self.options.ckpt_dir, step) / entry.name)
        self.last_checkpoint = path
        events.emit(contract.EVENT_CHECKPOINT, step=step, path=path, name=entry.name,
                    size=entry.size, sha256=entry.sha256,
                    position=dataclasses.asdict(entry.position), world_size=self.world_size)
        for callback in self.callbacks:
            callback.on_checkpoint(step, path)
        run.meter.pause_since(started)

    def _prune_own(self, step: int) -> None:
        """Keep-last-K for this rank's own files, on whatever host they are: in data
        parallelism every rank has passed the replica check's all-gather after saving ``step``,
        so every rank's file of it exists, and older steps beyond the K newest such are this
        rank's to delete (rank 0 alone, on a disk that holds every rank's files, would
        otherwise be the only one to prune)."""
        if not self.data_parallel or self.options.ckpt_dir is None:
            return
        self._confirmed_steps.append(step)
        if len(self._confirmed_steps) >= self.options.keep_last:  # K steps known complete
            oldest_kept = self._confirmed_steps[-self.options.keep_last]
            checkpoint.prune_rank(self.options.ckpt_dir, self.rank, oldest_kept)

    def _state_params(self) -> list[Any]:
        params = {p.name: p for p in self.network.get_parameters()}
        params.update((p.name, p) for p in self.optimizer.get_parameters())
        return list(params.values())

    def _extras(self) -> dict[str, float]:
        scale, counter = amp.scaler_state(self.scaler)
        return {"loss_scale": scale, "loss_scale_counter": counter}

    def _complete_pending(self) -> None:
        if self.rank != 0 or self.options.ckpt_dir is None:
            return
        for step in sorted(self._pending_manifests):
            done = checkpoint.mark_complete(self.options.ckpt_dir, step, self.world_size,
                                            keep_last=self.options.keep_last)
            if done is not None:
                self._pending_manifests.discard(step)

    # Data-parallel replicas --------------------------------------------------------------------

    def _check_replicas(self, force: bool = False) -> None:
        if not self.data_parallel or (self._replicas_checked and not force):
            return
        params = [p for p in self.network.trainable_params()]
        digest = checkpoint.parameters_digest(params)
        rows = self._gather_rows(_digest_row(digest))
        checkpoint.check_replicas([_row_digest(row) for row in rows], self.position.global_step)
        self._replicas_checked = True

    def _gather_rows(self, row: np.ndarray) -> np.ndarray:
        # Every row is padded to one width, so the all-gather compiles once (each compile costs
        # MindSpore a graph build and a gc.collect(), about 0.2-0.4 s on this CPU).
        if self._gather is None:
            self._gather = RowGather()
        padded = np.zeros((1, _GATHER_WIDTH), np.float32)
        padded[0, :row.size] = row
        return self._gather(ms.Tensor(padded)).asnumpy()[:, :row.size]


# Helpers ------------------------------------------------------------------------------------------

_DATA_PARALLEL_MODES = ("data_parallel", "hybrid_parallel")
_GATHER_WIDTH = 4  # the widest row gathered: a parameter digest (eval totals take 3)


def _rank_of(info: Optional[RankLike]) -> tuple[int, int]:
    if info is None:
        info = contract.RankIdentity.from_environ(os.environ)
    rank, world = int(info.rank), int(info.world_size)
    if world < 1 or not 0 <= rank < world:
        raise TrainerError(f"rank {rank} is not in a world of {world}")
    return rank, world


def _exec_mode() -> ExecMode:
    """How MindSpore runs the step cells now: what a script set after ``parallel.init()`` counts."""
    return ExecMode.GRAPH if ms.get_context("mode") == ms.GRAPH_MODE else ExecMode.PYNATIVE


def _parallel_mode() -> str:
    return str(ms.get_auto_parallel_context("parallel_mode"))


def _warn_about_context(world_size: int, info: Optional[RankLike]) -> None:
    if ms.get_context("mode") == ms.PYNATIVE_MODE:
        log.warning("PyNative mode (%s): the train step runs eagerly, about 2x slower than in "
                    "GRAPH_MODE", _pynative_source(info))
    if world_size > 1 and _parallel_mode() == "stand_alone":
        log.warning("world size %d but parallel mode stand_alone: gradients are not all-reduced, "
                    "each rank trains on its own (call parallel.init() first)", world_size)


def _pynative_source(info: Optional[RankLike]) -> str:
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


def _batches_per_epoch(dataset: Any) -> int:
    if not hasattr(dataset, "create_tuple_iterator") or not hasattr(dataset, "set_init_step"):
        raise TrainerError(f"train_ds must be a mindspore.dataset.Dataset, got {type(dataset)}")
    size = int(dataset.get_dataset_size())
    if size < 1:
        raise TrainerError("train_ds is empty")
    return size


def _load_into(cell: nn.Cell, params: dict[str, Any], what: str) -> None:
    missing, _ = ms.load_param_into_net(cell, params)
    if missing:
        raise checkpoint.CheckpointError(f"checkpoint lacks {what} parameters: {missing[:5]}")


def _numpy(value: Any) -> Any:
    return value.asnumpy() if hasattr(value, "asnumpy") else value


def _eval_counts(loss: float, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    count = logits.shape[0]
    if labels.ndim == logits.ndim:  # one-hot
        labels = labels.argmax(axis=-1)
    is_class = labels.dtype.kind in "iu"
    correct = float((logits.argmax(axis=-1) == labels).sum()) if is_class else float("nan")
    return np.array([loss * count, correct, count], dtype=np.float64)


def _digest_row(digest: bytes) -> np.ndarray:
    # Eight bytes as four 16-bit values: exact in float32, which every backend can all-gather.
    return np.frombuffer(digest[:8], dtype=">u2").astype(np.float32)


def _row_digest(row: np.ndarray) -> bytes:
    return np.asarray(row, dtype=np.float32).astype(">u2").tobytes()
