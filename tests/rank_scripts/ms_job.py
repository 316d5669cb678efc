"""A real MindSpore data-parallel rank whose misbehaviour the tests choose by flags.

--fail-rank R: rank R raises after init.  --hang-before-init R: rank R sleeps before init.
--sleep-after-init S: every rank sleeps S seconds after init (a job to interrupt).
--hang-rank R --hang-at-step K: rank R sleeps for an hour before step K (a hang mid-training).
Each step is reported as a `step` event, as the trainer does.
--steps N: training steps; at the end each rank prints `checksum <value>`.
--fail-at-attempt A:R (repeatable): in attempt A of the job (NPU_LAUNCH_RESTART), rank R raises
after its first step, once every rank is up.
--fail-init-on-host H: on host H, init() raises in every attempt, as on a server whose card or
network is broken (MindSpore's own error: the role it is given is invalid).
"""
import argparse
import os
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

from parallel.events import emit

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--hang-before-init", type=int, default=-1)
parser.add_argument("--sleep-after-init", type=float, default=0)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-at-step", type=int, default=-1)
parser.add_argument("--fail-at-attempt", action="append", default=[], metavar="A:R")
parser.add_argument("--fail-init-on-host", default=None)
parser.add_argument("--hang-in-attempt", type=int, default=-1, help="only then (default: always)")
args = parser.parse_args()
attempt = int(os.environ.get("NPU_LAUNCH_RESTART", "0"))
failing = {int(r) for a, r in (item.split(":") for item in args.fail_at_attempt) if int(a) == attempt}

ms.set_device("CPU")
if int(os.environ["RANK_ID"]) == args.hang_before_init:
    time.sleep(3600)
if os.environ.get("NPU_LAUNCH_HOST") == args.fail_init_on_host:
    os.environ["MS_ROLE"] = "MS_BROKEN"
init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
print(f"rank {rank} of {world} up, RANK_ID={os.environ['RANK_ID']}", flush=True)
if rank == args.fail_rank:
    raise ValueError(f"boom on rank {rank}")
time.sleep(args.sleep_after_init)

net = nn.Dense(8, 2)
optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
loss_fn = nn.MSELoss()
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)
reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True)
x = ms.Tensor(np.full((4, 8), rank + 1, np.float32))
y = ms.Tensor(np.zeros((4, 2), np.float32))
for step in range(args.steps):
    if rank == args.hang_rank and step == args.hang_at_step and args.hang_in_attempt in (-1, attempt):
        time.sleep(3600)
    loss, grads = grad_fn(x, y)
    optimizer(reducer(grads))
    emit("step", step=step, loss=float(loss))
    if rank in failing:
        raise RuntimeError(f"rank {rank} fails in attempt {attempt}")
checksum = sum(float(np.abs(p.asnumpy()).sum()) for p in net.trainable_params())
print(f"checksum {checksum:.10f}", flush=True)
