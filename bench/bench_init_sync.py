"""Whether MindSpore's 3-second step in a CPU ``init()`` can be avoided by calling ``init()``
on every rank at once.

    python bench/bench_init_sync.py --runs 5

Launches a 2-rank job (``init_sync_rank.py``) ``--runs`` times each way, alternating: ``free``
(each rank calls ``init()`` when its imports are done) and ``aligned`` (every rank waits for the
same wall-clock moment, 4.5 s after the launch, then calls ``init()``). For each launch it
prints both ranks' ``init()`` seconds and how far apart the ranks finished it. In MindSpore
2.10's CPU collective a rank that asks for a peer's address before the peer registered it
sleeps a fixed 3 s (``CollectiveNode::SynchronizeAddresses``), so a launch whose ranks finish
``init()`` about 3 s apart paid it.

Do not run other work meanwhile: 2 cores, every figure is a wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
RANK = REPO / "bench" / "init_sync_rank.py"
ALIGN_AFTER = 4.5
"""Seconds from the launch to the aligned ``init()``: past every rank's imports here."""
PAID = 2.0
"""Ranks that finish ``init()`` this many seconds apart or more paid the 3-second sleep."""


def launch(aligned: bool) -> Optional[dict[str, float]]:
    """One 2-rank launch; its ranks' ``init()`` seconds and the gap between their ends."""
    with tempfile.TemporaryDirectory(prefix="init-sync-") as logs:
        command = [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2",
                   "--console", "none", "--log-dir", logs]
        if aligned:
            command += ["--env", f"SYNC_AT={time.time() + ALIGN_AFTER}"]
        subprocess.run([*command, str(RANK)], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        marks = [_mark(Path(logs) / f"rank_{rank}.log") for rank in (0, 1)]
    if None in marks:
        return None
    (c0, d0), (c1, d1) = marks  # type: ignore[misc]
    return {"init_0": d0 - c0, "init_1": d1 - c1, "gap": abs(d1 - d0)}


def _mark(log: Path) -> Optional[tuple[float, float]]:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"called"' in line:
            record = json.loads(line)
            return record["called"], record["done"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    seen: dict[str, list[dict[str, float]]] = {"free": [], "aligned": []}
    for _ in range(args.runs):
        for way in seen:
            result = launch(way == "aligned")
            if result is None:
                print(f"{way}: a rank printed no mark (see its log)")
                continue
            seen[way].append(result)
            print(f"{way}: init() {result['init_0']:.2f} s and {result['init_1']:.2f} s, "
                  f"ends {result['gap']:.2f} s apart", flush=True)
    for way, results in seen.items():
        if results:
            paid = sum(r["gap"] >= PAID for r in results)
            slowest = statistics.median(max(r["init_0"], r["init_1"]) for r in results)
            print(f"{way}: {paid} of {len(results)} launches paid the 3-second step; "
                  f"median slower init() {slowest:.2f} s")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
