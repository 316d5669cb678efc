"""A plain MindSpore data-parallel script, as users write it: nothing of npu-launch imported.

One rank busy alone (issue 38): after a step, one rank does something of its own for a while
(writes a file, saves arrays, runs ``tar``, evaluates, uploads) while the other ranks go on into
the next step's all-reduce and wait there for it. A healthy job; so is a recompilation for a new
input shape, a slow data source, a warm-up of all-reduces, an evaluation network first compiled
mid-run. And a rank that freezes for good, to tell the two apart.

``init()``, ``DATA_PARALLEL`` with ``gradients_mean``, ``ms.set_seed(1)``, a ``GeneratorDataset``
sharded by rank, ``TrainOneStepCell``; steps are counted from 0 across epochs.

  --style loop|model       a loop over ``create_tuple_iterator()``, or ``Model.train`` with the
                           episodes in a ``Callback`` (``on_train_step_end``; at an epoch's last
                           step ``on_train_epoch_end``)
  --graph                  GRAPH_MODE (MindSpore's default here is PyNative)
  --steps N, --epochs E    steps per epoch, epochs
  --batch, --width, --hidden   the input: batch rows x width, one hidden layer
  --alone KIND:RANK:STEP:SECONDS   (repeatable) after step STEP, rank RANK alone does KIND for
                           about SECONDS:
      write     its own file in 2 MB chunks, each ``os.fsync``-ed, about 20 MB/s (overwritten
                from its start every 32 MB, deleted at the end)
      npsave    ``np.save`` of a 2 MB array, 10 times a second
      pickle    ``pickle.dump`` of a dict of 2 MB of arrays, 10 times a second
      tar       ``tar cf -`` of a sparse file piped into a child that reads it at 4 MB/s (GNU tar
                reads nothing when its output is /dev/null); the main thread waits for both
      cp        ``cp /dev/stdin FILE`` fed at 4 MB/s by a child; the main thread waits
      eval      an evaluation loop of its own: the eval network called on batches (compiled on
                its first call in GRAPH mode), losses summed in numpy
      upload    an HTTP PUT (``http.client``) of a file's body in 256 kB chunks to a slow local
                server (127.0.0.1, a thread of this same rank) that reads 2 MB/s
      shape     not alone: EVERY rank calls the train cell once with twice the batch after that
                step (GRAPH mode compiles a new graph); RANK and SECONDS are not used
      slowdata  RANK's dataset source reads slowly for SECONDS as it makes step STEP+1's batch:
                its ``__getitem__`` sleeps between 4 kB file reads (the pipeline reads ahead, so
                the rank's main thread waits somewhat less than SECONDS)
  --freeze KIND:RANK:STEP[:inside]   rank RANK freezes for good before step STEP (``--style
                           model``: in ``on_train_step_begin``), or with ``:inside`` inside the
                           step's forward pass (PyNative: a Python call in ``construct``; GRAPH: a
                           ``pyfunc`` ``ops.Custom``): ``sleep`` (an hour), ``lock`` (a
                           ``threading.Lock`` acquired twice), ``pipe`` (``os.read`` of a pipe
                           nobody writes), ``spin`` (a Python busy loop: alive by its CPU)
  --warmup-allreduce N     N all-reduces of a small float32 tensor after init(), before training
                           (as mindcv does)
  --eval-network-at STEP   every rank calls an evaluation network for the first time after STEP
                           (its first compilation in GRAPH mode)

Each episode prints its wall-clock times as it ends (``rank 0 alone write from T0 to T1``), and
as it begins (``rank 0 alone write begins at T0``: a job stopped meanwhile shows it); a freeze
``rank 1 freezes at T``. At the end each rank prints ``checksum <sum of |weights|>``.
MindSpore's CPU collectives give up after 30 s of waiting: for longer episodes raise
``MS_CPU_COMM_OP_TIMEOUT`` (seconds) in the job's environment.
"""
import argparse
import dataclasses
import http.client
import http.server
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

