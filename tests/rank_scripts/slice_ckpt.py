"""A rank of a sliced (model- or pipeline-parallel) job without MindSpore, for the collection
tests: every step it writes its own slice, a file no other rank has, as its checkpoint of that
step, and reports it with ``parallel.events.emit`` exactly as ``parallel.trainer``'s ``_save``
does (step, path, name, size, sha256, position, world_size).

MindSpore runs model and pipeline parallelism only on Ascend, and this machine has none, so the
rank does no training: the launcher's part (the ledger, collection, resume) is what is tested,
and it cannot tell. With no MindSpore ``init()`` to report it, the rank sends ``initialised``
itself (a restart needs every rank to have initialised).

Slices go to ``<NPU_LAUNCH_LOG_DIR>/checkpoints/step_<N>/slice_rank<R>.bin``, on the rank's own
host. A restarted rank (``NPU_LAUNCH_RESUME_STEP``) checks that its own slice of that step is
there with its sha256 and says so (``--replicas``: data parallelism, any rank's file of the
step will do); without it, it exits 3.

--steps N: slices 1..N (after the resume step, on a restart); --last-mb M makes the last ones
  M MiB (the others are 256 KiB).
--fail-rank R --fail-at S: in the first attempt, rank R stops after step S's checkpoint, waits
  until the file --go names exists on its host (when given), deletes its host's checkpoints
  (--wipe), and exits 1.
"""
import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

from parallel import contract, events
from parallel.checkpoints.manifest import atomic_write_bytes

SLICE_BYTES = 256 * 1024


def content(rank: int, step: int, size: int = SLICE_BYTES) -> bytes:
    """The bytes of ``rank``'s slice of ``step`` (tests compute them too)."""
    seed = hashlib.sha256(f"rank {rank} step {step}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def save(folder: Path, rank: int, world: int, step: int, size: int) -> None:
    path = folder / f"step_{step}" / f"slice_rank{rank}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content(rank, step, size)
    atomic_write_bytes(path, data)
    events.emit(contract.EVENT_CHECKPOINT, step=step, path=str(path.resolve()), name=path.name,
                size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                position={"epoch": 0, "batch_in_epoch": step, "global_step": step},
                world_size=world)


def check_resumed(folder: Path, rank: int, world: int, step: int, replicas: bool) -> None:
    """This rank's file of ``step`` is its own slice; with ``replicas`` (data parallelism), any
    rank's file of the step will do."""
    path = folder / f"step_{step}" / f"slice_rank{rank}.bin"
    whose = range(world) if replicas else (rank,)
    wanted = {hashlib.sha256(content(r, step)).hexdigest(): r for r in whose}
    got = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
    if got not in wanted:
        print(f"rank {rank}: my slice of step {step} is not here ({path}: {got})", flush=True)
        sys.exit(3)
    print(f"rank {rank} resumed from step {step}: my slice is here, sha256 {got}"
          + (f" (rank {wanted[got]}'s)" if replicas else ""), flush=True)


def wait_for(go: str) -> None:
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit(f"no {go} after 120 s")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--go", default="")
    parser.add_argument("--wipe", action="store_true")
    parser.add_argument("--replicas", action="store_true",
                        help="data parallelism: any rank's file of the resume step will do")
    parser.add_argument("--last-mb", type=int, default=0,
                        help="the last step's slices are this many MiB (the rest 256 KiB)")
    args = parser.parse_args()
    rank, world = int(os.environ[contract.RANK_ID]), int(os.environ[contract.RANK_SIZE])
    first_attempt = os.environ.get(contract.RESTART, "0") == "0"
    folder = Path(os.environ[contract.LOG_DIR]) / "checkpoints"
    events.emit(contract.EVENT_INITIALISED)
    resume = int(os.environ.get(contract.RESUME_STEP) or 0)
    if resume:
        check_resumed(folder, rank, world, resume, args.replicas)
    for step in range(resume + 1, args.steps + 1):
        time.sleep(0.2)  # "training"
        events.emit(contract.EVENT_STEP, step=step, epoch=0, loss=1.0 / step)
        last = step == args.steps and args.last_mb
        save(folder, rank, world, step, args.last_mb << 20 if last else SLICE_BYTES)
        if first_attempt and rank == args.fail_rank and step == args.fail_at:
            if args.go:
                wait_for(args.go)
            if args.wipe:
                shutil.rmtree(folder)
            print(f"rank {rank} fails after step {step}", flush=True)
            sys.exit(1)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
