"""Throughput of the sharded MindRecord reader: per rank, against one process reading everything.

    python bench/bench_reader.py --samples 20000 --ranks 1 2 4 --workers 1 2

Writes one MindRecord set (a 32x32x3 uint8 image as raw bytes plus an int32 label per sample),
then, for each worker count, reads it:
  plain        mindspore.dataset.MindDataset with shuffle, unsharded, one process (the baseline)
  sharded      parallel.data.sharded_dataset, R ranks as R concurrent processes, each its own shard
Every reader batches by --batch and runs --epochs epochs through one iterator, as training does.
Samples/s counts the samples a rank receives over the wall time from building its dataset to the
end of its last epoch; "startup" is the part of that before the first batch arrived. "aggregate"
adds up the ranks' samples and divides by the slowest rank's time.
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import List, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Job:
    """One reader process: which shard of which files, how."""

    files: str
    rank: int
    world: int
    workers: int
    batch: int
    epochs: int
    plain: bool


@dataclasses.dataclass(frozen=True)
class Timing:
    """What one reader process measured."""

    samples: int
    seconds: float
    startup: float
    """Seconds from building the dataset to the first batch (pipeline start, sampler, file index)."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table."""

    reader: str
    ranks: int
    workers: int
    timings: Sequence[Timing]

    def cells(self) -> List[str]:
        per_rank = [t.samples / t.seconds for t in self.timings]
        total = sum(t.samples for t in self.timings) / max(t.seconds for t in self.timings)
        startup = statistics.median(t.startup for t in self.timings)
        return [self.reader, str(self.ranks), str(self.workers), str(self.timings[0].samples),
                f"{startup:.2f}", f"{statistics.median(per_rank):,.0f}", f"{total:,.0f}"]


def write_data(folder: Path, samples: int, files: int) -> str:
    from parallel.data import write_mindrecord

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (samples, 32 * 32 * 3), dtype=np.uint8)
    arrays = {"image": np.array([row.tobytes() for row in images], dtype=object),
              "label": rng.integers(0, 10, samples, dtype=np.int32)}
    return str(write_mindrecord(arrays, folder / "bench.mindrecord", num_files=files)[0])


def read(job: Job) -> Timing:
    """Build the dataset, run every epoch, count what arrived."""
    start = time.perf_counter()
    dataset = _plain(job) if job.plain else _sharded(job)
    iterator = dataset.create_tuple_iterator(num_epochs=job.epochs, output_numpy=True)
    samples, first = 0, None
    for _ in range(job.epochs):
        for batch in iterator:
            first = first or time.perf_counter()
            samples += len(batch[1])
    end = time.perf_counter()
    return Timing(samples=samples, seconds=end - start, startup=(first or end) - start)


def _plain(job: Job):
    import mindspore.dataset as ds

    dataset = ds.MindDataset(job.files, shuffle=True, num_parallel_workers=job.workers)
    return dataset.batch(job.batch, drop_remainder=True, num_parallel_workers=job.workers)


def _sharded(job: Job):
    from parallel.config import ParallelConfig
    from parallel.data import sharded_dataset
    from parallel.mode.topology import RankInfo

    info = RankInfo.in_layout(job.rank, job.world, ParallelConfig(seed=1))
    return sharded_dataset(job.files, info, job.batch, num_workers=job.workers)


def measure(jobs: Sequence[Job]) -> List[Timing]:
    """Run the jobs as concurrent processes (spawned: each imports MindSpore afresh, like a rank)."""
    with multiprocessing.get_context("spawn").Pool(len(jobs), initializer=_import_readers) as pool:
        return pool.map(read, jobs)


def _import_readers() -> None:
    # Importing MindSpore takes seconds when ranks start together on few cores; keep it out of the timing.
    import mindspore.dataset  # noqa: F401

    import parallel.data  # noqa: F401


def table(rows: Sequence[Row]) -> str:
    header = ["reader", "ranks", "workers", "samples/rank", "startup s", "samples/s per rank",
              "aggregate samples/s"]
    lines = [header] + [row.cells() for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--files", type=int, default=4, help="MindRecord files in the set")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_reader ") as folder:
        files = write_data(Path(folder), args.samples, args.files)
        rows = []
        for workers in args.workers:
            job = Job(files, 0, 1, workers, args.batch, args.epochs, plain=True)
            rows.append(Row("plain", 1, workers, measure([job])))
            for world in args.ranks:
                jobs = [dataclasses.replace(job, rank=r, world=world, plain=False) for r in range(world)]
                rows.append(Row("sharded", world, workers, measure(jobs)))
    print(f"{args.samples} samples of 3 KiB in {args.files} files, batch {args.batch}, "
          f"{args.epochs} epochs, {multiprocessing.cpu_count()} CPUs")
    print(table(rows))


if __name__ == "__main__":
    main()
