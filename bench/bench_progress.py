"""What hang detection costs and how fast it ends a hang, on a plain MindSpore script.

    python bench/bench_progress.py --runs 3 --steps 300 --timeouts 5 10 20

1. The rank hook's progress counting (``parallel.hook.progress``): the same 2-rank job
   (``tests/plain_scripts/plain_loop.py``, graph mode) with detection off (``--hang-timeout 0``:
   no hook) and on (the default), alternating, for a custom loop over a dataset iterator and for
   ``Model.train``. Prints the median of the ranks' mean step time (after the first two steps)
   and the ratio on/off. Separate jobs differ by more than 1% on this machine, so then the same
   in one MindSpore process, the hook patched in and out between blocks of steps; and the
   wrapper's own cost per call against a bare Python callable, which bounds what any step pays.
2. Hang to exit: rank 1 sleeps before its 4th step; the time from its sleep (the timestamp it
   prints) to npu-launch's exit, for each ``--hang-timeout``; and msrun's on the same job once
   (``--msrun``), which ends only when MindSpore's collective times out.

Do not run other work meanwhile: 2 cores, every figure is a wall time.
"""
from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLAIN = REPO / "tests" / "plain_scripts" / "plain_loop.py"
sys.path.insert(0, str(REPO))

from parallel.hook import progress  # noqa: E402


def launch(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2", *args]


def step_ms(hang_timeout: str, style: str, steps: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-progress-") as logs:
        done = subprocess.run(launch("--log-dir", logs, "--hang-timeout", hang_timeout, str(PLAIN),
                                     "--style", style, "--steps", str(steps), "--graph"),
                              capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        times = [float(t) for t in re.findall(r"step_ms (\S+)", done.stdout)]
        return statistics.mean(times)


def hook_cost(runs: int, steps: int) -> None:
    print(f"{'style':<8} {'off ms/step':>12} {'on ms/step':>11} {'on/off':>7}")
    for style in ("loop", "model"):
        off, on = [], []
        for run in range(runs):
            for setting in (("0", "600") if run % 2 == 0 else ("600", "0")):
                (off if setting == "0" else on).append(step_ms(setting, style, steps))
        a, b = statistics.median(off), statistics.median(on)
        print(f"{style:<8} {a:12.3f} {b:11.3f} {b / a:7.3f}")


def in_process_cost(blocks: int, steps: int) -> None:
    """One MindSpore process (graph mode, one device, no launcher): the same compiled step with
    ``Cell.__call__`` and the dataset iterator's ``__next__`` counted or not, in alternating
    blocks of ``steps`` steps (the hook patched in and out between blocks); the median of the
    blocks' step time per setting, and the median of each adjacent pair's ratio. This removes
    the run-to-run noise of separate jobs."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn
    from mindspore.dataset.engine import iterators
    from mindspore.nn import cell

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(1)
    net = nn.Dense(32, 2)
    loss = nn.MSELoss()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.01)
    rows = np.random.default_rng(0).random((steps * 8, 32), np.float32)
    data = ms.dataset.NumpySlicesDataset((rows, rows[:, :2]), ["x", "y"], shuffle=False).batch(8)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)
    model = ms.Model(net, loss, optimizer)
    plain_call, plain_next = cell.Cell.__call__, iterators.Iterator.__next__
    counted_call, counted_next = progress.counting_call(plain_call), progress.counting_next(plain_next)

    x, y = ms.Tensor(rows[:8]), ms.Tensor(rows[:8, :2])

    def cell_calls() -> None:
        for _ in range(steps):
            step(x, y)

    def loop() -> None:
        for x, y in data.create_tuple_iterator():
            step(x, y)

    def model_train() -> None:
        model.train(1, data, dataset_sink_mode=False)

    print(f"{'in one process':<16} {'off ms/step':>12} {'on ms/step':>11} {'on/off':>7} "
          f"{'paired':>7}")
    for name, run in (("compiled cell", cell_calls), ("loop", loop), ("Model.train", model_train)):
        run()  # compile
        times: dict[bool, list[float]] = {False: [], True: []}
        for block in range(blocks):
            for on in ((False, True) if block % 2 == 0 else (True, False)):
                cell.Cell.__call__ = counted_call if on else plain_call
                iterators.Iterator.__next__ = counted_next if on else plain_next
                started = time.perf_counter()
                run()
                times[on].append((time.perf_counter() - started) * 1000 / steps)
        cell.Cell.__call__, iterators.Iterator.__next__ = plain_call, plain_next
        off, on_ = statistics.median(times[False]), statistics.median(times[True])
        paired = statistics.median(a / b for a, b in zip(times[True], times[False]))
        print(f"{name:<16} {off:12.4f} {on_:11.4f} {on_ / off:7.4f} {paired:7.4f}")


def wrapper_cost() -> None:
    class Cell:
        def __call__(self, x: int) -> int:
            return x

    bare = Cell()
    counted_type = type("Counted", (), {"__call__": progress.counting_call(Cell.__call__)})
    counted = counted_type()
    n = 1_000_000
    t_bare = min(timeit.repeat(lambda: bare(1), number=n, repeat=5)) / n
    t_counted = min(timeit.repeat(lambda: counted(1), number=n, repeat=5)) / n
    print(f"counting_call: {(t_counted - t_bare) * 1e9:.0f} ns per top-level call "
          f"(bare call {t_bare * 1e9:.0f} ns)")


def hang_to_exit(argv: list[str], cwd: Path) -> tuple[float, int]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=cwd)
    hung_at = None
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"hangs before step \d+ at (\S+)", line)
        if found:
            hung_at = float(found.group(1))
    proc.wait()
    end = time.time()
    if hung_at is None:
        raise SystemExit(f"no hang seen: {argv}")
    return end - hung_at, proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hangs(timeouts: list[float], with_msrun: bool) -> None:
    job = [str(PLAIN), "--steps", "400", "--hang-rank", "1", "--hang-at-step", "3", "--graph"]
    print(f"{'launcher':<28} {'hang -> exit s':>15} {'exit code':>10}")
    for timeout in timeouts:
        with tempfile.TemporaryDirectory(prefix="bench-hang-") as logs:
            took, code = hang_to_exit(launch("--log-dir", logs, "--hang-timeout", f"{timeout:g}",
                                             *job), REPO)
        print(f"{f'npu-launch --hang-timeout {timeout:g}':<28} {took:15.1f} {code:10d}")
    if with_msrun:
        with tempfile.TemporaryDirectory(prefix="bench-hang-") as logs:
            argv = ["msrun", "--worker_num=2", "--local_worker_num=2",
                    f"--master_port={free_port()}", f"--log_dir={logs}", "--join=True",
                    "--tail_worker_log=-1", *job]
            took, code = hang_to_exit(argv, Path(logs))
        print(f"{'msrun':<28} {took:15.1f} {code:10d}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--timeouts", type=float, nargs="*", default=[5, 10, 20])
    parser.add_argument("--msrun", action="store_true")
    parser.add_argument("--blocks", type=int, default=20)
    args = parser.parse_args()
    hook_cost(args.runs, args.steps)
    in_process_cost(args.blocks, args.steps)
    wrapper_cost()
    hangs(args.timeouts, args.msrun)


if __name__ == "__main__":
    main()
