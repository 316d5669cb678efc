"""The main job's work as a plain MindSpore script: the peer of ``bench/bench_main_job.py``.

It imports nothing of npu-launch: the same CNN, the same digits split, the same per-rank batch,
epochs, optimizer and learning-rate curve as ``scripts/train_digits.py``, written the way the
MindSpore tutorials write data-parallel training (GRAPH_MODE, ``init()``, ``DATA_PARALLEL`` with
``gradients_mean``, a sharded ``NumpySlicesDataset``, ``Model.train``, ``Model.eval``), in fp32,
without loss scaling, checkpoints or per-epoch evaluation. Run it under any launcher:

    npu-launch --cards 2 bench/plain_digits.py --epochs 10

Each rank prints ``rank R: held-out accuracy A after S steps (N samples/s)``, where N is its
training samples per second from the end of the first step (which compiles) to the last.
"""
from __future__ import annotations

import argparse
import math
import time

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import Callback, Model

HELD_OUT = 0.2


class Throughput(Callback):
    """Samples per second from the end of the first step on."""

    def __init__(self, batch: int) -> None:
        self.batch, self.started, self.ended, self.samples = batch, 0.0, 0.0, 0

    def on_train_step_end(self, run_context):  # type: ignore[no-untyped-def]
        self.ended = time.perf_counter()
        if not self.started:
            self.started = self.ended
        else:
            self.samples += self.batch

    def rate(self) -> float:
        return self.samples / max(self.ended - self.started, 1e-9)


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    labels = data.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    cut = int(len(labels) * (1 - HELD_OUT))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


def network() -> nn.Cell:
    return nn.SequentialCell(
        nn.Conv2d(1, 16, 3, pad_mode="same"), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, pad_mode="same"), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2, 2), nn.Flatten(), nn.Dense(16 * 4 * 4, 10))


def warmup_cosine(base_lr: float, total: int, warmup: int) -> list[float]:
    """The main job's curve: linear warm-up for one epoch, then a half cosine to 0."""
    rates = [base_lr * (step + 1) / warmup for step in range(warmup)]
    span = total - warmup
    rates += [0.5 * base_lr * (1 + math.cos(math.pi * step / max(span - 1, 1))) for step in range(span)]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(1)
    x_train, y_train, x_test, y_test = digits()
    train = ds.NumpySlicesDataset({"image": x_train, "label": y_train}, shuffle=True,
                                  num_shards=world, shard_id=rank).batch(args.batch, drop_remainder=True)
    held_out = ds.NumpySlicesDataset({"image": x_test, "label": y_test}, shuffle=False).batch(128)
    net = network()
    steps = train.get_dataset_size()
    lr = warmup_cosine(args.lr, steps * args.epochs, steps)
    optimizer = nn.Momentum(net.trainable_params(), lr, momentum=0.9)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, optimizer, metrics={"accuracy"})
    meter = Throughput(args.batch)
    model.train(args.epochs, train, callbacks=[meter], dataset_sink_mode=False)
    accuracy = model.eval(held_out, dataset_sink_mode=False)["accuracy"]
    print(f"rank {rank}: held-out accuracy {accuracy:.4f} after {steps * args.epochs} steps "
          f"({meter.rate():.0f} samples/s)", flush=True)


if __name__ == "__main__":
    main()
