"""A plain-Python 2-rank job that speaks the trainer's side of last words (``parallel.checkpoints.last_words``)
without MindSpore, for the launcher-side tests: both ranks report steps as the trainer does
(``saves_on_stop``), rank 1 (or ``--fails``) fails (or ``--hangs``) after step ``--at``, and the
other rank then either blocks inside step ``--at + 1`` as a replica blocked in the all-reduce
would (``--rank0 quiet``) or never settles (``--rank0 busy``: a step being applied over and
over). Its saver writes a small file standing for the state and reports it in a ``checkpoint``
event marked ``last_words``, as the trainer's does. Step ``--at`` ends with the ranks meeting
for real, as its all-reduce would (rank 0 listens on MASTER_ADDR:MASTER_PORT): no rank fails
before the other has completed and reported that step. In a restart (``NPU_LAUNCH_RESTART`` > 0) each rank prints the step it would resume from
and the manifest beside its file, and exits 0.
"""
import argparse
import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

from parallel import contract, events
from parallel.checkpoints import last_words
from parallel.checkpoints.manifest import MANIFEST, DataPosition, atomic_write_bytes, sha256_file

parser = argparse.ArgumentParser()
parser.add_argument("--at", type=int, default=3)
parser.add_argument("--rank0", choices=["quiet", "busy"], default="quiet")
parser.add_argument("--fails", type=int, default=1, help="the rank that fails (the other blocks)")
parser.add_argument("--hangs", action="store_true",
                    help="the failing rank hangs instead (sleeps outside any collective) and the "
                         "other says it waits inside one (busy), as the rank hook would")
parser.add_argument("--lose-file", action="store_true",
                    help="the saver deletes its file once it said it saved it, as a host whose "
                         "upload cannot reach node 0: node 0 never holds it")
parser.add_argument("--fail-after", type=float, default=0.0,
                    help="seconds the failing rank waits after its last step: another "
                         "host's agent forwards the other rank's events every 0.1 s")
args = parser.parse_args()
rank = contract.RankIdentity.from_environ(os.environ).rank
ckpt = Path(os.environ[contract.LOG_DIR]) / "checkpoints"

if os.environ.get(contract.RESTART, "0") != "0":
    step = os.environ.get(contract.RESUME_STEP, "")
    manifest = ckpt / f"step_{step}" / MANIFEST if step else None
    names = [f["name"] for f in json.loads(manifest.read_text())["files"]] if manifest else []
    print(f"rank {rank} resumes from step {step or 'none'} with {names}", flush=True)
    sys.exit(0)


class FileSaver:
    def save(self, step: int, position: DataPosition, held: object) -> Path:
        path = ckpt / f"step_{step}" / f"rank_{rank}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, f"rank {rank}'s state after step {step}\n".encode())
        return path

    def publish(self, path: Path) -> None:
        step = int(path.parent.name.split("_")[1])
        events.emit(contract.EVENT_CHECKPOINT, step=step, path=str(path.resolve()), name=path.name,
                    size=path.stat().st_size, sha256=sha256_file(path),
                    position=dataclasses.asdict(DataPosition(0, step, step)), world_size=2,
                    last_words=True)
        if args.lose_file:
            path.unlink()

    def discard(self, path: Path) -> None:
        path.unlink()


address = (os.environ[contract.MASTER_ADDR], int(os.environ[contract.MASTER_PORT]))
server = socket.create_server(address) if rank == 0 else None


def meet() -> None:
    """Step ``--at``'s all-reduce: each rank has completed the step once the other's byte came."""
    if server is not None:
        peer = server.accept()[0]
    else:
        while True:
            try:
                peer = socket.create_connection(address)
                break
            except OSError:
                time.sleep(0.05)
    peer.sendall(b"x")
    assert peer.recv(1) == b"x"
    peer.close()


events.emit(contract.EVENT_INITIALISED)  # as the rank hook would after init(): restartable
progress = last_words.Progress.start(DataPosition())
listener = last_words.Listener.from_environ(rank, lambda: progress, FileSaver())
assert listener is not None
listener.start()
for step in range(1, args.at + 1):
    progress = progress.begin()
    time.sleep(0.01)
    progress = progress.complete(DataPosition(0, step, step), 0.01)
    first = {"saves_on_stop": True, "log_every": 1} if step == 1 else {}
    events.emit(contract.EVENT_STEP, step=step, epoch=0, loss=1.0 / step, **first)
meet()
if rank == args.fails and args.hangs:
    events.emit(contract.EVENT_PROGRESS, count=args.at, busy=False, loads=0)
    time.sleep(300)
if rank == args.fails:
    time.sleep(args.fail_after)
    sys.exit(3)
if args.rank0 == "quiet":
    progress = progress.begin()  # inside the next step, waiting on the lost rank for ever
    events.emit(contract.EVENT_PROGRESS, count=args.at, busy=True, loads=0)
    time.sleep(300)
while True:
    progress = progress.begin()  # a step being applied again and again: never quiet
    time.sleep(0.005)
