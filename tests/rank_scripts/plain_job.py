"""A plain-Python data-parallel rank: ms_job.py's flags and outputs, no MindSpore, no torch.

It plays a synchronous rank by the contract alone: it writes the events the rank hook writes
for a framework's rank (``init-started``, ``initialised``, ``progress`` with ``busy`` while it
waits on its peers) and the trainer's ``step`` events, and it meets its peers for real. Rank 0
listens on MASTER_ADDR:MASTER_PORT, as torch's rank 0 does (npu-launch starts no MindSpore
scheduler for ranks that never import MindSpore); "init" is every rank connecting there, and each
step an all-reduce of one number through rank 0, so a rank that stops stops the others too.

--fail-rank R: rank R raises after init.  --segfault-rank R: rank R reads address 0 after init.
--segfault-at-exit R: rank R reads address 0 as the interpreter tears down, after its exit
handlers (as MindSpore sometimes does in its own), ending by sys.exit(C) with --exit-code C.
--sigterm-at-exit R: rank R's exit handler waits until its peer's end of the link closes (the
peer left), then the rank is killed by SIGTERM, as MindSpore's cluster kills a rank whose peer
left it first ("Kill this process with SIGTERM."); with --exit-code C after sys.exit(C).
--linger-at-exit R: rank R's exit handlers never return after its script ends (MindSpore's
finalisation waiting on a cluster that is gone): registered after init, the last of all, so it
runs before any other (``atexit`` runs the last registered first).
--child R: rank R starts a process of its own after init (``sleep 3600``, not a rank: it
carries the job's environment, without the rank hook's parent-death signal).
--hang-before-init R: rank R sleeps before init.
--linger-after-raise S: the failing rank takes S seconds to exit after its exception is
reported (MindSpore's finalisation takes about one): the report alone must end the job.
--sleep-after-init S: every rank sleeps S seconds after init (a job to interrupt); only in a
Slurm batch job's first run with --sleep-in-first-run-only (a job to preempt and requeue: Slurm
sets SLURM_RESTART_COUNT in the requeued run, and the command line stays the same).
--hang-rank R --hang-at-step K: rank R sleeps for an hour before step K.
--steps N: steps; at the end each rank prints `checksum <value>` (equal on every rank).
--ignore-sigterm R: rank R ignores SIGTERM (only SIGKILL stops it).
--saves-on-stop: answers a stop request as the shared trainer does, by the contract alone: its
first step event says ``saves_on_stop``, and at each step it reads ``stop_request`` in its log
directory; at the step written there it prints ``saves step K`` and exits 0 (it saves no file).
--step-time S: each step takes at least S seconds.
--chatter: after init every rank prints without pause until it is gone, from a thread of its
own (``chatter attempt A line N``, alike on every rank, and ``rank R attempt A line N``), and as
it dies (a SIGTERM or its own exception: ``dying attempt A rank R line N`` for 0.3 s in an exit
handler): a dead attempt's lines still in the pipes as the job restarts.
--fail-at-attempt A:R (repeatable): in attempt A (NPU_LAUNCH_RESTART), rank R raises after its
first step. --fail-init-on-host H: on host H, "init" raises in every attempt.
A rank whose peer left raises at once, as gloo or HCCL may see the broken link: on other hosts
its report can reach node 0 before the culprit's (node 0 waits for both).
"""
import argparse
import atexit
import itertools
import os
import signal
import socket
import struct
import sys
import threading
import time

from parallel.events import emit
from parallel.hook import ending

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--segfault-rank", type=int, default=-1)
parser.add_argument("--segfault-at-exit", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=None)
parser.add_argument("--linger-after-raise", type=float, default=0)
parser.add_argument("--linger-at-exit", type=int, default=-1)
parser.add_argument("--sigterm-at-exit", type=int, default=-1)
parser.add_argument("--child", type=int, default=-1)
parser.add_argument("--hang-before-init", type=int, default=-1)
parser.add_argument("--sleep-after-init", type=float, default=0)
parser.add_argument("--sleep-in-first-run-only", action="store_true")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--saves-on-stop", action="store_true")
parser.add_argument("--step-time", type=float, default=0)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-at-step", type=int, default=-1)
parser.add_argument("--fail-at-attempt", action="append", default=[], metavar="A:R")
parser.add_argument("--fail-init-on-host", default=None)
parser.add_argument("--hang-in-attempt", type=int, default=-1, help="only then (default: always)")
parser.add_argument("--ignore-sigterm", type=int, default=-1)
parser.add_argument("--chatter", action="store_true")
args = parser.parse_args()
attempt = int(os.environ.get("NPU_LAUNCH_RESTART", "0"))
failing = {int(r) for a, r in (item.split(":") for item in args.fail_at_attempt) if int(a) == attempt}
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
_NUMBER = struct.Struct("!d")


def peer_left(cause: "Exception | None" = None) -> None:
    """Raise as a rank whose peer left."""
    raise ConnectionError("a peer left the job") from cause