MB = 1 << 20
ALONE_KINDS = ("write", "npsave", "pickle", "tar", "cp", "eval", "upload", "shape", "slowdata")
FREEZE_KINDS = ("sleep", "lock", "pipe", "spin")
CHUNK = 2 * MB
WRITE_RATE = 20 * MB
SAVE_PERIOD = 0.1
PIPE_RATE = 4 * MB
UPLOAD_RATE = 2 * MB
# Run with -I so that npu-launch's rank hook (its sitecustomize on PYTHONPATH) stays out of them.
SLOW_SINK = """import sys, time
rate, start, got = float(sys.argv[1]), time.monotonic(), 0
while True:
    block = sys.stdin.buffer.read1(65536)
    if not block:
        break
    got += len(block)
    time.sleep(max(0.0, start + got / rate - time.monotonic()))
"""
SLOW_FEED = """import sys, time
rate, size, start, sent = float(sys.argv[1]), int(sys.argv[2]), time.monotonic(), 0
block = bytes(65536)
while sent < size:
    sys.stdout.buffer.write(block)
    sent += len(block)
    time.sleep(max(0.0, start + sent / rate - time.monotonic()))
"""


@dataclasses.dataclass(frozen=True)
class Alone:
    """``--alone KIND:RANK:STEP:SECONDS``."""

    kind: str
    rank: int
    step: int
    seconds: float

    @classmethod
    def parse(cls, text: str) -> "Alone":
        kind, rank, step, seconds = text.split(":")
        if kind not in ALONE_KINDS:
            raise argparse.ArgumentTypeError(f"{kind}: not one of {', '.join(ALONE_KINDS)}")
        return cls(kind, int(rank), int(step), float(seconds))


