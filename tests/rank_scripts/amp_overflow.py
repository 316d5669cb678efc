"""A 2-rank AMP job whose loss scale overflows, for the dynamic loss-scaling test.

Each rank trains a small Dense network with the shared trainer (AMP O1: the Dense layers compute
in float16) and dynamic loss scaling from a scale too large for float16, so the first updates
overflow on every rank. At step ``--poison-step`` only rank 1 reads a batch of 1e5 values, which
is infinite in float16: only rank 1's gradients overflow, and the update must still be skipped
on every rank (the finiteness check comes after the all-reduce).

After every step each rank appends ``{"step", "scale", "checksum"}`` to ``--out/rank<R>.jsonl``
(``checksum``: the exact bytes of every trainable parameter, hex digest), and ``{"step": 0, ...}``
before the first one.
"""
import argparse
import hashlib
import json
import os
from pathlib import Path

import numpy as np
from mindspore import dataset as ds
from mindspore import nn

import parallel
from parallel.trainer import Callback, LossScaleConfig, Trainer

BATCH, BATCHES = 8, 6


class Record(Callback):
    """Writes the loss scale and a digest of the parameters after every step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.trainer = None

    def on_fit_start(self, trainer):  # type: ignore[no-untyped-def]
        self.trainer = trainer
        self._write(0)

    def on_step_end(self, info):  # type: ignore[no-untyped-def]
        self._write(info.global_step)

    def _write(self, step: int) -> None:
        digest = hashlib.sha256()
        for param in self.trainer.network.trainable_params():
            digest.update(param.asnumpy().tobytes())
        line = {"step": step, "scale": self.trainer.loss_scale, "checksum": digest.hexdigest()}
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def data(rank: int, poison_step: int) -> ds.Dataset:
    """This rank's own rows, in order; rank 1's batch at ``poison_step`` overflows float16."""
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((BATCH * BATCHES, 16)).astype(np.float32)
    y = rng.integers(0, 4, BATCH * BATCHES).astype(np.int32)
    if rank == 1:
        batch = (poison_step - 1) % BATCHES
        x[batch * BATCH:(batch + 1) * BATCH] = 1e5
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--poison-step", type=int, default=9)
    parser.add_argument("--init-scale", type=float, default=2.0 ** 24)
    args = parser.parse_args()
    info = parallel.init()
    net = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4))
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    scaling = LossScaleConfig(mode="dynamic", init_scale=args.init_scale, window=1000)
    args.out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(net, loss, optimizer, data(info.rank, args.poison_step), info=info,
                      amp_level="O1", loss_scale=scaling, ckpt_every_epochs=None,
                      callbacks=[Record(args.out / f"rank{info.rank}.jsonl")])
    result = trainer.fit(epochs=2)
    print(f"rank {info.rank}: skipped {result.skipped_steps} of {result.steps} "
          f"(pid {os.getpid()})", flush=True)


if __name__ == "__main__":
    main()
