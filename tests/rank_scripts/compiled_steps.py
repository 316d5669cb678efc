"""A real MindSpore data-parallel rank in GRAPH mode: a small CNN on 8x8 inputs, compiled once.

--steps N: training steps (each a `step` event); at the end each rank prints `checksum <value>`.
--fail-rank R --fail-after-step K: in the job's first attempt (NPU_LAUNCH_RESTART 0), rank R
raises after its step K (counted from 0), once the train step has been compiled; a restart
runs to the end. With --fail-at-end instead, rank R raises after every step and its checksum
line: both attempts print what they trained to.
"""
import argparse
import os

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

from parallel import contract
from parallel.events import emit

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-after-step", type=int, default=0)
parser.add_argument("--fail-at-end", action="store_true")
args = parser.parse_args()

ms.set_device("CPU")
ms.set_context(mode=ms.GRAPH_MODE)
init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
attempt = int(os.environ.get(contract.RESTART, "0"))

net = nn.SequentialCell(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dense(4 * 8 * 8, 10))
step_cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                                nn.SGD(net.trainable_params(), learning_rate=0.05))
step_cell.set_train()
x = ms.Tensor(np.full((4, 1, 8, 8), (rank + 1) / 8, np.float32))
y = ms.Tensor(np.zeros((4, 10), np.float32))
for step in range(args.steps):
    loss = step_cell(x, y)
    emit("step", step=step, loss=float(loss.asnumpy()))
    if attempt == 0 and rank == args.fail_rank and step == args.fail_after_step \
            and not args.fail_at_end:
        raise RuntimeError(f"rank {rank} fails after step {step} of attempt {attempt}")
checksum = sum(float(np.abs(p.asnumpy()).sum()) for p in net.trainable_params())
print(f"attempt {attempt} checksum {checksum:.10f}", flush=True)
if attempt == 0 and rank == args.fail_rank and args.fail_at_end:
    raise RuntimeError(f"rank {rank} fails at the end of attempt {attempt}")
