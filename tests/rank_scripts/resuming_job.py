"""A plain-Python rank that resumes as the shared trainer does, by the contract alone: no
MindSpore, no peers.

At start each rank looks for the newest complete step in ``ckpt/`` of the log directory (a step
where every rank's file is), loads it (a ``progress`` event with ``loads`` 1, as the rank hook
reports MindSpore's ``load_checkpoint``) and prints ``resumed from step N``. Then it runs to
``--steps``, saving every ``--save-every`` steps: the file, then a ``checkpoint`` event as the
trainer's (path, name, size, sha256, data position, world size).
--fail-fresh R: rank R raises after step ``--fail-at`` when it resumed from nothing (the first
launch into the log directory fails; the same command run again resumes and finishes), once
every rank's file of the last step it saved is reported (so that step is complete).
"""
import argparse
import hashlib
import os
import time

from parallel.events import emit

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--save-every", type=int, default=4)
parser.add_argument("--fail-fresh", type=int, default=-1)
parser.add_argument("--fail-at", type=int, default=6)
args = parser.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ckpt = os.path.join(os.environ["NPU_LAUNCH_LOG_DIR"], "ckpt")


def complete(step: int) -> bool:
    """Every rank wrote its file of ``step`` and reported it."""
    return all(os.path.exists(os.path.join(ckpt, f"step_{step}", f"rank_{r}.reported"))
               for r in range(world))


steps = sorted(int(n[5:]) for n in os.listdir(ckpt)) if os.path.isdir(ckpt) else []
resumed = next((s for s in reversed(steps) if complete(s)), None)
start = 0
if resumed is not None:
    emit("progress", count=0, busy=False, loads=1)
    print(f"rank {rank} resumed from step {resumed}", flush=True)
    start = resumed
for step in range(start + 1, args.steps + 1):
    emit("step", step=step, loss=1.0 / step)
    if step % args.save_every == 0:
        folder = os.path.join(ckpt, f"step_{step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank_{rank}.txt")
        data = f"rank {rank} step {step}\n".encode()
        with open(path, "wb") as f:
            f.write(data)
        emit("checkpoint", step=step, path=path, name=os.path.basename(path), size=len(data),
             sha256=hashlib.sha256(data).hexdigest(), world_size=world,
             position={"epoch": 0, "batch_in_epoch": step, "global_step": step})
        open(os.path.join(folder, f"rank_{rank}.reported"), "w").close()
    if rank == args.fail_fresh and resumed is None and step == args.fail_at:
        saved = step - step % args.save_every
        deadline = time.monotonic() + 60
        while saved and not complete(saved) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise RuntimeError(f"rank {rank} fails at step {step}")
print(f"rank {rank} done at step {args.steps}", flush=True)
