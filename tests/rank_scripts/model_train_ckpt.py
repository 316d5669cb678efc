"""A plain MindSpore data-parallel script that trains with ``Model.train`` and saves with
``ModelCheckpoint``, as msrun's users write them: nothing of npu-launch imported (the rank hook
adds the save on a stop, ``parallel.hook.model_train``).

--steps N steps in one epoch, each at least --step-time S seconds; on rank 0 alone, as many
data-parallel scripts do, a ``ModelCheckpoint`` (prefix ``net``, directory CKPT) every
--save-every steps. After each step the script's own callback prints ``params <step> <sha256>``
over every parameter of the train network: the weights and the optimizer's moments, what a
checkpoint of the step holds (equal on every rank: replicas). At start every rank loads the
newest checkpoint in CKPT, if there is one, into its train network (``resumed <file> <sha256>``,
the digest after the load) and the data skips the steps it holds.
"""
import argparse
import glob
import hashlib
import os
import re
import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train.callback import CheckpointConfig, ModelCheckpoint

parser = argparse.ArgumentParser()
parser.add_argument("ckpt", help="checkpoint folder (one subfolder a rank)")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--step-time", type=float, default=0.0)
parser.add_argument("--save-every", type=int, default=1000)
args = parser.parse_args()

ms.set_device("CPU")
init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
WIDTH, BATCH = 8, 4


class Source:
    """Random access: sample i is a fixed function of i."""

    def __len__(self):
        return args.steps * BATCH * world

    def __getitem__(self, i):
        x = np.full((WIDTH,), (i % 7) / 7.0, np.float32)
        return x, np.array([x.sum() % 2, 1.0], np.float32)


def digest(network):
    h = hashlib.sha256()
    for param in sorted(network.get_parameters(), key=lambda p: p.name):
        h.update(param.name.encode())
        h.update(param.asnumpy().tobytes())
    return h.hexdigest()


class PrintParams(ms.train.Callback):
    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        time.sleep(args.step_time)
        print(f"params {params.cur_step_num} {digest(params.train_network)}", flush=True)


net = nn.Dense(WIDTH, 2)
model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
saved = sorted(glob.glob(os.path.join(args.ckpt, "net-*.ckpt")), key=os.path.getmtime)
done = 0
if saved:
    ms.load_param_into_net(model.train_network, ms.load_checkpoint(saved[-1]))
    done = int(re.search(r"_(\d+)\.ckpt$", saved[-1]).group(1))
    print(f"resumed {os.path.basename(saved[-1])} {digest(model.train_network)}", flush=True)
data = ms.dataset.GeneratorDataset(Source(), ["x", "y"], shuffle=False, num_shards=world,
                                   shard_id=rank).batch(BATCH).skip(done)
callbacks = [PrintParams()]
if rank == 0:
    callbacks.append(ModelCheckpoint(prefix="net", directory=args.ckpt,
                                     config=CheckpointConfig(save_checkpoint_steps=args.save_every)))
model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
print(f"rank {rank} trained to step {args.steps}", flush=True)
