"""The tiny job the launch benchmark runs under msrun and under npu-launch alike.

Each rank appends `<what> <unix time>` lines to $BENCH_OUT/rank_<rank>.txt: `init` after
MindSpore's init() returns, `done` after training, `fail` just before the failing rank raises
(BENCH_MODE=fail: the last rank fails after init while the others sleep).
"""
import os
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init


def mark(rank: int, what: str) -> None:
    with open(os.path.join(os.environ["BENCH_OUT"], f"rank_{rank}.txt"), "a") as f:
        f.write(f"{what} {time.time()}\n")


ms.set_device("CPU")
init()
rank, world = get_rank(), get_group_size()
mark(rank, "init")
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
if os.environ.get("BENCH_MODE") == "fail":
    if rank == world - 1:
        mark(rank, "fail")
        raise RuntimeError("benchmark failure")
    time.sleep(120)
net = nn.Dense(16, 4)
optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
grad_fn = ms.value_and_grad(lambda x, y: nn.MSELoss()(net(x), y), None, optimizer.parameters)
reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True)
x, y = ms.Tensor(np.ones((8, 16), np.float32)), ms.Tensor(np.zeros((8, 4), np.float32))
for _ in range(5):
    _, grads = grad_fn(x, y)
    optimizer(reducer(grads))
mark(rank, "done")
