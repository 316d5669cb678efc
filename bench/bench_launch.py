"""msrun against npu-launch on the same tiny job, alternating, N pairs per rank count.

    python bench/bench_launch.py --pairs 3 --ranks 1 2 4

Prints, per rank count, the median of each phase for both launchers and the ratio
npu-launch / msrun:
  wall          command start to launcher exit (a clean job)
  to-init       command start to the last rank's init() returning
  finish-exit   the last rank's last line to launcher exit
  fail-exit     the failing rank's raise to launcher exit (BENCH_MODE=fail)
and, for npu-launch alone (msrun records no such time), rank-exit: the last rank process's exit
(from metrics.jsonl) to launcher exit, the launcher's own share of finish-exit.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "tiny_job.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(launcher: str, ranks: int, log_dir: Path) -> list[str]:
    if launcher == "msrun":
        return ["msrun", f"--worker_num={ranks}", f"--local_worker_num={ranks}",
                f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True", str(JOB)]
    return [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", str(ranks),
            "--log-dir", str(log_dir), "--console", "none", str(JOB)]


def marks(out: Path) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for path in out.glob("rank_*.txt"):
        for line in path.read_text().splitlines():
            what, when = line.split()
            found.setdefault(what, []).append(float(when))
    return found


def run_once(launcher: str, ranks: int, mode: str) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    out = work / "marks"
    out.mkdir()
    env = {**os.environ, "BENCH_OUT": str(out), "BENCH_MODE": mode}
    start = time.time()
    subprocess.run(command(launcher, ranks, work / "logs"), env=env, cwd=work,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    end = time.time()
    m = marks(out)
    exits = rank_exits(work / "logs" / "metrics.jsonl")
    shutil.rmtree(work, ignore_errors=True)
    if mode == "fail":
        return {"fail-exit": end - m["fail"][0]}
    phases = {"wall": end - start, "to-init": max(m["init"]) - start,
              "finish-exit": end - max(m["done"])}
    return {**phases, "rank-exit": end - max(exits)} if exits else phases


def rank_exits(metrics: Path) -> list[float]:
    if not metrics.exists():
        return []
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r["time"] for r in records if r.get("event") == "exited"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    print(f"{'ranks':>5} {'phase':<12} {'msrun s':>9} {'npu-launch s':>13} {'ratio':>7}")
    for ranks in args.ranks:
        samples: dict[tuple[str, str], list[float]] = {}
        for pair in range(args.pairs):
            order = ("msrun", "npu-launch") if pair % 2 == 0 else ("npu-launch", "msrun")
            for mode in ("ok", "fail"):
                for launcher in order:
                    for phase, value in run_once(launcher, ranks, mode).items():
                        samples.setdefault((launcher, phase), []).append(value)
        for phase in ("wall", "to-init", "finish-exit", "fail-exit"):
            ms_med = statistics.median(samples[("msrun", phase)])
            us_med = statistics.median(samples[("npu-launch", phase)])
            print(f"{ranks:>5} {phase:<12} {ms_med:>9.2f} {us_med:>13.2f} "
                  f"{us_med / ms_med:>7.2f}", flush=True)
        if ("npu-launch", "rank-exit") in samples:
            own = statistics.median(samples[("npu-launch", "rank-exit")])
            print(f"{ranks:>5} {'rank-exit':<12} {'-':>9} {own:>13.3f} {'':>7}", flush=True)


if __name__ == "__main__":
    main()