def recv_number(conn: socket.socket) -> float:
    data = b""
    while len(data) < _NUMBER.size:
        try:
            chunk = conn.recv(_NUMBER.size - len(data))
        except ConnectionError as e:
            peer_left(e)
        if not chunk:
            peer_left()
        data += chunk
    return _NUMBER.unpack(data)[0]


def send_number(conn: socket.socket, value: float) -> None:
    try:
        conn.sendall(_NUMBER.pack(value))
    except ConnectionError as e:
        peer_left(e)


def init() -> list:
    """Rank 0: the other ranks' connections. Others: the connection to rank 0."""
    if rank == 0:
        server = socket.create_server(address, reuse_port=False)
        return [server.accept()[0] for _ in range(world - 1)]
    while True:
        try:
            return [socket.create_connection(address)]
        except OSError:
            time.sleep(0.05)


def all_reduce(peers: list, value: float) -> float:
    """The sum of every rank's value, through rank 0; ``busy`` while waiting, as the rank hook
    says of a rank inside a framework's collective."""
    emit("progress", count=step_count, busy=True, loads=0)
    if rank == 0:
        total = value + sum(recv_number(c) for c in peers)
        for conn in peers:
            send_number(conn, total)
    else:
        send_number(peers[0], value)
        total = recv_number(peers[0])
    return total


def start_chatter() -> None:
    """``--chatter``: lines without pause from a daemon thread, and a burst as the rank dies."""
    def chatter() -> None:
        for n in itertools.count():
            sys.stdout.write(f"chatter attempt {attempt} line {n}\nrank {rank} attempt {attempt} "
                             f"line {n}\n")
            sys.stdout.flush()
            time.sleep(0.002)

    def dying() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's SIGTERM: go on dying
        end = time.monotonic() + 0.3
        for n in itertools.count():
            sys.stdout.write(f"dying attempt {attempt} rank {rank} line {n}\n")
            sys.stdout.flush()
            if time.monotonic() > end:
                return

    threading.Thread(target=chatter, daemon=True).start()
    atexit.register(dying)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


step_count = 0
if rank == args.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if rank == args.hang_before_init:
    time.sleep(3600)
emit("init-started")
if os.environ.get("NPU_LAUNCH_HOST") == args.fail_init_on_host:
    raise RuntimeError(f"init failed on host {args.fail_init_on_host}")
peers = init()
emit("initialised", exec_mode="graph")
ending.again_after_init()  # as the rank hook does once init() returns
if rank == args.linger_at_exit:  # registered last, so it runs first: before the hook's
    atexit.register(time.sleep, 3600)
print(f"rank {rank} of {world} up, RANK_ID={os.environ['RANK_ID']}", flush=True)
if args.chatter:
    start_chatter()
if rank == args.child:
    import subprocess

    subprocess.Popen(["sleep", "3600"])
if rank == args.fail_rank:
    atexit.register(time.sleep, args.linger_after_raise)  # runs after the report is written
    raise ValueError(f"boom on rank {rank}")
if rank == args.segfault_rank:
    import ctypes

    ctypes.string_at(0)  # SIGSEGV, as a native library's fault would
if not (args.sleep_in_first_run_only and os.environ.get("SLURM_RESTART_COUNT")):
    time.sleep(args.sleep_after_init)



def stop_at() -> int:
    """The step node 0 asked every rank to save and stop at (``stop_request``), else -1."""
    try:
        with open(os.path.join(os.environ["NPU_LAUNCH_LOG_DIR"], "stop_request")) as f:
            word = f.read().strip()
    except OSError:
        return -1
    return int(word) if word.isdigit() else -1


weight = 1.0
for step in range(args.steps):
    if rank == args.hang_rank and step == args.hang_at_step and args.hang_in_attempt in (-1, attempt):
        time.sleep(3600)
    if args.saves_on_stop and 0 <= stop_at() <= step:
        print(f"rank {rank} saves step {step}", flush=True)
        raise SystemExit(0)
    time.sleep(args.step_time)
    weight -= 0.1 * all_reduce(peers, weight * (rank + 1)) / world
    step_count += 1
    emit("progress", count=step_count, busy=False, loads=0)
    mode = {"log_every": 1, "saves_on_stop": True} if args.saves_on_stop and step == 0 else {}
    emit("step", step=step, loss=weight * weight, **mode)
    if rank in failing:
        raise RuntimeError(f"rank {rank} fails in attempt {attempt}")
print(f"checksum {weight:.10f}", flush=True)
if rank == args.segfault_at_exit:
    import ctypes

    class Teardown:
        def __del__(self):
            ctypes.string_at(0)

    at_exit = Teardown()  # a module global: deleted as the interpreter clears the modules
    if args.exit_code is not None:
        sys.exit(args.exit_code)
if rank == args.sigterm_at_exit:
    def killed_once_the_peer_left() -> None:
        peers[0].recv(1)  # b"" once the peer's process is gone
        os.kill(os.getpid(), signal.SIGTERM)

    atexit.register(killed_once_the_peer_left)
    if args.exit_code is not None:
        sys.exit(args.exit_code)
