"""A peer that dies in the middle of a step's gradient exchange (issue 24 part 1's hole).

Both ranks run the trainer's own step cell (``parallel.trainer.cells.TrainStep``) once on a net of
six equal 8x8 weights, so six gradient all-reduces of one shape. Then rank 1 joins only ``K`` of
step 2's all-reduces (with zeros: the shapes match whatever the order) and exits, as a rank
killed mid-step does; rank 0 runs step 2 and blocks in the next all-reduce. A thread of rank 0
waits until rank 1 is gone and its own threads are idle (blocked, as last words require), then
prints which weights step 2 changed: ``changed: [...]``. The step must be applied whole or not at
all; before the barrier in ``Update.update``, ``K=3`` changed one weight here and ``K=5`` three.

argv: a directory both ranks see, and ``K``.
"""
import json
import os
import sys
import threading
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn, ops

import parallel
from parallel.checkpoints.last_words import others_cpu
from parallel.trainer import TrainOptions
from parallel.trainer.cells import TrainStep

WEIGHTS = 6
shared, k = Path(sys.argv[1]), int(sys.argv[2])
gone = shared / "rank1-gone"
info = parallel.init()
ms.set_seed(1)


class Net(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.SequentialCell([nn.Dense(8, 8, has_bias=False) for _ in range(WEIGHTS)])

    def construct(self, x):  # type: ignore[no-untyped-def]
        return self.layers(x).sum()


net = Net()
weights = net.trainable_params()
step = TrainStep(net, nn.SGD(weights, learning_rate=0.1), None, TrainOptions(), info.world_size)
x = ms.Tensor(np.random.RandomState(info.rank).rand(4, 8).astype(np.float32))
step(x)[0].asnumpy()
before = [w.asnumpy().copy() for w in weights]

if info.rank == 1:
    for _ in range(k):
        ops.AllReduce()(ms.Tensor(np.zeros((8, 8), np.float32))).asnumpy()
    gone.write_text(str(k))
    os._exit(0)


def look() -> None:
    while not gone.exists():
        time.sleep(0.05)
    idle, until = 0, time.monotonic() + 60
    while idle < 5:  # 5 x 0.2 s in a row with almost no CPU: blocked in an all-reduce
        if time.monotonic() > until:
            print("rank 0 never went idle", flush=True)
            os._exit(1)
        used = others_cpu()
        time.sleep(0.2)
        idle = idle + 1 if others_cpu() - used < 0.01 else 0
    changed = [i for i, w in enumerate(weights) if not np.array_equal(w.asnumpy(), before[i])]
    print("changed:", json.dumps(changed), flush=True)
    os._exit(0)


threading.Thread(target=look, daemon=True).start()
step(x)[0].asnumpy()
print("step 2 completed without rank 1", flush=True)
os._exit(1)
