"""What the diagnosis of a failed job's logs costs (issue 40): throughput and memory of
``npu-launch diagnose`` on a log directory, and what it adds to a failed job's end.

    python bench/bench_diagnose.py [--ranks 8] [--mb 64] [--runs 3]

Writes ``--ranks`` rank logs of ``--mb`` MB each of MindSpore-like lines (INFO and WARNING
chatter, a Python traceback now and then), rank 3 ending in a device out-of-memory error and
the others in HCCL's EI0006 timeout; then, ``--runs`` times, the whole directory through
``diagnose_paths`` (medians), one file alone, and the live path (``diagnose_files`` with the
0.15 s deadline the launcher gives it). Memory is the peak RSS of this process and of the
grep children (``ru_maxrss``).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.diagnose import diagnose_files, diagnose_paths, load  # noqa: E402
from launcher.diagnose.job import BUDGET  # noqa: E402
from launcher.diagnose.sources import collect  # noqa: E402

CHATTER = (
    b"[INFO] MD(1234,fffe7bfff1e0,python):2026-12-04-10:11:12.345.678 [mindspore/ccsrc/minddata/"
    b"dataset/engine/datasetops/data_queue_op.cc:101] SendDataToAscend] Send 128 rows to device\n"
    b"[WARNING] DEVICE(1234,ffff8ba74480,python):2026-12-04-10:11:12.411.770 [mindspore/ccsrc/"
    b"plugin/device/ascend/hal/hardware/ge_graph_executor.cc:255] RunGraph] graph 3 took 41 ms\n"
    b"epoch: 3 step: 1200, loss is 0.4312, per step time: 183.214 ms\n"
    b"Traceback (most recent call last):\n  File \"/work/train.py\", line 88, in <module>\n"
    b"    main()\n"
)
OOM = b"        [driver interface] halMemAlloc failed: device_id=3, size=32212254720, type=2\n"
EI0006 = b"EI0006: Getting socket times out. Reason: 1. The remote does not initiate a connect.\n"


def write_logs(folder: Path, ranks: int, megabytes: int) -> int:
    block = CHATTER * ((1 << 20) // len(CHATTER) + 1)
    total = 0
    for rank in range(ranks):
        with open(folder / f"rank_{rank}.log", "wb") as f:
            for _ in range(megabytes):
                f.write(block[:1 << 20])
            f.write(OOM if rank == 3 else EI0006)
        total += (folder / f"rank_{rank}.log").stat().st_size
    return total


def timed(action) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    load_s = timed(load)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = write_logs(folder, args.ranks, args.mb)
        whole = [timed(lambda: diagnose_paths([tmp])) for _ in range(args.runs)]
        one = [timed(lambda: diagnose_paths([str(folder / "rank_3.log")])) for _ in range(args.runs)]
        files = collect([tmp], [])
        live = [timed(lambda: diagnose_files(files, blamed=3, deadline=time.monotonic() + BUDGET))
                for _ in range(args.runs)]
        found = diagnose_paths([tmp]).block()[0]
        single = os.path.getsize(folder / "rank_3.log")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"knowledge base: {len(load().faults)} faults, {len(load().keys)} keys, "
          f"loaded in {load_s * 1000:.0f} ms")
    print(f"directory: {args.ranks} logs, {size / 1e6:.0f} MB: {statistics.median(whole):.2f} s, "
          f"{size / 1e6 / statistics.median(whole):.0f} MB/s")
    print(f"one log of {single / 1e6:.0f} MB: {statistics.median(one):.2f} s, "
          f"{single / 1e6 / statistics.median(one):.0f} MB/s")
    print(f"live ({BUDGET} s deadline): {statistics.median(live) * 1000:.0f} ms")
    print(f"peak RSS: this process {own:.0f} MB, largest grep {children:.0f} MB")
    print(found[:160])


if __name__ == "__main__":
    main()
