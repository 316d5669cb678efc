"""The shared trainer, single process, real MindSpore on CPU, 8x8 digits and a handful of steps."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import mindspore as ms
import numpy as np
import pytest
from mindspore import dataset as ds
from mindspore import nn

from parallel import contract
from parallel.checkpoints import checkpoint
from parallel.config import ExecMode
from parallel.trainer import (
    AmpError,
    Callback,
    LossScaleConfig,
    LossScaleMode,
    LrSchedule,
    Signal,
    StepInfo,
    Trainer,
    TrainerError,
)

pytestmark = pytest.mark.mindspore


@pytest.fixture(autouse=True)
def graph_mode(lone_rank: Any) -> None:
    """Every test here trains in the mode ``parallel.init()`` selected for this lone process."""
    assert (lone_rank.exec_mode, lone_rank.world_size) == (ExecMode.GRAPH, 1)
    assert ms.get_context("mode") == ms.GRAPH_MODE


def digits(count: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images[:count] / 16).astype(np.float32)[:, None]
    return images, data.target[:count].astype(np.int32)


class TinyCNN(nn.Cell):
    """Conv + BatchNorm + Dense on 8x8 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, pad_mode="valid")
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.dense = nn.Dense(4 * 6 * 6, 10)

    def construct(self, x: Any) -> Any:
        return self.dense(self.flatten(self.relu(self.bn(self.conv(x)))))


