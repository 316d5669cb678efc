"""A real toolkit's job under npu-launch and under msrun: mindcv (``tests/rank_scripts/
mindcv_train.py``, its ``train.py`` cut down: 2 CPU ranks, a tiny model on generated images,
rank 0 saving at each epoch's end).

    python bench/bench_toolkits.py --runs 2 [--model mobilenet_v1_025] [--out results.json] [--walls-only]

1. Wall time of the whole job, npu-launch and msrun taking turns (who goes first alternates),
   ``--runs`` each: medians and the ratio npu-launch / msrun.
2. Steps redone or skipped after a fault, read from the rank logs (rank 0's step lines, over
   every attempt and launch), each way once:
   - crash: rank 1 raises as step --fail-at begins, ``--max-restarts 1``;
   - SIGTERM: to npu-launch once rank 0 printed step --fail-at, then the same command again
     into the same ``--log-dir``;
   "before": the command without ``--ckpt_path '{checkpoint:-}'`` (a restart starts mindcv from
   step 1); "after": with it (mindcv resumes from rank 0's newest epoch checkpoint).
   redone: planned steps trained more than once; skipped: planned steps never trained; extra:
   steps past the planned ones (mindcv's train.py trains --epoch_size epochs more after a resume).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "rank_scripts" / "mindcv_train.py"
_STEP = re.compile(r"^mindcv_train: rank 0 step (\d+) loss", re.M)
EPOCHS, STEPS_PER_EPOCH = 2, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script(data: Path, model: str, *more: str) -> list[str]:
    return [str(SCRIPT), "--distribute", "True", "--data_dir", str(data), "--model", model,
            "--epoch_size", str(EPOCHS), "--ckpt_save_dir", "ckpt", *more]


def npu_launch(log_dir: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2", "--console", "none",
            "--log-dir", str(log_dir), *options]


def msrun(log_dir: Path) -> list[str]:
    return ["msrun", "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}", "--join=True",
            f"--log_dir={log_dir}"]


def timed(argv: list[str], cwd: Path) -> float:
    start = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return time.monotonic() - start


def walls(data: Path, model: str, runs: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"npu-launch": [], "msrun": []}
    for run in range(runs):
        order = ["npu-launch", "msrun"] if run % 2 == 0 else ["msrun", "npu-launch"]
        for who in order:
            work = Path(tempfile.mkdtemp(prefix="bench-toolkits-"))
            head = npu_launch(work / "logs") if who == "npu-launch" else msrun(work / "logs")
            found[who].append(timed([*head, *script(data, model)], work))
            shutil.rmtree(work, ignore_errors=True)
            print(f"  {who:<10} run {run + 1}: {found[who][-1]:.1f} s", flush=True)
    return found


def rank0_steps(log_dir: Path) -> list[int]:
    return [int(m.group(1)) for m in _STEP.finditer((log_dir / "rank_0.log").read_text(errors="replace"))]


def counted(trained: list[int]) -> dict[str, int]:
    planned = EPOCHS * STEPS_PER_EPOCH
    times = collections.Counter(trained)
    return {"trained": len(trained), "redone": sum(n - 1 for s, n in times.items() if s <= planned),
            "skipped": sum(1 for s in range(1, planned + 1) if s not in times),
            "extra": sum(n for s, n in times.items() if s > planned)}


def crash(data: Path, model: str, fail_at: int, resume: bool) -> dict[str, int]:
    work = Path(tempfile.mkdtemp(prefix="bench-toolkits-"))
    more = ["--ckpt_path", "{checkpoint:-}", "--resume_opt", "True"] if resume else []
    timed([*npu_launch(work / "logs", "--max-restarts", "1"),
           *script(data, model, *more, "--fail_at_step", str(fail_at))], work)
    trained = rank0_steps(work / "logs")
    shutil.rmtree(work, ignore_errors=True)
    return counted(trained)


def sigterm(data: Path, model: str, at: int, resume: bool) -> dict[str, int]:
    work = Path(tempfile.mkdtemp(prefix="bench-toolkits-"))
    more = ["--ckpt_path", "{checkpoint:-}", "--resume_opt", "True"] if resume else []
    argv = [*npu_launch(work / "logs"), *script(data, model, *more)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and first.poll() is None:
        if (work / "logs" / "rank_0.log").exists() and max(rank0_steps(work / "logs"), default=0) >= at:
            break
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=120)
    timed(argv, work)
    trained = rank0_steps(work / "logs")
    shutil.rmtree(work, ignore_errors=True)
    return {**counted(trained), "stopped_after": at}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--model", default="mobilenet_v1_025")
    parser.add_argument("--fail-at", type=int, default=7, help="the step the faults come at")
    parser.add_argument("--out", type=Path, help="also write every figure here (JSON)")
    parser.add_argument("--walls-only", action="store_true", help="part 1 alone")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="bench-toolkits-data-"))
    subprocess.run([sys.executable, str(SCRIPT), "--make_data", str(data)], check=True)
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {args.model}, 2 CPU ranks, "
          f"{EPOCHS} epochs of {STEPS_PER_EPOCH} steps", flush=True)
    wall = walls(data, args.model, args.runs)
    medians = {who: statistics.median(values) for who, values in wall.items()}
    print(f"wall: npu-launch {medians['npu-launch']:.1f} s, msrun {medians['msrun']:.1f} s (medians of "
          f"{args.runs}), ratio {medians['npu-launch'] / medians['msrun']:.2f}", flush=True)
    faults: dict[str, dict[str, int]] = {}
    for resume in () if args.walls_only else (False, True):
        label = "after" if resume else "before"
        faults[f"crash, {label}"] = crash(data, args.model, args.fail_at, resume)
        faults[f"SIGTERM, {label}"] = sigterm(data, args.model, args.fail_at, resume)
    if faults:
        print(f"{'fault at step ' + str(args.fail_at):<22} {'trained':>8} {'redone':>7} {'skipped':>8} {'extra':>6}")
    for label, c in faults.items():
        print(f"{label:<22} {c['trained']:>8} {c['redone']:>7} {c['skipped']:>8} {c['extra']:>6}", flush=True)
    shutil.rmtree(data, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python", "bench/bench_toolkits.py", *sys.argv[1:]]),
                                        "model": args.model, "wall": wall, "faults": faults}, indent=1) + "\n")


if __name__ == "__main__":
    main()
