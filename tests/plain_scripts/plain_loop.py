"""A plain MindSpore data-parallel script, as users write it: nothing of npu-launch imported.

``init()``, a ``GeneratorDataset`` sharded by rank, ``TrainOneStepCell`` and a loop over
``create_tuple_iterator()``. ``--style model`` runs the same work through ``Model.train``;
``--style cell`` calls the compiled cell on numpy batches, with no dataset at all.
``--hang-rank R --hang-at-step K``: rank R sleeps for an hour before its step K (counted from 0).
``--graph``: graph mode (MindSpore's default here is PyNative).
At the end each rank prints ``checksum <sum of |weights|>`` and ``step_ms <mean>``: the mean
wall time of a step after the first two (compilation), for the hook's cost benchmark.
"""
import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init

parser = argparse.ArgumentParser()
parser.add_argument("--style", choices=("loop", "model", "cell"), default="loop")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-at-step", type=int, default=-1)
parser.add_argument("--graph", action="store_true")
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--width", type=int, default=8)
args = parser.parse_args()

ms.set_device("CPU")
if args.graph:
    ms.set_context(mode=ms.GRAPH_MODE)
init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
WIDTH = args.width


class Source:
    """Random access: sample i is a fixed function of i."""

    def __len__(self):
        return args.steps * args.batch * world

    def __getitem__(self, i):
        x = np.full((WIDTH,), (i % 7) / 7.0, np.float32)
        return x, np.array([x.sum() % 2, 1.0], np.float32)


def hang_here(step):
    if rank == args.hang_rank and step == args.hang_at_step:
        print(f"rank {rank} hangs before step {step} at {time.time():.3f}", flush=True)
        time.sleep(3600)


step_started = []


def stepped():
    step_started.append(time.perf_counter())


class HangBeforeStep(ms.train.Callback):
    def on_train_step_begin(self, run_context):
        hang_here(run_context.original_args().cur_step_num - 1)
        stepped()


net = nn.Dense(WIDTH, 2)
loss_fn = nn.MSELoss()
optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
data = ms.dataset.GeneratorDataset(Source(), ["x", "y"], shuffle=False, num_shards=world,
                                   shard_id=rank).batch(args.batch)
if args.style == "model":
    model = ms.Model(net, loss_fn, optimizer)
    model.train(1, data, callbacks=[HangBeforeStep()], dataset_sink_mode=False)
else:
    step_cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    step_cell.set_train()
    if args.style == "loop":
        for step, (x, y) in enumerate(data.create_tuple_iterator()):
            hang_here(step)
            stepped()
            step_cell(x, y)
    else:
        source = Source()
        for step in range(args.steps):
            hang_here(step)
            stepped()
            rows = [source[(step * world + rank) * args.batch + j] for j in range(args.batch)]
            step_cell(ms.Tensor(np.stack([r[0] for r in rows])),
                      ms.Tensor(np.stack([r[1] for r in rows])))
checksum = sum(float(np.abs(p.asnumpy()).sum()) for p in net.trainable_params())
print(f"checksum {checksum:.10f}", flush=True)
step_started.append(time.perf_counter())
if len(step_started) > 4:
    timed = step_started[2:]
    print(f"step_ms {(timed[-1] - timed[0]) * 1000 / (len(timed) - 1):.4f}", flush=True)
