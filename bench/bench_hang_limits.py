"""The hang watch against issue 38's battery, with the default options, side by side for trees.

    python bench/bench_hang_limits.py --trees before=/work/wt-before after=/work/main --runs 1
    python bench/bench_hang_limits.py --cases write freeze-sleep@3 --seconds 30 --json

Every case is a 2-rank CPU job of ``tests/plain_scripts/busy_alone.py`` (a plain MindSpore
data-parallel loop in GRAPH mode, steps of about 20 ms) under each tree's npu-launch, the tree
first on PYTHONPATH (for the launcher and, through its rank hook, for the ranks), with no
``--hang-timeout`` and no ``--hang-floor``: the limit the job learns, at least 10 s.

False alarms (goal: none stopped): after step 150 of 200 (3 s of steps: the limit is learnt by
then), rank 0 alone does one thing for ``--seconds`` (default 60) while rank 1 waits in the next
all-reduce: ``write``, ``npsave``, ``pickle``, ``tar``, ``cp``, ``eval``, ``upload``,
``slowdata`` (its data source reads slowly);
``shape`` (every rank recompiles for a new batch size), ``warmup`` (2 all-reduces after init()
before training, as mindcv starts), ``eval-network`` (an evaluation network first compiled
mid-run). Their jobs get ``MS_CPU_COMM_OP_TIMEOUT`` raised to ``--seconds`` + 60, or MindSpore's
CPU collective would give up after 30 s of waiting.

Freezes (goal: named soon): rank 1 freezes for good before step 3 or step 300 of 400 (``sleep``
an hour, ``pipe``: read a pipe nobody writes) or inside that step's forward pass (``lock``
acquired twice, through a ``pyfunc`` op); MindSpore's own timeout left at 30 s.

The table, per case and tree: the outcome and exit code; for a false alarm the seconds into the
episode when npu-launch stopped the job (a job that succeeded: how long the episode lasted);
for a freeze the seconds from the freeze (the script's own timestamp) to npu-launch's exit,
median and max over the runs, and what ended the job: npu-launch's hang check, or MindSpore's
collective timeout on rank 0 (then blamed on rank 1, or not). Trees take turns going first.

Do not run other work meanwhile: 2 cores, every figure is a wall time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench_launch import parse_trees

REPO = Path(__file__).resolve().parent.parent
BUSY = REPO / "tests" / "plain_scripts" / "busy_alone.py"
ALONE_AT, STEPS = 150, 200
FREEZE_STEPS = 400
ALONE_KINDS = ("write", "npsave", "pickle", "tar", "cp", "eval", "upload", "slowdata")


@dataclasses.dataclass(frozen=True)
class Case:
    """One job of the battery: ``busy_alone.py`` with ``args`` (``{s}``: the episode's
    seconds); ``marker``: the script's line whose timestamp starts the clock."""

    name: str
    freeze: bool
    args: tuple[str, ...]
    marker: str

    def script_args(self, seconds: float) -> list[str]:
        return ["--graph", *(a.format(s=seconds) for a in self.args)]


def _cases() -> dict[str, Case]:
    cases = [Case(kind, False, ("--steps", str(STEPS), "--alone", f"{kind}:0:{ALONE_AT}:{{s}}"),
                  f"rank 0 alone {kind}") for kind in ALONE_KINDS]
    cases += [Case("shape", False, ("--steps", str(STEPS), "--alone", f"shape:0:{ALONE_AT}:0"),
                   "rank 0 shape"),
              Case("warmup", False, ("--steps", str(STEPS), "--warmup-allreduce", "2"),
                   "rank 0 warmup-allreduce"),
              Case("eval-network", False, ("--steps", str(STEPS), "--eval-network-at",
                                           str(ALONE_AT)), "rank 0 eval-network")]
    for step in (3, 300):
        cases += [Case(f"freeze-{kind}@{step}", True, ("--steps", str(FREEZE_STEPS), "--freeze",
                                                        f"{kind}:1:{step}{where}"),
                       "rank 1 freezes")
                  for kind, where in (("sleep", ""), ("lock", ":inside"), ("pipe", ""))]
    return {case.name: case for case in cases}


CASES = _cases()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One job's end: its exit code, the seconds the table shows (``None``: the marker never
    printed), and what ended it."""

    code: int
    seconds: Optional[float]
    ended: str

    @property
    def stopped(self) -> bool:
        return self.code != 0


def job_env(tree: Optional[Path], case: Case, seconds: float) -> dict[str, str]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    if not case.freeze:
        env["MS_CPU_COMM_OP_TIMEOUT"] = str(int(seconds + 60))
    return env


def run_once(tree: Optional[Path], case: Case, seconds: float) -> Outcome:
    """Run ``case`` under ``tree``'s npu-launch (from a scratch folder, so that no ``launcher``
    package in the current folder shadows the tree's) and read how it ended."""
    work = Path(tempfile.mkdtemp(prefix="bench-hang-limits-"))
    argv = [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--cards", "2",
            "--log-dir", str(work / "logs"), str(BUSY), *case.script_args(seconds)]
    proc = subprocess.Popen(argv, cwd=work, env=job_env(tree, case, seconds), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=seconds + 900)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # npu-launch stops its ranks on SIGTERM
        out, err = proc.communicate()
    end = time.time()
    summary = read_summary(work / "logs" / "summary.json")
    shutil.rmtree(work, ignore_errors=True)
    return Outcome(proc.returncode, measured(case, out, end, proc.returncode), ended_by(summary))