class TinyMLP(nn.Cell):
    """No batch statistics, so batch composition does not change the math."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.hidden = nn.Dense(64, 16)
        self.relu = nn.ReLU()
        self.out = nn.Dense(16, 10)

    def construct(self, x: Any) -> Any:
        return self.out(self.relu(self.hidden(self.flatten(x))))


def dataset(x: np.ndarray, y: np.ndarray, batch: int, shuffle: bool = False) -> Any:
    return ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=shuffle).batch(batch)


def loss_fn() -> nn.Cell:
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def make(net_cls: type = TinyMLP, seed: int = 1, lr: Any = 0.1,
         **options: Any) -> tuple[Trainer, nn.Cell]:
    """A trainer on the first 64 digits in batches of 8 (8 batches an epoch)."""
    ms.set_seed(seed)
    net = net_cls()
    data = options.pop("train_ds", None) or dataset(*digits(64), batch=8)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    return Trainer(net, loss_fn(), optimizer, data, **options), net


def trainable(net: nn.Cell) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


class Recorder(Callback):
    """Keeps the parameters and loss scale after every step; can stop or crash at a step."""

    def __init__(self, trainer: Optional[Trainer] = None, net: Optional[nn.Cell] = None,
                 stop_at: Optional[int] = None, crash_at: Optional[int] = None) -> None:
        self.trainer, self.net = trainer, net
        self.stop_at, self.crash_at = stop_at, crash_at
        self.params: list[dict[str, np.ndarray]] = []
        self.scales: list[float] = []
        self.checkpoints: list[int] = []

    def on_step_end(self, info: StepInfo) -> Optional[Signal]:
        if self.net is not None:
            self.params.append(trainable(self.net))
            self.scales.append(self.trainer.loss_scale)
        if info.global_step == self.crash_at:
            raise RuntimeError("simulated rank crash")
        return Signal.STOP if info.global_step == self.stop_at else None

    def on_checkpoint(self, step: int, path: str) -> None:
        self.checkpoints.append(step)


# Loss scaling ------------------------------------------------------------------------------------

def overflowing_data() -> Any:
    """Six batches of four; the second holds an inf, so its gradients overflow."""
    x, y = digits(24)
    x = x.copy()
    x[5, 0, 3, 3] = np.inf
    return dataset(x, y, batch=4)


def record_steps(**options: Any) -> tuple[Recorder, Any, dict[str, np.ndarray]]:
    trainer, net = make(train_ds=overflowing_data(), **options)
    initial = trainable(net)
    recorder = Recorder(trainer, net)
    trainer.callbacks = (recorder,)
    return recorder, trainer.fit(epochs=1), initial


def test_dynamic_loss_scale_halves_and_skips_on_overflow_then_grows_back() -> None:
    config = LossScaleConfig(LossScaleMode.DYNAMIC, init_scale=1024, factor=2, window=2)
    recorder, result, initial = record_steps(loss_scale=config)

    assert recorder.scales == [1024, 512, 512, 1024, 1024, 2048]
    assert max_diff(recorder.params[1], recorder.params[0]) == 0.0  # the overflow step is skipped
    assert max_diff(recorder.params[0], initial) > 0
    assert all(max_diff(recorder.params[i], recorder.params[i - 1]) > 0 for i in (2, 3, 4, 5))
    assert result.skipped_steps == 1 and result.loss_scale == 2048
    assert all(np.isfinite(v).all() for v in recorder.params[-1].values())


def test_fixed_loss_scale_keeps_the_scale_and_still_skips() -> None:
    fixed = LossScaleConfig(LossScaleMode.FIXED, init_scale=64)
    recorder, result, _ = record_steps(loss_scale=fixed)
    assert recorder.scales == [64.0] * 6
    assert max_diff(recorder.params[1], recorder.params[0]) == 0.0
    assert result.skipped_steps == 1


def test_without_scaling_nonfinite_updates_are_applied_unless_asked_to_skip() -> None:
    recorder, result, _ = record_steps(loss_scale="none")
    assert not np.isfinite(recorder.params[1]["hidden.weight"]).all()

    recorder, result, _ = record_steps(loss_scale="none", skip_nonfinite=True)
    assert max_diff(recorder.params[1], recorder.params[0]) == 0.0 and result.skipped_steps == 1


# Gradient accumulation ---------------------------------------------------------------------------

def test_gradient_accumulation_matches_the_bigger_batch() -> None:
    x, y = digits(80)
    # 10 micro-batches of 8 in windows of 4, 4 and 2 against batches of 32, 32 and 16.
    accumulated, net_a = make(train_ds=dataset(x, y, batch=8), grad_accumulation=4)
    big, net_b = make(train_ds=dataset(x, y, batch=32))
    initial = trainable(net_a)
    result_a, result_b = accumulated.fit(epochs=2), big.fit(epochs=2)

    assert result_a.steps == result_b.steps == 6
    assert max_diff(trainable(net_a), initial) > 1e-3
    assert max_diff(trainable(net_a), trainable(net_b)) <= 1e-5
    assert result_a.final_loss == pytest.approx(result_b.final_loss, abs=1e-5)


# Resume ------------------------------------------------------------------------------------------

def resumable(ckpt_dir: Path, seed: int, **options: Any) -> tuple[Trainer, nn.Cell]:
    """CNN with BatchNorm, momentum, a warm-up cosine schedule and dynamic loss scaling, on a
    shuffled dataset: every piece of state a resume has to restore."""
    schedule = LrSchedule.warmup_cosine(0.2, total_steps=16, warmup_steps=3)
    made = make(TinyCNN, seed=seed, lr=schedule.build(), ckpt_dir=ckpt_dir,
                train_ds=dataset(*digits(64), batch=8, shuffle=True),
                loss_scale=LossScaleConfig(init_scale=2.0 ** 10, window=3), **options)
    # After make(): ms.set_seed(seed) also seeds the data pipeline, whose shuffles the resumed run
    # must share with the first one (the network's initial weights it must not).
    ds.config.set_seed(7)
    return made


@pytest.mark.parametrize("interruption", ["stop", "crash"])
def test_resume_auto_continues_exactly_where_it_was(tmp_path: Path, interruption: str) -> None:
    straight, net = resumable(tmp_path / "straight", seed=1)
    expected = straight.fit(epochs=2)
    reference = trainable(net)

    ckpt_dir = tmp_path / "interrupted run"
    first, _ = resumable(ckpt_dir, seed=1, ckpt_every_steps=3)
    if interruption == "stop":  # 1.5 epochs, then a clean stop that saves step 12
        assert first.fit(epochs=2, max_steps=12).stopped_early
        saved = 12
    else:  # dies at step 13, after the step-12 checkpoint: step 13 is lost and redone
        first.callbacks = (Recorder(crash_at=13),)
        with pytest.raises(RuntimeError, match="simulated rank crash"):
            first.fit(epochs=2)
        saved = 12
    assert checkpoint.latest_complete(ckpt_dir).position == checkpoint.DataPosition(1, 4, saved)

    resumed, resumed_net = resumable(ckpt_dir, seed=99, resume="auto")
    assert resumed.resumed_from == saved
    result = resumed.fit(epochs=2)

    assert result.steps == expected.steps == 16 and result.steps_run == 16 - saved
    assert max_diff(trainable(resumed_net), reference) <= 1e-5
    assert result.loss_scale == expected.loss_scale


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path: Path) -> None:
    trainer, _ = make(ckpt_dir=tmp_path, resume="auto")
    assert trainer.resumed_from is None
    assert trainer.fit(epochs=1).steps == 8


# Checkpoints, events, callbacks ------------------------------------------------------------------

def test_checkpoints_every_n_steps_keep_the_last_k(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer, _ = make(ckpt_dir=tmp_path, ckpt_every_steps=3, ckpt_every_epochs=None, keep_last=2,
                      callbacks=(recorder,), loss_scale="dynamic")
    result = trainer.fit(epochs=2)

    assert recorder.checkpoints == [3, 6, 9, 12, 15, 16]
    assert [m.step for m in checkpoint.complete_steps(tmp_path)] == [15, 16]
    assert checkpoint.list_steps(tmp_path) == [15, 16]
    assert result.last_checkpoint == str(checkpoint.rank_checkpoint_path(tmp_path, 16, 0))
    saved = ms.load_checkpoint(result.last_checkpoint)
    assert {"hidden.weight", "moments.hidden.weight", "global_step",
            "npu_launch.loss_scale", "npu_launch.epoch"} <= set(saved)
    assert int(saved["global_step"].asnumpy()[0]) == 16


def test_events_report_steps_checkpoints_and_the_end(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    events_file = tmp_path / "events.jsonl"
    monkeypatch.setenv(contract.EVENTS_FILE, str(events_file))
    trainer, _ = make(ckpt_dir=tmp_path / "ckpt", log_every=3, loss_scale="dynamic")
    result = trainer.fit(epochs=1)

    records = [json.loads(line) for line in events_file.read_text().splitlines()]
    steps = [r for r in records if r["event"] == contract.EVENT_STEP]
    assert [r["step"] for r in steps] == [3, 6]
    assert all(r["loss"] > 0 and r["samples_per_s"] > 0 and r["loss_scale"] == 2.0 ** 16
               for r in steps)
    [saved] = [r for r in records if r["event"] == contract.EVENT_CHECKPOINT]
    assert saved["step"] == 8 and Path(saved["path"]).is_file()
    [finished] = [r for r in records if r["event"] == contract.EVENT_FINISHED]
    assert finished["steps"] == 8 and finished["final_loss"] == pytest.approx(result.final_loss)
    assert finished["samples_per_s"] == pytest.approx(result.samples_per_s)


def test_a_callback_can_stop_training_and_the_stop_is_saved(tmp_path: Path) -> None:
    trainer, _ = make(ckpt_dir=tmp_path, callbacks=(Recorder(stop_at=3),))
    result = trainer.fit(epochs=5)
    assert result.steps == 3 and result.stopped_early
    assert checkpoint.latest_complete(tmp_path).position == checkpoint.DataPosition(0, 3, 3)


# Evaluation and throughput -----------------------------------------------------------------------

def test_evaluation_accuracy_and_throughput() -> None:
    x, y = digits(96)
    eval_ds = dataset(x[64:], y[64:], batch=10)
    trainer, net = make(eval_ds=eval_ds)
    result = trainer.fit(epochs=3)

    net.set_train(False)
    predicted = net(ms.Tensor(x[64:])).asnumpy().argmax(axis=1)
    assert result.eval.samples == 32
    assert result.accuracy == pytest.approx(float((predicted == y[64:]).mean()))
    assert result.accuracy > 0.5  # 3 epochs on 64 digits learn something
    assert result.samples_per_s > 0 and result.global_samples_per_s == result.samples_per_s
    assert result.epochs == 3 and np.isfinite(result.final_loss)


def test_evaluating_between_epochs_leaves_the_training_state_alone() -> None:
    x, y = digits(96)
    with_eval, net_a = make(TinyCNN, eval_ds=dataset(x[64:], y[64:], batch=16))
    without, net_b = make(TinyCNN)
    assert with_eval.fit(epochs=2).eval is not None and without.fit(epochs=2).eval is None
    everything = {p.name: p.asnumpy() for p in net_a.get_parameters()}
    # Includes BatchNorm's moving statistics, which evaluation in training mode would update.
    assert max_diff(everything, {p.name: p.asnumpy() for p in net_b.get_parameters()}) == 0.0


def test_the_trainer_runs_in_the_graph_mode_parallel_init_selected(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="parallel.trainer"):
        trainer, _ = make()
        assert trainer.fit(epochs=1, max_steps=2).steps == 2
    assert ms.get_context("mode") == ms.GRAPH_MODE
    assert [r.getMessage() for r in caplog.records if "PyNative" in r.getMessage()] == []


# AMP ---------------------------------------------------------------------------------------------

F16, F32 = ms.float16, ms.float32
# The dtype each TinyCNN layer computes in, then what the network hands the loss. O1 casts the
# white-listed cells (Conv, Dense) and casts their outputs back; O2 casts all but the black-listed
# ones (BatchNorm); O3 casts everything; every level hands the loss float32.
AMP_DTYPES = {
    "O0": {"conv": F32, "bn": F32, "relu": F32, "flatten": F32, "dense": F32, "output": F32},
    "O1": {"conv": F16, "bn": F32, "relu": F32, "flatten": F32, "dense": F16, "output": F32},
    "O2": {"conv": F16, "bn": F32, "relu": F16, "flatten": F16, "dense": F16, "output": F32},
    "O3": {"conv": F16, "bn": F16, "relu": F16, "flatten": F16, "dense": F16, "output": F32},
}


def dtypes_inside(net: TinyCNN, amp_network: nn.Cell, x: np.ndarray) -> dict[str, Any]:
    """Run ``x`` through ``net``'s layers one by one, as its ``construct`` does, and record the
    dtype each layer computes in (inside any cast wrapper AMP put around it)."""
    seen, h = {}, ms.Tensor(x)
    for name in AMP_DTYPES["O0"]:
        if name == "output":
            seen[name] = amp_network(ms.Tensor(x)).dtype
            continue
        layer = getattr(net, name)
        seen[name] = getattr(layer, "_backbone", layer)(h).dtype  # AMP's _OutputTo16/_OutputTo32
        h = layer(h)
    return seen


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_amp_levels_train_on_cpu_in_their_dtypes(level: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="parallel.trainer"):
        trainer, net = make(TinyCNN, amp_level=level)
    before = trainable(net)
    result = trainer.fit(epochs=1, max_steps=3)

    assert result.steps == 3 and np.isfinite(result.final_loss)
    assert max_diff(trainable(net), before) > 0
    assert dtypes_inside(net, trainer.amp_network, digits(4)[0]) == AMP_DTYPES[level]
    notes = [r.getMessage() for r in caplog.records if "AMP" in r.getMessage()]
    assert notes == ([] if level == "O0" else
                     [f"AMP {level} on CPU: float16 kernels are slower than float32 here, so it "
                      "runs but saves no time (it pays off on Ascend)"])


def test_o1_casts_cells_in_place_without_rewriting_source(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # MindSpore's own O1 writes ./rewritten_network/*.py here

    class LocalNet(nn.Cell):  # MindSpore's own O1 fails on it: NameError: 'LocalNet'
        def __init__(self) -> None:
            super().__init__()
            self.inner = TinyMLP()

        def construct(self, x: Any) -> Any:
            return self.inner(x)

    trainer, net = make(LocalNet, amp_level="O1")
    names = [p.name for p in net.trainable_params()]
    before = trainable(net)
    assert trainer.fit(epochs=1, max_steps=2).steps == 2

    assert trainer.amp_network is net and list(tmp_path.iterdir()) == []
    assert names == ["inner.hidden.weight", "inner.hidden.bias", "inner.out.weight",
                     "inner.out.bias"]
    assert type(net.inner.hidden).__name__ == "_OutputTo32"
    assert max_diff(trainable(net), before) > 0  # the saved (original) parameters trained


def test_bfloat16_is_refused_on_cpu_in_one_line() -> None:
    with pytest.raises(AmpError, match=r"^AMP O2 with bfloat16 cannot run on CPU: .* no BFloat16"):
        make(amp_level="O2", amp_dtype="bf16")


# Options -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, error, message", [
    ({"grad_accumulation": 0}, TrainerError, "trainer options must be positive: grad_accumulation=0"),
    ({"clip_grad_norm": -1.0}, TrainerError, "must be positive: clip_grad_norm=-1.0"),
    ({"amp_level": "O4"}, AmpError, "amp_level must be one of O0|O1|O2|O3, got 'O4'"),
    ({"loss_scale": "huge"}, AmpError, "loss_scale must be one of dynamic|fixed|none, got 'huge'"),
    ({"resume": "auto"}, TrainerError, "resume='auto' needs a ckpt_dir"),
    ({"resume": "sometimes"}, TrainerError, "resume must be auto|never, got 'sometimes'"),
    ({"gradient_accumulation": 2}, TypeError, "unexpected keyword argument 'gradient_accumulation'"),
])
def test_bad_options_are_refused(options: dict, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        make(**options)
    assert message in str(caught.value)


def test_gradient_clipping_bounds_the_first_update() -> None:
    clipped, net = make(lr=1.0, clip_grad_norm=1e-3, loss_scale="dynamic")
    initial = trainable(net)
    clipped.fit(epochs=1, max_steps=1)
    moved = np.sqrt(sum(((trainable(net)[k] - initial[k]) ** 2).sum() for k in initial))
    assert 0 < moved <= 1e-3 * (1 + 1e-4)  # first momentum step: lr * clipped gradient
