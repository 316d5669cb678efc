"""A real data-parallel MindSpore job of --steps steps, each reported as an event and a line.

Used by bench_launcher_cpu.py to see what the launcher itself costs while a job runs. (A fixed
step count, not a deadline: ranks that stop at different steps would leave a peer waiting in
the all-reduce.)
"""
import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_rank, init

from parallel.events import emit

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2800)
args = parser.parse_args()
ms.set_device("CPU")
init()
rank = get_rank()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
net = nn.SequentialCell(nn.Dense(64, 64), nn.ReLU(), nn.Dense(64, 10))
optimizer = nn.SGD(net.trainable_params(), learning_rate=0.01)
grad_fn = ms.value_and_grad(lambda x, y: nn.MSELoss()(net(x), y), None, optimizer.parameters)
reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True)
x = ms.Tensor(np.random.default_rng(rank).standard_normal((32, 64)).astype(np.float32))
y = ms.Tensor(np.zeros((32, 10), np.float32))
for step in range(1, args.steps + 1):
    start = time.perf_counter()
    loss, grads = grad_fn(x, y)
    optimizer(reducer(grads))
    emit("step", step=step, epoch=0, loss=float(loss),
         samples_per_s=32 / (time.perf_counter() - start))
    print(f"step {step} loss {float(loss):.4f}", flush=True)
