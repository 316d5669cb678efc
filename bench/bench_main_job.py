"""The main job against the same work in plain MindSpore, both started by npu-launch.

``scripts/train_digits.py`` (the shared trainer with its defaults: AMP, dynamic loss scaling,
evaluation every epoch, checkpoints) and ``bench/plain_digits.py`` (the same CNN, data split,
per-rank batch, epochs and learning-rate curve, written with ``Model.train``) run alternately as
2-rank data-parallel jobs (``npu-launch --cards 2 --device cpu``), ``--pairs`` times, the order
flipped every pair. Printed: each run's wall time, held-out accuracy and per-rank samples/s (as
each script measures it: training samples from the end of the first step to the last); then the
medians and the main job's wall-time ratio to the plain script (target: <= 1.0).

    python bench/bench_main_job.py [--pairs 3] [--epochs 10]
"""
from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {"main job": REPO / "scripts" / "train_digits.py", "plain": REPO / "bench" / "plain_digits.py"}
RANK_LINE = re.compile(r"rank (\d): held-out accuracy ([\d.]+) after (\d+) steps \((\d+) samples/s")


def run_once(name: str, epochs: int) -> tuple[float, float, float, float]:
    """``(wall s, CPU s, mean accuracy, mean per-rank samples/s)`` of one 2-rank job; the CPU
    seconds are the launcher's, the scheduler's and the ranks' (all reaped descendants)."""
    with tempfile.TemporaryDirectory(prefix="bench-main-") as tmp:
        argv = [sys.executable, "-m", "launcher.cli", "--cards", "2", "--device", "cpu",
                "--log-dir", str(Path(tmp) / "logs"), str(SCRIPTS[name]), "--epochs", str(epochs)]
        cpu_before = _children_cpu()
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
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
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in SCRIPTS}
    print(f"{'pair':>4} {'job':<9} {'wall s':>7} {'CPU s':>6} {'accuracy':>9} {'samples/s/rank':>15}")
    for pair in range(args.pairs):
        order = list(SCRIPTS) if pair % 2 == 0 else list(reversed(SCRIPTS))
        for name in order:
            wall, cpu, accuracy, rate = run_once(name, args.epochs)
            results[name].append((wall, cpu, accuracy, rate))
            print(f"{pair:>4} {name:<9} {wall:>7.2f} {cpu:>6.1f} {accuracy:>9.4f} {rate:>15.0f}",
                  flush=True)
    medians = {name: [statistics.median(column) for column in zip(*runs)]
               for name, runs in results.items()}
    print(f"\nmedians over {args.pairs} pairs, {args.epochs} epochs, 2 ranks:")
    for name, (wall, cpu, accuracy, rate) in medians.items():
        print(f"  {name:<9} wall {wall:6.2f} s  CPU {cpu:5.1f} s  accuracy {accuracy:.4f}  "
              f"{rate:5.0f} samples/s per rank")
    main_job, plain = medians["main job"], medians["plain"]
    print(f"  main job / plain: wall {main_job[0] / plain[0]:.2f} (target <= 1.00), "
          f"CPU {main_job[1] / plain[1]:.2f}, samples/s {main_job[3] / plain[3]:.2f}")


if __name__ == "__main__":
    main()
