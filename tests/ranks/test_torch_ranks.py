"""torch ranks (``tests/rank_scripts/torch_ddp.py``, a torchrun-style DDP script) under
npu-launch, against the same script under torchrun.

They prove what only real torch ranks can: that torch's env:// rendezvous finds MASTER_PORT free
(no MindSpore scheduler is started for ranks that never import MindSpore), that the variables
torchrun sets are there with torchrun's values, that the parameters end as under torchrun, and
that the rank hook sees torch's ``init_process_group``, its steps and its collectives: a rank
that raises is named with its exception, and one that hangs before a collective is named as the
straggler, with its stack, while the other waits inside torch. Wall-clock bounds are measured in
``bench/bench_torch.py``, not asserted here.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, job_pids, start_job, wait_for

from launcher.hangs.stalls import HANG_EXIT_CODE

pytestmark = pytest.mark.torch
DDP = str(RANK_SCRIPTS / "torch_ddp.py")
HANG_LINE = next(n for n, line in enumerate(Path(DDP).read_text().splitlines(), 1)
                 if "time.sleep(3600)" in line)
_CHECKSUM = re.compile(r"rank (\d+)/(\d+) checksum (\S+)")
_ENV = re.compile(r"rank (\d+) env (\{[^{}]*\})")


def rank_values(output: str, pattern: re.Pattern) -> dict[int, str]:
    """``{rank: value}`` from the lines the DDP script prints (console prefixes ignored)."""
    return {int(m.group(1)): m.group(m.re.groups) for m in pattern.finditer(output)}


def launch(tmp: Path, job: str, *script_args: str, options: tuple[str, ...] = ()
           ) -> tuple[subprocess.CompletedProcess, tuple[int, ...]]:
    """npu-launch --cards 2 on this host, the pids it ran, and nothing of the job left after."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = start_job(tmp / "logs", job, DDP, *script_args, options=options, env=env)
    wait_for(lambda: job_pids(job) or proc.poll() is not None, "the job's processes")
    seen = tuple(job_pids(job))
    out, err = proc.communicate(timeout=300)
    assert_no_job_processes(job, seen)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def no_mindspore_ran(log_dir: Path, output: str) -> None:
    """No scheduler was started, no rank loaded MindSpore, and each told it uses torch."""
    assert not list(log_dir.rglob("scheduler.log")), "MindSpore's scheduler was started"
    assert "mindspore loaded: True" not in output
    for events in log_dir.rglob("events/rank_*.jsonl"):
        told = [json.loads(line) for line in events.read_text().splitlines()]
        names = {e.get("name") for e in told if e["event"] == "framework"}
        assert names == {"torch"}, (events, names)


def test_ddp_ends_as_under_torchrun_and_runs_no_mindspore(
        weird_tmp: Path, torchrun_result: subprocess.CompletedProcess) -> None:
    result, _ = launch(weird_tmp, "torch-ddp")
    assert result.returncode == 0, result.stderr[-3000:]
    ours, theirs = rank_values(result.stdout, _CHECKSUM), rank_values(torchrun_result.stdout, _CHECKSUM)
    assert ours == theirs and len(ours) == 2 and len(set(ours.values())) == 1, (ours, theirs)
    env_ours, env_theirs = (
        {r: json.loads(v) for r, v in rank_values(out, _ENV).items()}
        for out in (result.stdout, torchrun_result.stdout))
    # torchrun's own agent serves the store rank 0 would listen on; npu-launch serves none.
    store = "TORCHELASTIC_USE_AGENT_STORE"
    assert {r: e.pop(store) for r, e in env_ours.items()} == {0: "False", 1: "False"}
    assert {r: e.pop(store) for r, e in env_theirs.items()} == {0: "True", 1: "True"}
    assert env_ours == env_theirs, "the variables torchrun sets, with its values"
    no_mindspore_ran(weird_tmp / "logs", result.stdout)


def test_a_torch_rank_that_raises_is_named_with_its_exception(weird_tmp: Path) -> None:
    result, seen = launch(weird_tmp, "torch-raise", "--fail-rank", "1", "--fail-at", "5")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "rank 1 on" in result.stderr and "RuntimeError: torch boom on rank 1 at step 5" \
        in result.stderr, result.stderr[-3000:]
    cause = json.loads((weird_tmp / "logs" / "summary.json").read_text())["root_cause"]
    assert (cause["rank"], cause["exception"], cause["error"]) == (
        1, "RuntimeError", "torch boom on rank 1 at step 5")
    no_mindspore_ran(weird_tmp / "logs", result.stdout)


def test_a_torch_rank_hung_before_a_collective_is_the_straggler(weird_tmp: Path) -> None:
    """With the limit learnt (its floor lowered to 1 s, so the steps' pace decides: 2-3 s), rank
    0 first writes alone for 5 s (a few seconds into training: 1000 steps of a few ms, 2 s here,
    so that intervals were seen; one is enough to learn from) while rank 1 waits in DDP's
    all-reduce: no hang, a spell busy alone; then, 1000 steps on, rank 1 freezes and is named."""
    result, _ = launch(weird_tmp, "torch-hang", "--steps", "100000", "--write-rank", "0",
                       "--write-at", "1000", "--write-s", "5", "--hang-rank", "1",
                       "--hang-at", "2000", options=("--hang-floor", "1"))
    err = result.stderr
    assert result.returncode == HANG_EXIT_CODE, err[-3000:]
    assert "rank 0 writes alone for 5 s" in result.stdout, result.stdout[-2000:]
    assert "rank 1 on" in err and "hangs: no progress for" in err, err[-3000:]
    assert "no CPU, no I/O, no child process for" in err, err[-3000:]
    busy = json.loads((weird_tmp / "logs" / "summary.json").read_text())["busy_alone"]
    assert list(busy) == ["0"] and busy["0"]["doing"] == "writing", busy
    assert "while rank(s) 0 wait in torch" in err, err[-3000:]
    summary = json.loads((weird_tmp / "logs" / "summary.json").read_text())
    assert (summary["root_cause"]["outcome"], summary["root_cause"]["rank"]) == ("stalled", 1)
    assert summary["stall"]["rank"] == 1, "the hang check ended the job, not a torch timeout"
    stacks = weird_tmp / "logs" / "stacks"
    assert f'torch_ddp.py", line {HANG_LINE} in hang_here' in (stacks / "rank_1.txt").read_text()
    assert f"{os.sep}torch{os.sep}" in (stacks / "rank_0.txt").read_text()
    no_mindspore_ran(weird_tmp / "logs", result.stdout)
