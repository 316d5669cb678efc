"""A torchrun-style DDP script, as torch_npu users write them (gloo here, hccl on Ascend):
``init_process_group`` from the env:// variables, a ``DistributedDataParallel`` Linear, SGD,
--steps steps, then one ``checksum`` line per rank and the torchrun variables it was given.

--fail-rank R --fail-at S: rank R raises before step S. --hang-rank R --hang-at S: rank R
sleeps (``hang_here``) before step S while the others wait in the all-reduce. --write-rank R
--write-at S --write-s T: rank R writes a file of its own for T seconds before step S (a
checkpoint saved its own way) while the others wait in the all-reduce."""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

TORCHRUN_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS")


def hang_here() -> None:
    time.sleep(3600)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-at", type=int, default=-1)
parser.add_argument("--write-rank", type=int, default=-1)
parser.add_argument("--write-at", type=int, default=-1)
parser.add_argument("--write-s", type=float, default=0.0)
args = parser.parse_args()


def write_alone(seconds: float) -> None:
    print(f"rank {dist.get_rank()} writes alone for {seconds:g} s", flush=True)
    path = os.path.join(tempfile.gettempdir(), f"ddp-alone-{os.getpid()}.bin")
    until = time.monotonic() + seconds
    with open(path, "wb") as f:
        while time.monotonic() < until:
            f.seek(0)
            f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
            time.sleep(0.05)
    os.remove(path)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(100 + rank)
for step in range(args.steps):
    if rank == args.fail_rank and step == args.fail_at:
        raise RuntimeError(f"torch boom on rank {rank} at step {step}")
    if rank == args.hang_rank and step == args.hang_at:
        hang_here()
    if rank == args.write_rank and step == args.write_at:
        write_alone(args.write_s)
    loss = model(torch.randn(16, 8, generator=data)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
told = {name: os.environ.get(name) for name in TORCHRUN_NAMES}
# One write per line: torchrun hands both ranks the same pipe, and print() writes a line's text
# and its newline apart when unbuffered, so a line could end inside the other rank's.
for line in (f"rank {rank} env {json.dumps(told, sort_keys=True)}",
             f"rank {rank} mindspore loaded: {'mindspore' in sys.modules}",
             f"rank {rank}/{world} checksum {checksum:.12f}"):
    os.write(sys.stdout.fileno(), f"{line}\n".encode())
dist.barrier()
dist.destroy_process_group()
# torch 2.13's gloo can abort a rank as the interpreter finalises ("terminate called without an
# active exception", SIGABRT): 3 in 50 runs under torchrun here, with or without the barrier and
# destroy_process_group above. Leaving without finalisation is the workaround DDP scripts use.
sys.stdout.flush()
os._exit(0)