@dataclasses.dataclass(frozen=True)
class Freeze:
    """``--freeze KIND:RANK:STEP[:inside]``."""

    kind: str
    rank: int
    step: int
    inside: bool

    @classmethod
    def parse(cls, text: str) -> "Freeze":
        kind, rank, step, *where = text.split(":")
        if kind not in FREEZE_KINDS or where not in ([], ["inside"]):
            raise argparse.ArgumentTypeError(f"{text}: KIND:RANK:STEP[:inside], KIND one of "
                                             f"{', '.join(FREEZE_KINDS)}")
        return cls(kind, int(rank), int(step), bool(where))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--style", choices=("loop", "model"), default="loop")
    parser.add_argument("--graph", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--alone", type=Alone.parse, action="append", default=[])
    parser.add_argument("--freeze", type=Freeze.parse, action="append", default=[])
    parser.add_argument("--warmup-allreduce", type=int, default=0)
    parser.add_argument("--eval-network-at", type=int, default=-1)
    args = parser.parse_args()
    if args.style == "model" and any(a.kind == "shape" for a in args.alone):
        parser.error("--alone shape needs --style loop: Model.train owns the train cell")
    return args


def pace(start: float, due: float) -> None:
    """Sleep until ``due`` seconds after ``start`` (monotonic), if that is still ahead."""
    time.sleep(max(0.0, start + due - time.monotonic()))


def every(period: float, seconds: float, action: Callable[[], None]) -> None:
    """Call ``action`` every ``period`` seconds for ``seconds``."""
    start, done = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        action()
        done += 1
        pace(start, min(done * period, seconds))


class StepState:
    """Where the training is, for the freeze inside a step (read from inside the network)."""

    def __init__(self) -> None:
        self.step = -1
        self.training = False
        self.inside: Optional[Freeze] = None
        self.moved = threading.Condition()

    def begin(self, step: int) -> None:
        with self.moved:
            self.step, self.training = step, True
            self.moved.notify_all()

    def wait_for(self, step: int) -> None:
        """Block (the dataset's thread) until the training began ``step``."""
        with self.moved:
            self.moved.wait_for(lambda: self.step >= step)

    def check_inside(self) -> None:
        due = self.inside
        if due is not None and self.training and self.step == due.step:
            freeze(due.kind)


STATE = StepState()


def freeze(kind: str) -> None:
    """Never come back: ``kind`` is how."""
    print(f"rank {get_rank()} freezes at {time.time():.3f}", flush=True)
    if kind == "sleep":
        time.sleep(3600)
    elif kind == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif kind == "pipe":
        read_end, write_end = os.pipe()  # write_end stays open, so the read never sees EOF
        os.read(read_end, 1)
    else:
        spun = 0
        while True:
            spun += 1


def gate_in_python(x: np.ndarray) -> np.ndarray:
    """The ``pyfunc`` of the GRAPH-mode gate: MindSpore calls it with each forward's output."""
    STATE.check_inside()
    return x


def same(x):
    return x


def gate_bprop(x, out, dout):
    return (dout,)


class PythonGate(nn.Cell):
    """PyNative: a Python call in ``construct``."""

    def construct(self, x):
        STATE.check_inside()
        return x


class CustomGate(nn.Cell):
    """GRAPH mode: a ``pyfunc`` custom op, which the compiled graph calls back at run time."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = ops.Custom(gate_in_python, out_shape=same, out_dtype=same, func_type="pyfunc",
                               bprop=gate_bprop)

    def construct(self, x):
        return self.gate(x)


class Net(nn.Cell):
    def __init__(self, width: int, hidden: int, gate: nn.Cell) -> None:
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(width, hidden), nn.ReLU(), nn.Dense(hidden, 2))
        self.gate = gate

    def construct(self, x):
        return self.gate(self.body(x))


class FirstEval(nn.Cell):
    """The network ``--eval-network-at`` calls for the first time mid-run: mean squared error."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__()
        self.net = net

    def construct(self, x, y):
        return ops.mean(ops.square(self.net(x) - y))


class AllReduceCell(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.all_reduce = ops.AllReduce()

    def construct(self, x):
        return self.all_reduce(x)


def row(i: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``i``: a fixed function of ``i``."""
    x = np.full((width,), (i % 7) / 7.0, np.float32)
    return x, np.array([x.sum() % 2, 1.0], np.float32)


class Source:
    """Random access; a ``slowdata`` episode of this rank makes the first read of the batch
    after its step slow, once the training began that step."""

    def __init__(self, length: int, width: int, batch: int, slow: list[Alone], work: Path):
        self.length, self.width, self.batch, self.slow, self.work = length, width, batch, slow, work
        self.reads = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        batch = self.reads // self.batch
        self.reads += 1
        for episode in self.slow:
            if self.reads % self.batch == 1 and batch == episode.step + 1:
                # The pipeline reads ahead; from here the main thread will wait for this batch.
                STATE.wait_for(episode.step)
                timed(episode.kind, lambda e=episode: self.read_slowly(e.seconds))
        return row(i, self.width)

    def read_slowly(self, seconds: float) -> None:
        path = self.work / "slowdata.bin"
        path.write_bytes(os.urandom(64 * 1024))
        with open(path, "rb", buffering=0) as f:
            every(0.05, seconds, lambda: f.read(4096) or f.seek(0))


def timed(kind: str, action: Callable[[], None]) -> None:
    """Run ``action`` and print the episode's line with its wall-clock start and end, and a line
    as it begins (a job stopped during the episode shows when it began)."""
    what = f"rank {get_rank()} {'alone ' if kind in ALONE_KINDS and kind != 'shape' else ''}{kind}"
    start = time.time()
    print(f"{what} begins at {start:.3f}", flush=True)
    action()
    print(f"{what} from {start:.3f} to {time.time():.3f}", flush=True)


class Job:
    """The training and everything a rank does beside it."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, work: Path) -> None:
        self.args, self.rank, self.world, self.work = args, rank, world, work
        inside = [f for f in args.freeze if f.inside and f.rank == rank]
        STATE.inside = inside[0] if inside else None
        gate = nn.Identity()
        if any(f.inside for f in args.freeze):  # every rank: the same graph everywhere
            gate = CustomGate() if args.graph else PythonGate()
        self.net = Net(args.width, args.hidden, gate)
        self.loss_fn = nn.MSELoss()
        self.optimizer = nn.SGD(self.net.trainable_params(), learning_rate=0.05)
        self.eval_net = nn.WithEvalCell(self.net, self.loss_fn)
        self.eval_net.set_train(False)
        slow = [a for a in args.alone if a.kind == "slowdata" and a.rank == rank]
        self.source = Source(args.steps * args.batch * world, args.width, args.batch, slow, work)
        self.data = ms.dataset.GeneratorDataset(
            self.source, ["x", "y"], shuffle=False, num_shards=world, shard_id=rank,
            python_multiprocessing=False).batch(args.batch)

    def batch_of(self, rows: int, first: int) -> tuple[ms.Tensor, ms.Tensor]:
        samples = [row(first + j, self.args.width) for j in range(rows)]
        return (ms.Tensor(np.stack([s[0] for s in samples])),
                ms.Tensor(np.stack([s[1] for s in samples])))

    def before_step(self, step: int) -> None:
        """Freeze here if due; mark the step as begun for the freeze inside it."""
        for due in self.args.freeze:
            if due.rank == self.rank and due.step == step and not due.inside:
                freeze(due.kind)
        STATE.begin(step)

    def after_step(self, step: int) -> None:
        """What is due after ``step``: this rank's episodes, then every rank's."""
        STATE.training = False
        for episode in self.args.alone:
            if episode.step != step or episode.kind == "slowdata":
                continue
            if episode.kind == "shape":
                timed(episode.kind, self.new_shape)
            elif episode.rank == self.rank:
                timed(episode.kind, lambda e=episode: getattr(self, e.kind)(e.seconds))
        if step == self.args.eval_network_at:
            timed("eval-network", self.first_eval)

    def train_loop(self, step_cell: nn.Cell) -> None:
        iterator = self.data.create_tuple_iterator(num_epochs=self.args.epochs)
        step = 0
        for _ in range(self.args.epochs):
            for x, y in iterator:
                self.before_step(step)
                step_cell(x, y)
                self.after_step(step)
                step += 1

    def train_model(self) -> None:
        model = ms.Model(self.net, self.loss_fn, self.optimizer)
        model.train(self.args.epochs, self.data, callbacks=[Episodes(self)],
                    dataset_sink_mode=False)

    def train(self) -> None:
        if self.args.style == "model":
            self.train_model()
            return
        self.step_cell = nn.TrainOneStepCell(nn.WithLossCell(self.net, self.loss_fn),
                                             self.optimizer)
        self.step_cell.set_train()
        self.train_loop(self.step_cell)

    # What a rank does alone ------------------------------------------------------------------

    def write(self, seconds: float) -> None:
        chunk, path = os.urandom(CHUNK), self.work / "write.bin"
        with open(path, "wb") as f:
            def one_chunk() -> None:
                if f.tell() >= 32 * MB:
                    f.seek(0)
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            every(CHUNK / WRITE_RATE, seconds, one_chunk)
        path.unlink()

    def npsave(self, seconds: float) -> None:
        weights = np.random.default_rng(self.rank).random(CHUNK // 4, np.float32)
        every(SAVE_PERIOD, seconds, lambda: np.save(self.work / "weights.npy", weights))

    def pickle(self, seconds: float) -> None:
        state = {"dense": np.ones((1024, 512), np.float32), "bias": np.zeros(512, np.float32),
                 "step": 0}
        path = self.work / "state.pkl"

        def dump() -> None:
            with open(path, "wb") as f:
                pickle.dump(state, f)
        every(SAVE_PERIOD, seconds, dump)

    def tar(self, seconds: float) -> None:
        source = self.work / "tar_source.bin"
        with open(source, "wb") as f:
            f.truncate(int(PIPE_RATE * seconds))  # sparse: nothing on disk, tar reads zeros
        tar = subprocess.Popen(["tar", "cf", "-", "-C", str(self.work), source.name],
                               stdout=subprocess.PIPE)
        sink = subprocess.Popen([sys.executable, "-I", "-c", SLOW_SINK, str(PIPE_RATE)],
                                stdin=tar.stdout)
        tar.stdout.close()
        if sink.wait() or tar.wait():
            raise RuntimeError(f"tar {tar.returncode}, its sink {sink.returncode}")
        source.unlink()

    def cp(self, seconds: float) -> None:
        target = self.work / "copied.bin"
        feed = subprocess.Popen([sys.executable, "-I", "-c", SLOW_FEED, str(PIPE_RATE),
                                 str(int(PIPE_RATE * seconds))], stdout=subprocess.PIPE)
        cp = subprocess.Popen(["cp", "/dev/stdin", str(target)], stdin=feed.stdout)
        feed.stdout.close()
        if cp.wait() or feed.wait():
            raise RuntimeError(f"cp {cp.returncode}, its feed {feed.returncode}")
        target.unlink()

    def eval(self, seconds: float) -> None:
        batches = [self.batch_of(64, 64 * k) for k in range(8)]
        losses = []

        def one_batch() -> None:
            loss, _, _ = self.eval_net(*batches[len(losses) % len(batches)])
            losses.append(float(loss.asnumpy()))
        every(0.0, seconds, one_batch)

    def upload(self, seconds: float) -> None:
        body = self.work / "upload.bin"
        body.write_bytes(os.urandom(4 * MB))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowReceiver)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            put_slowly(server.server_address[1], body, int(UPLOAD_RATE * seconds))
        finally:
            server.shutdown()
            server.server_close()
            body.unlink()

    def new_shape(self) -> None:
        self.step_cell(*self.batch_of(2 * self.args.batch, self.rank * 2 * self.args.batch))

    def first_eval(self) -> None:
        first = FirstEval(self.net)
        first.set_train(False)
        for k in range(5):
            first(*self.batch_of(self.args.batch, k * self.args.batch))

    def warm_up(self, count: int) -> None:
        reduce, ones = AllReduceCell(), ms.Tensor(np.ones(8, np.float32))

        def all_reduces() -> None:
            for _ in range(count):
                reduce(ones)
        timed("warmup-allreduce", all_reduces)

    def checksum(self) -> float:
        return sum(float(np.abs(p.asnumpy()).sum()) for p in self.net.trainable_params())


class Episodes(ms.train.Callback):
    """``--style model``: the same points of the job, from ``Model.train``'s callbacks."""

    def __init__(self, job: Job) -> None:
        super().__init__()
        self.job = job

    @staticmethod
    def step_of(run_context) -> int:
        return run_context.original_args().cur_step_num - 1

    def on_train_step_begin(self, run_context) -> None:
        self.job.before_step(self.step_of(run_context))

    def on_train_step_end(self, run_context) -> None:
        step = self.step_of(run_context)
        if (step + 1) % self.job.args.steps:
            self.job.after_step(step)

    def on_train_epoch_end(self, run_context) -> None:
        self.job.after_step(self.step_of(run_context))


class SlowReceiver(http.server.BaseHTTPRequestHandler):
    """Reads a PUT's body at ``UPLOAD_RATE``, then answers 200."""

    def do_PUT(self) -> None:
        left, start, got = int(self.headers["Content-Length"]), time.monotonic(), 0
        while left:
            block = self.rfile.read(min(left, 64 * 1024))
            if not block:
                break
            got, left = got + len(block), left - len(block)
            pace(start, got / UPLOAD_RATE)
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def put_slowly(port: int, body: Path, size: int) -> None:
    """PUT ``size`` bytes, ``body``'s content over and over, in 256 kB chunks."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.putrequest("PUT", "/upload")
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    sent = 0
    with open(body, "rb") as f:
        while sent < size:
            chunk = f.read(min(256 * 1024, size - sent))
            if not chunk:
                f.seek(0)
                continue
            conn.send(chunk)
            sent += len(chunk)
    status = conn.getresponse().status
    conn.close()
    if status != 200:
        raise RuntimeError(f"upload answered {status}")


def main() -> None:
    args = parse_args()
    ms.set_device("CPU")
    if args.graph:
        ms.set_context(mode=ms.GRAPH_MODE)
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    ms.set_seed(1)
    work = Path(tempfile.mkdtemp(prefix=f"busy-alone-rank{rank}-"))
    try:
        job = Job(args, rank, world, work)
        if args.warmup_allreduce:
            job.warm_up(args.warmup_allreduce)
        job.train()
        print(f"checksum {job.checksum():.10f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
