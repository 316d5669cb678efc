"""msrun against npu-launch on the same tiny job, alternating, N pairs per rank count.

    python bench/bench_launch.py --pairs 3 --ranks 1 2 4
    python bench/bench_launch.py --pairs 3 --ranks 1 2 --trees before=/work/wt-before after=.

Prints, per rank count, the median of each phase for both launchers and the ratio
npu-launch / msrun (with ``--trees NAME=DIR ...``: the npu-launch of each tree, its packages
first on PYTHONPATH, each against the same msrun runs; msrun and the trees take turns going
first, so a trend in the machine's load spreads over all of them):
  wall          command start to launcher exit (a clean job)
  to-init       command start to the last rank's init() returning
  finish-exit   the last rank's last line to launcher exit
  fail-exit     the failing rank's raise to launcher exit (BENCH_MODE=fail)
  sched-up      command start to MindSpore's scheduler listening (its scheduler.log's "Begin to
                Initialize MetaServerNode"; npu-launch starts it when a rank begins importing
                MindSpore since issue 22, at launch before)
and, for npu-launch alone (msrun records no such time), rank-exit: the last rank process's exit
(from metrics.jsonl) to launcher exit, the launcher's own share of finish-exit.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

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


_META_SERVER = re.compile(r"(\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d)\.(\d{3})\.(\d{3})\b.*"
                          r"Begin to Initialize MetaServerNode")


def scheduler_up(log_dir: Path) -> Optional[float]:
    """When MindSpore's scheduler began listening, from its log's local time, or None."""
    log = log_dir / "scheduler.log"
    found = _META_SERVER.search(log.read_text(errors="replace")) if log.exists() else None
    if found is None:
        return None
    when = datetime.datetime.strptime(found.group(1), "%Y-%m-%d-%H:%M:%S").timestamp()
    return when + int(found.group(2)) / 1e3 + int(found.group(3)) / 1e6


def run_once(launcher: str, ranks: int, mode: str, tree: Optional[Path] = None
             ) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    out = work / "marks"
    out.mkdir()
    env = {**os.environ, "BENCH_OUT": str(out), "BENCH_MODE": mode}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    start = time.time()
    subprocess.run(command(launcher, ranks, work / "logs"), env=env, cwd=work,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    end = time.time()
    m = marks(out)
    exits = rank_exits(work / "logs" / "metrics.jsonl")
    sched = scheduler_up(work / "logs")
    shutil.rmtree(work, ignore_errors=True)
    if mode == "fail":
        return {"fail-exit": end - m["fail"][0]}
    phases = {"wall": end - start, "to-init": max(m["init"]) - start,
              "finish-exit": end - max(m["done"])}
    if sched is not None:
        phases["sched-up"] = sched - start
    return {**phases, "rank-exit": end - max(exits)} if exits else phases


def rank_exits(metrics: Path) -> list[float]:
    if not metrics.exists():
        return []
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r["time"] for r in records if r.get("event") == "exited"]


def parse_trees(specs: list[str]) -> dict[str, Optional[Path]]:
    """``{label: tree}`` of the npu-launch variants to run: ``NAME=DIR`` or ``DIR`` each; none
    given, the one on the current PYTHONPATH, labelled ``npu-launch``."""
    trees: dict[str, Optional[Path]] = {}
    for spec in specs:
        name, _, directory = spec.rpartition("=")
        path = Path(directory).resolve()
        if not any((path / "launcher" / cli).is_file() for cli in ("cli.py", "cli/main.py")):
            raise SystemExit(f"--trees {spec}: no launcher/cli.py or launcher/cli/main.py in {path}")
        trees[name or path.name] = path
    return trees or {"npu-launch": None}


def measure(ranks: int, pairs: int, trees: dict[str, Optional[Path]]
            ) -> dict[tuple[str, str], list[float]]:
    """Every phase's samples per (label, phase); msrun and each tree rotate who goes first."""
    labels = ["msrun", *trees]
    samples: dict[tuple[str, str], list[float]] = {}
    for pair in range(pairs):
        shift = pair % len(labels)
        order = labels[shift:] + labels[:shift]
        for mode in ("ok", "fail"):
            for label in order:
                launcher = "msrun" if label == "msrun" else "npu-launch"
                for phase, value in run_once(launcher, ranks, mode, trees.get(label)).items():
                    samples.setdefault((label, phase), []).append(value)
    return samples


def print_table(ranks: int, samples: dict[tuple[str, str], list[float]], labels: list[str]
                ) -> None:
    for phase in ("wall", "to-init", "finish-exit", "fail-exit", "sched-up"):
        if any((label, phase) not in samples for label in ["msrun", *labels]):
            continue
        ms_med = statistics.median(samples[("msrun", phase)])
        cells = "".join(f" {statistics.median(samples[(label, phase)]):>13.2f} "
                        f"{statistics.median(samples[(label, phase)]) / ms_med:>7.2f}"
                        for label in labels)
        print(f"{ranks:>5} {phase:<12} {ms_med:>9.2f}{cells}", flush=True)
    own = "".join(f" {statistics.median(samples[(label, 'rank-exit')]):>13.3f} {'':>7}"
                  if (label, "rank-exit") in samples else f" {'-':>13} {'':>7}"
                  for label in labels)
    print(f"{ranks:>5} {'rank-exit':<12} {'-':>9}{own}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--trees", nargs="+", default=[], metavar="NAME=DIR",
                        help="npu-launch of each of these source trees (default: the current one)")
    parser.add_argument("--out", type=Path, help="also write every sample here (JSON)")
    args = parser.parse_args()
    trees = parse_trees(args.trees)
    labels = list(trees)
    heads = "".join(f" {label[:11] + ' s':>13} {'ratio':>7}" for label in labels)
    print(f"{'ranks':>5} {'phase':<12} {'msrun s':>9}{heads}")
    raw: dict[str, dict[str, dict[str, list[float]]]] = {}
    for ranks in args.ranks:
        samples = measure(ranks, args.pairs, trees)
        print_table(ranks, samples, labels)
        raw[str(ranks)] = {}
        for (label, phase), values in samples.items():
            raw[str(ranks)].setdefault(label, {})[phase] = values
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": " ".join(["python", "bench/bench_launch.py", *sys.argv[1:]]),
            "trees": {label: str(tree) if tree else None for label, tree in trees.items()},
            "samples": raw}, indent=1) + "\n")


if __name__ == "__main__":
    main()
