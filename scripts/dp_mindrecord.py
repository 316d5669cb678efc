"""Data-parallel training of a small CNN on the 8x8 digits, through ``parallel.init()`` and a
sharded MindRecord reader.

    python scripts/prepare_data.py digits data/digits.mindrecord --files 2
    npu-launch --cards 2 --device cpu scripts/dp_mindrecord.py data/digits.mindrecord0 --out results

Every rank writes ``results/rank<R>.json``: its rank and world size, steps per epoch, a hash of the
first batch it read (ranks read different shards), and hashes of its trainable parameters before
and after training. With a common seed and averaged gradients the final hashes are equal on every
rank; BatchNorm's moving statistics stay rank-local, which is why only trainable parameters count.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn

import parallel
from parallel.data import sharded_dataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="a MindRecord file written by prepare_data.py digits")
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<R>.json")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    return parser.parse_args()


def network() -> nn.Cell:
    """Conv-BN-ReLU twice, then a linear classifier: about 5k parameters."""
    return nn.SequentialCell(
        nn.Conv2d(1, 16, 3, pad_mode="same"), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, pad_mode="same"), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2, 2), nn.Flatten(), nn.Dense(16 * 4 * 4, 10))


def parameter_hash(net: nn.Cell) -> str:
    """SHA-256 of the trainable parameters' bytes, in name order."""
    digest = hashlib.sha256()
    for param in sorted(net.trainable_params(), key=lambda p: p.name):
        digest.update(param.name.encode())
        digest.update(param.asnumpy().tobytes())
    return digest.hexdigest()


def first_batch_hash(dataset: ms.dataset.Dataset) -> str:
    image, label = next(dataset.create_tuple_iterator(num_epochs=1, output_numpy=True))
    return hashlib.sha256(np.ascontiguousarray(image).tobytes() + label.tobytes()).hexdigest()


def main() -> None:
    args = parse_args()
    info = parallel.init()
    dataset = sharded_dataset(args.data, info, args.batch, columns=["image", "label"])
    net = network()
    before = parameter_hash(net)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.Model(net, loss, nn.Momentum(net.trainable_params(), 0.05, 0.9), metrics={"acc"})
    model.train(args.epochs, dataset)
    accuracy = model.eval(sharded_dataset(args.data, info, args.batch, shuffle=False,
                                          columns=["image", "label"]))["acc"]
    result = {"rank": info.rank, "world_size": info.world_size,
              "steps_per_epoch": dataset.get_dataset_size(), "first_batch": first_batch_hash(dataset),
              "initial_parameters": before, "parameters": parameter_hash(net), "accuracy": accuracy}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{info.rank}.json").write_text(json.dumps(result))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
