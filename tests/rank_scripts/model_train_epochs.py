"""A seed-style MindSpore data-parallel script: ``Model.train`` over several epochs, a
``ModelCheckpoint`` on rank 0 alone (prefix ``net``, directory CKPT, every --save-every steps:
by default once an epoch), and the resume the tutorials and the model zoo write: given
``--ckpt_path FILE``, load it and start at the epoch its name holds (``initial_epoch``).
Nothing of npu-launch imported: the path comes from ``--ckpt_path {checkpoint:-}``.

After each step the script's callback prints ``params <step> <sha256>`` (the step as the run
that was never stopped counts it, from the epoch and the step within it; the digest over every
parameter of the train network, optimizer moments included) and, at the end, ``trained <n>
steps`` (steps this launch ran). --fail-at S: rank 1 raises as step S begins, in the first
attempt only (``NPU_LAUNCH_RESTART`` 0). The data is shuffled, so an epoch begun at the wrong
place, or with another epoch's order, shows in the digests.
"""
import argparse
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
parser.add_argument("ckpt", help="checkpoint folder")
parser.add_argument("--ckpt_path", default="")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps", type=int, default=5, help="steps per epoch")
parser.add_argument("--save-every", type=int, default=0, help="0: once an epoch")
parser.add_argument("--step-time", type=float, default=0.0)
parser.add_argument("--fail-at", type=int, default=0)
args = parser.parse_args()

ms.set_device("CPU")
init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
WIDTH, BATCH = 8, 4
first_attempt = os.environ.get("NPU_LAUNCH_RESTART", "0") == "0"


class Source:
    """Random access: sample i is a fixed function of i."""

    def __len__(self):
        return args.steps * BATCH * world

    def __getitem__(self, i):
        x = np.full((WIDTH,), (i % 11) / 11.0, np.float32) + np.arange(WIDTH, dtype=np.float32) / 50
        return x, np.array([(i * 7 % 5) / 5.0, 1.0], np.float32)


def digest(network):
    h = hashlib.sha256()
    for param in sorted(network.get_parameters(), key=lambda p: p.name):
        h.update(param.name.encode())
        h.update(param.asnumpy().tobytes())
    return h.hexdigest()


class PrintParams(ms.train.Callback):
    def __init__(self):
        super().__init__()
        self.trained = 0

    def on_train_step_begin(self, run_context):
        params = run_context.original_args()
        step = (params.cur_epoch_num - 1) * params.batch_num + (params.cur_step_num - 1) % params.batch_num + 1
        if rank == 1 and first_attempt and step == args.fail_at:
            raise RuntimeError(f"rank 1 fails at step {step}, as asked")

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        self.trained += 1
        step = (params.cur_epoch_num - 1) * params.batch_num + (params.cur_step_num - 1) % params.batch_num + 1
        time.sleep(args.step_time)
        print(f"params {step} {digest(params.train_network)}", flush=True)


net = nn.Dense(WIDTH, 2)
model = ms.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
initial_epoch = 0
if args.ckpt_path:  # the tutorials' resume: the newest file, its epoch from its name
    ms.load_param_into_net(model.train_network, ms.load_checkpoint(args.ckpt_path))
    initial_epoch = int(re.search(r"-(\d+)_\d+\.ckpt$", args.ckpt_path).group(1))
    print(f"resumed {os.path.basename(args.ckpt_path)} initial_epoch={initial_epoch}", flush=True)
data = ms.dataset.GeneratorDataset(Source(), ["x", "y"], shuffle=True, num_shards=world,
                                   shard_id=rank).batch(BATCH)
printer = PrintParams()
callbacks = [printer]
if rank == 0:
    every = args.save_every or args.steps
    callbacks.append(ModelCheckpoint(prefix="net", directory=args.ckpt,
                                     config=CheckpointConfig(save_checkpoint_steps=every,
                                                             keep_checkpoint_max=100)))
model.train(args.epochs, data, callbacks=callbacks, dataset_sink_mode=False,
            initial_epoch=initial_epoch)
print(f"trained {printer.trained} steps", flush=True)
