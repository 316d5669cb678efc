"""Minimal data-parallel training that runs on CPU ranks: `npu-launch --cards 2 scripts/dp_example.py`.

Seeded alike on every rank, each rank trains on its own shard of a synthetic regression set,
gradients are averaged across ranks, and every rank prints a checksum of its trainable
parameters: equal checksums mean the all-reduce really ran. Plain MindSpore, no npu-launch
imports, so it also runs under msrun.
"""
import argparse
import os

import mindspore as ms
import numpy as np
from mindspore import dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises (for tests)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ms.set_device("CPU") if hasattr(ms, "set_device") else ms.set_context(device_target="CPU")
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(1)
    print(f"rank {rank}/{world} initialised (RANK_ID={os.environ.get('RANK_ID')})", flush=True)
    if rank == args.fail_rank:
        raise RuntimeError(f"rank {rank} was asked to fail")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch * args.steps * world, 16)).astype(np.float32)
    y = (x @ rng.standard_normal((16, 1)).astype(np.float32)).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=world, shard_id=rank)
    data = data.batch(args.batch, drop_remainder=True)

    net = nn.SequentialCell(nn.Dense(16, 8), nn.ReLU(), nn.Dense(8, 1))
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, optimizer.parameters)
    reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True)
    for step, (bx, by) in enumerate(data.create_tuple_iterator()):
        loss, grads = grad_fn(bx, by)
        optimizer(reducer(grads))
        print(f"rank {rank} step {step} loss {float(loss):.5f}", flush=True)
    checksum = sum(float(np.abs(p.asnumpy()).sum()) for p in net.trainable_params())
    print(f"rank {rank} checksum {checksum:.10f}", flush=True)


if __name__ == "__main__":
    main()
