"""The shared trainer's checkpoints: resume, load, save, prune, and the replica check that is also
every save's barrier. A mixin of :class:`parallel.trainer.core.Trainer`, which holds the state it reads."""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional, Union

import mindspore as ms
import numpy as np
from mindspore import nn

from parallel import contract, events
from parallel.checkpoints import checkpoint
from parallel.checkpoints.manifest import DataPosition, RankFile
from parallel.trainer import amp
from parallel.trainer.api import Callback, TrainerError, TrainOptions
from parallel.trainer.cells import RowGather
from parallel.trainer.support import Run

log = logging.getLogger("parallel.trainer")


class CheckpointSteps:
    """Saving and loading the state a checkpoint holds; the attributes are the trainer's."""

    options: TrainOptions
    rank: int
    world_size: int
    network: nn.Cell
    optimizer: nn.Optimizer
    scaler: Any
    callbacks: tuple[Callback, ...]
    data_parallel: bool
    position: checkpoint.DataPosition
    resumed_from: Optional[int]
    last_checkpoint: Optional[str]
    _saved_steps: set[int]
    _pending_manifests: set[int]
    _confirmed_steps: list[int]
    _gather: Optional[RowGather]
    _replicas_checked: bool
    _save_lock: threading.Lock
    _volatile: Optional[list[Any]] = None

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

    # Checkpoints -------------------------------------------------------------------------------

    def _save(self, run: Run) -> None:
        step = self.position.global_step
        if self.options.ckpt_dir is None or step in self._saved_steps:
            return
        started = time.perf_counter()
        with self._save_lock:  # last words (another thread) never write the same file at once
            entry = checkpoint.save_rank(self.options.ckpt_dir, step, self.rank,
                                         self._state_params(), self.position, self._extras())
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

    def _hold(self) -> "Held":
        """Copies, at a step's end, of what the next step may change before it reaches its
        all-reduce, where a blocked replica stops: what nothing there waits for (BatchNorm's
        moving statistics, written by the forward pass; the optimizer's step count, which does
        not depend on the gradients; the loss scale). Parameters and their optimizer moments
        depend on the all-reduced gradients: they are read as they are when last words are
        saved."""
        if self._volatile is None:
            trainable = {p.name for p in self.network.trainable_params()}
            self._volatile = [p for p in self._state_params() if p.name not in trainable
                              and p.name.partition(".")[2] not in trainable]
        return Held({p.name: p.asnumpy().copy() for p in self._volatile}, self._extras())

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


_GATHER_WIDTH = 4  # the widest row gathered: a parameter digest (eval totals take 3)


def _load_into(cell: nn.Cell, params: dict[str, Any], what: str) -> None:
    missing, _ = ms.load_param_into_net(cell, params)
    if missing:
        raise checkpoint.CheckpointError(f"checkpoint lacks {what} parameters: {missing[:5]}")


def _digest_row(digest: bytes) -> np.ndarray:
    # Eight bytes as four 16-bit values: exact in float32, which every backend can all-gather.
    return np.frombuffer(digest[:8], dtype=">u2").astype(np.float32)


def _row_digest(row: np.ndarray) -> bytes:
    return np.asarray(row, dtype=np.float32).astype(">u2").tobytes()


@dataclasses.dataclass(frozen=True)
class Held:
    """What :meth:`CheckpointSteps._hold` copied at the end of a step."""

    values: dict[str, np.ndarray]
    extras: dict[str, float]


@dataclasses.dataclass(frozen=True)
class LastWordsSaver:
    """The trainer's :class:`parallel.checkpoints.last_words.Saver`: what a periodic checkpoint of the step
    holds, written from the last-words thread while the main thread is blocked. A step this
    rank saved already is reported as it is, never written again."""

    trainer: CheckpointSteps

    def save(self, step: int, position: DataPosition, held: Optional[Held]
             ) -> tuple[RankFile, bool]:
        trainer, ckpt_dir = self.trainer, self.trainer._ckpt_dir()
        if held is None:
            raise checkpoint.CheckpointError(f"nothing was held of step {step}")
        with trainer._save_lock:
            if step in trainer._saved_steps:
                entry = checkpoint.read_rank_entry(ckpt_dir, step, trainer.rank)
                if entry is not None and entry.position == position:
                    return entry, False
            values = {name: ms.Tensor(value) for name, value in held.values.items()}
            entry = checkpoint.save_rank(ckpt_dir, step, trainer.rank, trainer._state_params(),
                                         position, held.extras, values)
        return entry, True

    def publish(self, saved: tuple[RankFile, bool]) -> None:
        entry, _ = saved
        ckpt_dir = self.trainer.options.ckpt_dir or ""
        path = os.path.abspath(checkpoint.step_dir(ckpt_dir, entry.position.global_step)
                               / entry.name)
        events.emit(contract.EVENT_CHECKPOINT, step=entry.position.global_step, path=path,
                    name=entry.name, size=entry.size, sha256=entry.sha256,
                    position=dataclasses.asdict(entry.position),
                    world_size=self.trainer.world_size, last_words=True)

    def discard(self, saved: tuple[RankFile, bool]) -> None:
        entry, written = saved
        if written:
            checkpoint.remove_rank(self.trainer.options.ckpt_dir or "",
                                   entry.position.global_step, self.trainer.rank)