def measured(case: Case, out: str, end: float, code: int) -> Optional[float]:
    """Freeze: its timestamp to the exit. False alarm: the episode's start to the exit when
    stopped, its length when it ran to the end."""
    began = re.search(re.escape(case.marker) + r" (?:begins at|at) (\d+\.\d+)", out)
    if began is None:
        return None
    if case.freeze or code != 0:
        return end - float(began.group(1))
    lasted = re.search(re.escape(case.marker) + r" from (\d+\.\d+) to (\d+\.\d+)", out)
    return float(lasted.group(2)) - float(lasted.group(1)) if lasted else None


def read_summary(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def ended_by(summary: dict) -> str:
    """What ended the job, from its ``summary.json``."""
    cause = summary.get("root_cause") or {}
    if summary.get("outcome") == "succeeded":
        return "-"
    if summary.get("stall"):
        return f"hang check, rank {cause.get('rank')}"
    if cause.get("consequence"):
        return f"MindSpore's timeout, blamed on rank {cause.get('rank')}"
    if cause.get("outcome") == "failed":
        return f"rank {cause.get('rank')} failed ({cause.get('exception') or 'exit'})"
    return summary.get("outcome", "no summary")


def cell(outcomes: list[Outcome], freeze: bool) -> str:
    """A table cell: ``ok 0 61.2`` / ``STOP 124 11.3``, median and max over the runs for a
    freeze, and what ended it."""
    codes = ",".join(sorted({str(o.code) for o in outcomes}))
    word = ("named" if all(o.code == 124 for o in outcomes) else "OTHER") if freeze else (
        "STOP" if any(o.stopped for o in outcomes) else "ok")
    times = [o.seconds for o in outcomes if o.seconds is not None]
    shown = f"{statistics.median(times):.1f}" if times else "?"
    if freeze and len(times) > 1:
        shown += f" (max {max(times):.1f})"
    ended = "; ".join(sorted({o.ended for o in outcomes if o.ended != "-"}))
    return f"{word} {codes} {shown}" + (f" [{ended}]" if ended else "")


def measure(cases: list[Case], trees: dict[str, Optional[Path]], runs: int, seconds: float
            ) -> dict[tuple[str, str], list[Outcome]]:
    """Every case ``runs`` times per tree; the trees rotate who goes first."""
    labels = list(trees)
    results: dict[tuple[str, str], list[Outcome]] = {}
    for run in range(runs):
        for n, case in enumerate(cases):
            shift = (run + n) % len(labels)
            for label in labels[shift:] + labels[:shift]:
                outcome = run_once(trees[label], case, seconds)
                results.setdefault((case.name, label), []).append(outcome)
                print(f"  {case.name} {label}: {outcome}", file=sys.stderr, flush=True)
    return results


def print_table(cases: list[Case], labels: list[str],
                results: dict[tuple[str, str], list[Outcome]], seconds: float) -> None:
    width = 46
    print(f"{'case':<20}" + "".join(f" {label:<{width}}" for label in labels))
    for case in cases:
        print(f"{case.name:<20}" + "".join(
            f" {cell(results[(case.name, label)], case.freeze):<{width}}" for label in labels))
    alarms = [c for c in cases if not c.freeze]
    if alarms:
        stopped = {label: sum(any(o.stopped for o in results[(c.name, label)]) for c in alarms)
                   for label in labels}
        print(f"false alarms ({seconds:.0f} s episodes, goal 0): " + ", ".join(
            f"{label} {stopped[label]} of {len(alarms)} stopped" for label in labels))


def as_json(cases: list[Case], trees: dict[str, Optional[Path]], seconds: float,
            results: dict[tuple[str, str], list[Outcome]]) -> str:
    return json.dumps({
        "command": " ".join(["python", "bench/bench_hang_limits.py", *sys.argv[1:]]),
        "seconds": seconds, "trees": {k: str(v) if v else None for k, v in trees.items()},
        "cases": {c.name: {"freeze": c.freeze, "args": c.script_args(seconds), "trees": {
            label: [dataclasses.asdict(o) for o in results[(c.name, label)]]
            for label in trees}} for c in cases}}, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=[], metavar="NAME=DIR",
                        help="npu-launch of each of these source trees (default: the current one)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES),
                        metavar="CASE", help=f"a subset of: {' '.join(CASES)}")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="how long each busy episode lasts (default 60)")
    parser.add_argument("--json", action="store_true",
                        help="print every outcome as JSON instead of the table")
    args = parser.parse_args()
    trees = parse_trees(args.trees)
    cases = [CASES[name] for name in args.cases]
    results = measure(cases, trees, args.runs, args.seconds)
    if args.json:
        print(as_json(cases, trees, args.seconds, results))
    else:
        print_table(cases, list(trees), results, args.seconds)


if __name__ == "__main__":
    main()
