"""A real data-parallel MindSpore job that trains for --seconds, reporting every step.

Used by bench_launcher_cpu.py to see what the launcher itself costs while a job runs.
"""
import argparse
import time

import numpy as np
import mindspore as ms
from mindspore import nn
from mindspore.communication import get_rank, init

from parallel.events import emit

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60)
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
end, step = time.time() + args.seconds, 0
while time.time() < end:
    start = time.perf_counter()
    loss, grads = grad_fn(x, y)
    optimizer(reducer(grads))
    step += 1
    emit("step", step=step, epoch=0, loss=float(loss),
         samples_per_s=32 / (time.perf_counter() - start))
    print(f"step {step} loss {float(loss):.4f}", flush=True)
