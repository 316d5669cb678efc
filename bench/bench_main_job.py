"""The main job against the same work in plain MindSpore, both started by npu-launch.

``scripts/train_digits.py`` (the shared trainer with its defaults: AMP, dynamic loss scaling,
evaluation every epoch, checkpoints) and ``bench/plain_digits.py`` (the same CNN, data split,
per-rank batch, epochs and learning-rate curve, written with ``Model.train``) run alternately as
2-rank data-parallel jobs (``npu-launch --cards 2 --device cpu``), ``--pairs`` times, the order
flipped every pair. Printed: each run's wall time, held-out accuracy and per-rank samples/s (as
each script measures it: training samples from the end of the first step to the last); then the
medians and the main job's wall-time ratio to the plain script (target: <= 1.0).

    python bench/bench_main_job.py [--pairs 3] [--epochs 10] [--trees NAME=DIR ...]

With ``--trees``, the main job of each tree (its packages first on PYTHONPATH, its own
``scripts/train_digits.py``) against the same plain runs, all taking turns.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench_launch import parse_trees

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {"main job": REPO / "scripts" / "train_digits.py", "plain": REPO / "bench" / "plain_digits.py"}
RANK_LINE = re.compile(r"rank (\d): held-out accuracy ([\d.]+) after (\d+) steps \((\d+) samples/s")


def run_once(name: str, epochs: int, tree: Optional[Path] = None) -> tuple[float, float, float, float]:
    """``(wall s, CPU s, mean accuracy, mean per-rank samples/s)`` of one 2-rank job (``tree``:
    that tree's launcher, packages and script); the CPU seconds are the launcher's, the
    scheduler's and the ranks' (all reaped descendants)."""
    script = SCRIPTS[name] if tree is None else tree / SCRIPTS[name].relative_to(REPO)
    env = dict(os.environ) if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory(prefix="bench-main-") as tmp:
        argv = [sys.executable, "-m", "launcher.cli", "--cards", "2", "--device", "cpu",
                "--log-dir", str(Path(tmp) / "logs"), str(script), "--epochs", str(epochs)]
        cpu_before = _children_cpu()
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        cpu = _children_cpu() - cpu_before
    ranks = RANK_LINE.findall(done.stdout)
    if done.returncode != 0 or len(ranks) != 2:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return (wall, cpu, statistics.mean(float(r[1]) for r in ranks),
            statistics.mean(float(r[3]) for r in ranks))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--trees", nargs="*", default=[], metavar="NAME=DIR")
    args = parser.parse_args()
    trees = parse_trees(args.trees)
    contenders: dict[str, tuple[str, Optional[Path]]] = {
        ("main job" if len(trees) == 1 else f"main {name}"): ("main job", tree)
        for name, tree in trees.items()}
    contenders["plain"] = ("plain", None)
    results: dict[str, list[tuple[float, float, float, float]]] = {label: [] for label in contenders}
    width = max(len(label) for label in contenders)
    print(f"{'pair':>4} {'job':<{width}} {'wall s':>7} {'CPU s':>6} {'accuracy':>9} {'samples/s/rank':>15}")
    for pair in range(args.pairs):
        order = list(contenders) if pair % 2 == 0 else list(reversed(contenders))
        for label in order:
            job, tree = contenders[label]
            wall, cpu, accuracy, rate = run_once(job, args.epochs, tree)
            results[label].append((wall, cpu, accuracy, rate))
            print(f"{pair:>4} {label:<{width}} {wall:>7.2f} {cpu:>6.1f} {accuracy:>9.4f} {rate:>15.0f}",
                  flush=True)
    medians = {label: [statistics.median(column) for column in zip(*runs)]
               for label, runs in results.items()}
    print(f"\nmedians over {args.pairs} pairs, {args.epochs} epochs, 2 ranks:")
    for label, (wall, cpu, accuracy, rate) in medians.items():
        print(f"  {label:<{width}} wall {wall:6.2f} s  CPU {cpu:5.1f} s  accuracy {accuracy:.4f}  "
              f"{rate:5.0f} samples/s per rank")
    plain = medians["plain"]
    for label in contenders:
        if label != "plain":
            main_job = medians[label]
            print(f"  {label} / plain: wall {main_job[0] / plain[0]:.2f} (target <= 1.00), "
                  f"CPU {main_job[1] / plain[1]:.2f}, samples/s {main_job[3] / plain[3]:.2f}")


if __name__ == "__main__":
    main()
