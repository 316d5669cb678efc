"""The main job: a small CNN on scikit-learn's 8x8 digits, data-parallel, with mixed precision.

    npu-launch --cards 2 scripts/train_digits.py

Each rank joins the job through ``parallel.init()``, reads its shard of the training images
through ``sharded_dataset``, and trains with the shared ``Trainer`` in GRAPH mode, taking the fast
path for its device: ``--amp auto`` is O1 on Ascend and O0 on CPU (whose float16 kernels are
slower than float32), and ``--loss-scale auto`` scales dynamically where AMP computes in float16
(none in float32). It evaluates on its shard of the held-out images every epoch, checkpoints every
``--ckpt-every`` epochs and at the end, and resumes with ``resume="auto"`` (a restarted job
continues where the last complete checkpoint left it). At the end every rank prints its held-out
accuracy, its AMP level and loss scale, and a checksum of its trainable parameters; equal
checksums mean the gradients were averaged across ranks.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import nn

import parallel
from parallel import contract
from parallel.config import DeviceTarget
from parallel.data import sharded_dataset
from parallel.trainer import Callback, FitResult, LrSchedule, Trainer

HELD_OUT = 0.2


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--amp", default="auto", choices=["auto", "O0", "O1", "O2", "O3"],
                        help="auto: O1 on Ascend, O0 on CPU [default: auto]")
    parser.add_argument("--loss-scale", default="auto", choices=["auto", "dynamic", "fixed", "none"],
                        help="auto: dynamic when AMP computes in float16 (O1-O3), none in "
                             "float32 (O0) [default: auto]")
    parser.add_argument("--ckpt-dir", type=Path, default=None,
                        help="[default: checkpoints/ in the job's log dir]")
    parser.add_argument("--ckpt-every", type=int, default=5, metavar="EPOCHS",
                        help="checkpoint every EPOCHS epochs and at the end [default: 5]")
    parser.add_argument("--keep-last", type=int, default=3, metavar="K",
                        help="keep the K newest complete checkpoints [default: 3]")
    parser.add_argument("--save-params", type=Path, default=None,
                        help="write this rank's trainable parameters to DIR/rank<R>.npz")
    return parser.parse_args(argv)


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Images (N, 1, 8, 8) in [0, 1] and labels, split into train and held-out the same way on
    every rank (a fixed permutation)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    labels = data.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    cut = int(len(labels) * (1 - HELD_OUT))
    train, test = order[:cut], order[cut:]
    return images[train], labels[train], images[test], labels[test]


def network() -> nn.Cell:
    """Conv-BN-ReLU twice, pooling, a linear classifier: about 5k parameters."""
    return nn.SequentialCell(
        nn.Conv2d(1, 16, 3, pad_mode="same"), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, pad_mode="same"), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2, 2), nn.Flatten(), nn.Dense(16 * 4 * 4, 10))


def build(args: argparse.Namespace, callbacks: Sequence[Callback] = ()) -> tuple[Trainer, nn.Cell]:
    """Everything but the training itself, so tests can reach in."""
    info = parallel.init()
    x_train, y_train, x_test, y_test = digits()
    train = sharded_dataset({"image": x_train, "label": y_train}, info, args.batch)
    # Each rank evaluates its own shard in one batch (a short last batch would compile the
    # evaluation graph a second time); the trainer sums the counts over the ranks.
    held_out = sharded_dataset({"image": x_test, "label": y_test}, info, len(y_test),
                               shuffle=False, drop_remainder=False)
    net = network()
    steps_per_epoch = train.get_dataset_size()
    schedule = LrSchedule.warmup_cosine(args.lr, steps_per_epoch * args.epochs, steps_per_epoch)
    optimizer = nn.Momentum(net.trainable_params(), schedule.build(), momentum=0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    ckpt_dir = args.ckpt_dir or Path(os.environ.get(contract.LOG_DIR, ".")) / "checkpoints"
    trainer = Trainer(net, loss, optimizer, train, held_out, info=info,
                      callbacks=callbacks, amp_level=amp_level(args.amp, info),
                      loss_scale=None if args.loss_scale == "auto" else args.loss_scale,
                      ckpt_dir=str(ckpt_dir), ckpt_every_epochs=args.ckpt_every, resume="auto",
                      keep_last=args.keep_last, log_every=5)
    return trainer, net


def amp_level(asked: str, info: parallel.RankInfo) -> str:
    """``auto``: O1 where float16 pays (Ascend), O0 on CPU (its float16 kernels are slower)."""
    if asked != "auto":
        return asked
    return "O0" if info.device_target is DeviceTarget.CPU else "O1"


def _precision(trainer: Trainer, result: FitResult) -> str:
    level, scaling = trainer.options.amp_level.value, trainer.options.loss_scale.mode.value
    if scaling == "none":
        return f"AMP {level}, no loss scaling"
    return (f"AMP {level}, {scaling} loss scale {result.loss_scale:g}, "
            f"{result.skipped_steps} update(s) skipped")


def checksum(net: nn.Cell) -> float:
    return sum(float(np.abs(p.asnumpy()).astype(np.float64).sum()) for p in net.trainable_params())


def main(argv: Optional[Sequence[str]] = None, callbacks: Sequence[Callback] = ()) -> None:
    args = parse_args(argv)
    trainer, net = build(args, callbacks)
    result = trainer.fit(epochs=args.epochs)
    rank = contract.RankIdentity.from_environ(os.environ).rank
    if args.save_params is not None:
        args.save_params.mkdir(parents=True, exist_ok=True)
        np.savez(args.save_params / f"rank{rank}.npz",
                 **{p.name: p.asnumpy() for p in net.trainable_params()})
    resumed = f", resumed from step {result.resumed_from}" if result.resumed_from else ""
    print(f"rank {rank}: held-out accuracy {result.accuracy:.4f} after {result.steps} steps "
          f"({result.samples_per_s:.0f} samples/s, {_precision(trainer, result)}{resumed}); "
          f"checksum {checksum(net):.8f}", flush=True)


if __name__ == "__main__":
    ms.set_seed(1)  # parallel.init() seeds again from the job's parallel config
    main()
