"""Trainer step throughput against plain MindSpore on the same small CNN and data.

Contenders, each with its own network (same seed), optimizer and dataset object:

* ``model``: ``mindspore.train.Model(net, loss, opt).train(..., dataset_sink_mode=False)``
  (``TrainOneStepCell``; the baseline),
* ``plain_cell``: a hand-written ``value_and_grad`` step ``Cell`` in a Python loop,
* ``trainer``: ``parallel.trainer.Trainer`` with its defaults (O0, no loss scaling),
* ``trainer_skip``: the trainer skipping non-finite updates without loss scaling,
* ``trainer_dynamic``: the trainer with dynamic loss scaling (what O1-O3 use).

Every contender is compiled and warmed up first; then the rounds alternate them (rotating the
order), each round timing ``--epochs`` whole epochs of each by wall clock and by this process's
CPU time. Reported: samples/s and time ratios to ``model`` (target: the trainer no more than 3%
slower).

    python bench/bench_trainer.py [--rounds 7] [--epochs 2] [--batch 32]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any, Callable

import numpy as np

Runner = Callable[[int], None]


@dataclasses.dataclass(frozen=True)
class Setup:
    """The benchmark's knobs."""

    rounds: int
    epochs: int
    batch: int


def main() -> None:
    """Parse arguments, run the rounds, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    setup = Setup(args.rounds, args.epochs, args.batch)
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    runners = {name: build(setup) for name, build in CONTENDERS.items()}
    times = measure(runners, setup)
    report(times, setup, samples_per_epoch(setup))


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images / 16).astype(np.float32)[:, None], data.target.astype(np.int32)


def samples_per_epoch(setup: Setup) -> int:
    return len(digits()[1]) // setup.batch * setup.batch


def make_parts(setup: Setup) -> tuple[Any, Any, Any, Any]:
    """Network, loss, optimizer, shuffled dataset: identical for every contender."""
    import mindspore as ms
    from mindspore import dataset as ds
    from mindspore import nn

    class SmallCNN(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3)
            self.conv2 = nn.Conv2d(16, 32, 3, stride=2)
            self.relu = nn.ReLU()
            self.flatten = nn.Flatten()
            self.dense = nn.Dense(32 * 4 * 4, 10)

        def construct(self, x: Any) -> Any:
            return self.dense(self.flatten(self.relu(self.conv2(self.relu(self.conv1(x))))))

    ms.set_seed(1)
    net = SmallCNN()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.02, momentum=0.9)
    x, y = digits()
    data = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=True)
    return net, loss, optimizer, data.batch(setup.batch, drop_remainder=True)


def build_model(setup: Setup) -> Runner:
    from mindspore.train import Model

    net, loss, optimizer, data = make_parts(setup)
    model = Model(net, loss, optimizer)
    return lambda epochs: model.train(epochs, data, dataset_sink_mode=False)


def build_plain_cell(setup: Setup) -> Runner:
    import mindspore as ms
    from mindspore import nn

    net, loss, optimizer, data = make_parts(setup)

    class Step(nn.Cell):
        def __init__(self) -> None:
            super().__init__(auto_prefix=False)
            self.net_with_loss = nn.WithLossCell(net, loss)
            self.optimizer = optimizer
            self.grad_fn = ms.value_and_grad(self.net_with_loss, None, optimizer.parameters)

        def construct(self, x: Any, y: Any) -> Any:
            value, grads = self.grad_fn(x, y)
            self.optimizer(grads)
            return value

    step = Step()
    step.set_train()

    def run(epochs: int) -> None:
        iterator = data.create_tuple_iterator(num_epochs=epochs)
        for _ in range(epochs):
            for x, y in iterator:
                value = step(x, y)
        value.asnumpy()

    return run


def build_trainer(setup: Setup, **options: Any) -> Runner:
    from parallel.trainer import Trainer

    net, loss, optimizer, data = make_parts(setup)
    trainer = Trainer(net, loss, optimizer, data, log_every=10 ** 9, **options)
    return lambda epochs: trainer.fit(epochs=trainer.position.epoch + epochs)


CONTENDERS: dict[str, Callable[[Setup], Runner]] = {
    "model": build_model,
    "plain_cell": build_plain_cell,
    "trainer": build_trainer,
    "trainer_skip": lambda setup: build_trainer(setup, skip_nonfinite=True),
    "trainer_dynamic": lambda setup: build_trainer(setup, loss_scale="dynamic"),
}


@dataclasses.dataclass
class Timings:
    """Per contender: wall seconds and process CPU seconds of each round."""

    wall: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)


def measure(runners: dict[str, Runner], setup: Setup) -> dict[str, Timings]:
    """Time ``setup.epochs`` epochs of each contender per round, alternating the order."""
    for run in runners.values():
        run(1)  # compiles
    names = list(runners)
    timings = {name: Timings() for name in names}
    for round_index in range(setup.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = time.perf_counter(), time.process_time()
            runners[name](setup.epochs)
            timings[name].cpu.append(time.process_time() - cpu)
            timings[name].wall.append(time.perf_counter() - wall)
    return timings


def report(timings: dict[str, Timings], setup: Setup, per_epoch: int) -> None:
    """Per contender: samples/s by median and best wall time, and time ratios to ``model``.

    On a shared machine the wall clock mostly measures the neighbours; the CPU time this process
    used (all its threads) is the steadier comparison.
    """
    samples = per_epoch * setup.epochs
    base = timings["model"]
    base_wall, base_best, base_cpu = (statistics.median(base.wall), min(base.wall),
                                      statistics.median(base.cpu))
    print(f"{setup.rounds} rounds x {setup.epochs} epochs x {per_epoch} samples "
          f"(batch {setup.batch}), 8x8 digits, small CNN, CPU")
    print(f"{'contender':<16}{'median/s':>9}{'best/s':>8}{'median wall':>13}{'best wall':>11}"
          f"{'median cpu':>12}   (ratios: time / model's)")
    for name, t in timings.items():
        wall, best, cpu = statistics.median(t.wall), min(t.wall), statistics.median(t.cpu)
        print(f"{name:<16}{samples / wall:>9.0f}{samples / best:>8.0f}{wall / base_wall:>12.3f}x"
              f"{best / base_best:>10.3f}x{cpu / base_cpu:>11.3f}x")


if __name__ == "__main__":
    main()
