"""Real ranks bound to real cores (``--bind-cores``): each rank's affinity is read back from the
kernel (``/proc/<pid>/status``) while it runs and compared with ``plan.json``; a cpuset made
for real by starting npu-launch under ``taskset -c 0`` is respected; a MindSpore data-parallel
job still trains when bound (and shows that MindSpore's own log lines stay off the console).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Optional

import psutil
import pytest
from helpers import (
    RANK_SCRIPTS,
    assert_no_job_processes,
    assert_one_line_error,
    checksums,
    job_pids,
    npu_launch_argv,
    run_launcher,
    wait_for,
    worker_pid,
)

from launcher.config.cpu_list import format_cpu_list
from launcher.plan.binding import split

# The affinity ranks are plain Python: no MindSpore scheduler runs for them; the one MindSpore
# job below shows that the scheduler it needs is left unbound.
SCRIPT = str(RANK_SCRIPTS / "affinity.py")
JOB = str(RANK_SCRIPTS / "ms_job.py")
ALLOWED = tuple(sorted(os.sched_getaffinity(0)))


def kernel_cores(pid: int) -> str:
    """What the kernel lets ``pid`` run on: ``Cpus_allowed_list`` of ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def planned_cores(log_dir: Path) -> dict[int, str]:
    plan = json.loads((log_dir / "plan.json").read_text())
    return {r["rank"]: format_cpu_list(r["binding"]["cpus"]) for r in plan["ranks"]}


def _said(log_dir: Path, rank: int) -> Optional[list[str]]:
    """The ``affinity`` line of rank ``rank``'s log, split, once it is there."""
    path = log_dir / f"rank_{rank}.log"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith(f"affinity {rank} "):
            return line.split()
    return None


def _scheduler_pid(job: str) -> int:
    for pid in job_pids(job):
        try:
            if psutil.Process(pid).environ().get("MS_ROLE") == "MS_SCHED":
                return pid
        except psutil.Error:
            continue
    raise AssertionError(f"job {job} runs no scheduler")


def kernel_mems(pid: int) -> str:
    """The memory policy of ``pid``'s mappings as the kernel keeps it (``/proc/<pid>/numa_maps``:
    ``bind:0`` under ``numactl --membind=0``, ``default`` without): the distinct policies."""
    policies = {line.split()[1] for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines()
                if len(line.split()) > 1}
    return ",".join(sorted(policies))


def _run_bound(tmp: Path, job: str, cards: int, *options: str,
               under: tuple[str, ...] = (),
               mems: Optional[dict[int, str]] = None) -> tuple[dict[int, str], str, str]:
    """Start the affinity script on ``cards`` ranks (under ``under``, e.g. taskset); while they
    run, check what the kernel says of each against plan.json and against what the rank saw.
    Returns each rank's cores, the job's processes other than its ranks (none: no rank imports
    MindSpore, so no scheduler), and the launcher's stderr."""
    logs, go = tmp / "logs", tmp / "go"
    argv = [*under, *npu_launch_argv("--device", "cpu", "--cards", str(cards), "--job-id", job,
                                     "--log-dir", str(logs), *options, SCRIPT, str(go))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = {r: wait_for(lambda r=r: _said(logs, r), f"rank {r}'s affinity line")
                for r in range(cards)}
        seen = tuple(job_pids(job))
        planned = planned_cores(logs)
        for rank, (_, _, pid, cores, cpus, msrun) in said.items():
            assert int(pid) == worker_pid(job, rank), "taskset exec'd the rank: one pid"
            assert kernel_cores(int(pid)) == planned[rank] == cores, (rank, said[rank])
            assert cpus == f"cpus={planned[rank]}"
            assert msrun == "msrun=" + str(sorted(os.sched_getaffinity(int(pid)))).replace(" ", "")
            if mems is not None:
                mems[rank] = kernel_mems(int(pid))
        others = [p for p in seen if p not in {int(said[r][2]) for r in said}]
    finally:
        go.touch()
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert_no_job_processes(job, seen)
    return planned, others, err


def test_each_rank_runs_on_its_block_of_the_allowed_cores(weird_tmp: Path) -> None:
    cores, others, err = _run_bound(weird_tmp, "bind-auto", 2, "--bind-cores", "auto")
    expected = [format_cpu_list(block) for block in split(ALLOWED, 2)]
    assert list(cores.values()) == expected
    assert others == [], "plain-Python ranks: no MindSpore scheduler"
    assert f"npu-launch: cores: rank 0 -> {expected[0]}, rank 1 -> {expected[1]}" in err


def test_bind_numa_runs_each_rank_under_numactl(weird_tmp: Path) -> None:
    """numactl binds both the cores and the memory: the kernel's memory policy of every mapping
    of each rank is ``bind`` to the NUMA nodes plan.json names (this machine has one, node 0;
    an unbound process's policy is ``default``)."""
    mems: dict[int, str] = {}
    cores, _, _ = _run_bound(weird_tmp, "bind-numa", 2, "--bind-cores", "auto", "--bind-numa",
                             mems=mems)
    plan = json.loads((weird_tmp / "logs" / "plan.json").read_text())
    planned = {r["rank"]: "bind:" + format_cpu_list(r["binding"]["mems"]) for r in plan["ranks"]}
    assert mems == planned and set(mems) == {0, 1}, (mems, planned)
    assert list(cores.values()) == [format_cpu_list(b) for b in split(ALLOWED, 2)]


def test_a_list_is_split_and_ranks_share_a_core_when_short(weird_tmp: Path) -> None:
    last = str(ALLOWED[-1])
    cores, _, err = _run_bound(weird_tmp, "bind-list", 2, "--bind-cores", last)
    assert cores == {0: last, 1: last}
    assert "2 ranks on 1 core(s): up to 2 ranks share each core" in err


def test_a_cpuset_around_the_launcher_is_respected(weird_tmp: Path) -> None:
    """``taskset -c 0 npu-launch ...``: the launcher may use core 0 only (a real restriction,
    as a container's cpuset is), so both ranks get it, and the launcher says they share it."""
    cores, _, err = _run_bound(weird_tmp, "bind-cpuset", 2, "--bind-cores", "auto",
                               under=("taskset", "-c", str(ALLOWED[0])))
    assert cores == {0: str(ALLOWED[0]), 1: str(ALLOWED[0])}
    assert (f"this host's allowed cores {ALLOWED[0]} split by local rank; 2 ranks on 1 core(s): "
            "up to 2 ranks share each core") in err


def test_a_core_outside_the_cpuset_is_refused_before_anything_starts(weird_tmp: Path) -> None:
    other = str(ALLOWED[-1] + 1 if len(ALLOWED) == 1 else ALLOWED[-1])
    argv = ["taskset", "-c", str(ALLOWED[0]), *npu_launch_argv(
        "--device", "cpu", "--job-id", "bind-refused", "--log-dir", str(weird_tmp / "logs"),
        "--bind-cores", other, SCRIPT, "go")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, f"--bind-cores {other}: core(s) {other} are not among the "
                          f"cores this host allows ({ALLOWED[0]})")
    assert not (weird_tmp / "logs").exists() and not job_pids("bind-refused")


REPLAY = ("import os, sys\n"
          "path = sys.argv[1].replace('RANK', os.environ['RANK_ID'])\n"
          "sys.stdout.write(open(path, encoding='utf-8', errors='replace').read())\n")
"""A rank that prints again, line for line, what a rank of an earlier job wrote to its log."""


@pytest.mark.mindspore
def test_a_bound_mindspore_job_trains_and_its_runtime_chatter_stays_in_the_logs(
        weird_tmp: Path) -> None:
    """Two data-parallel MindSpore ranks, each on its own block of cores: the kernel says so
    while they run, MindSpore's scheduler is left unbound, and they train to the same weights.

    The same job shows the console against MindSpore's own lines (one job for both: each is a
    MindSpore start-up): its INFO/WARNING lines (``[WARNING] DISTRIBUTED(pid,...``, at INFO with
    ``GLOG_v=1``) reach the rank logs only, and the checksum line both ranks print alike is shown
    once as [host:0-1]. With ``--runtime-logs --no-merge-lines`` the same real lines, printed
    again by plain ranks from this job's logs (``REPLAY``: no second MindSpore job), are all
    shown."""
    logs, job, host = weird_tmp / "logs", "bind-ms", socket.gethostname()
    argv = npu_launch_argv("--device", "cpu", "--cards", "2", "--job-id", job, "--log-dir",
                           str(logs), "--bind-cores", "auto", JOB, "--steps", "3",
                           "--sleep-after-init", "2")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "GLOG_v": "1"})
    try:
        wait_for(lambda: all("of 2 up" in _text(logs / f"rank_{r}.log") for r in (0, 1)),
                 "both ranks initialised", timeout=240)
        seen = tuple(job_pids(job))
        planned = planned_cores(logs)
        assert {r: kernel_cores(worker_pid(job, r)) for r in (0, 1)} == planned
        assert kernel_cores(_scheduler_pid(job)) == format_cpu_list(ALLOWED), "scheduler unbound"
    finally:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert list(planned.values()) == [format_cpu_list(b) for b in split(ALLOWED, 2)]
    sums = checksums(out)
    assert len(sums) == 2 and len(set(sums.values())) == 1, out[-2000:]
    assert_no_job_processes(job, seen)

    log = (logs / "rank_0.log").read_text()
    chatter = [line for line in log.splitlines() if line.startswith(("[INFO] ", "[WARNING] "))]
    assert chatter, "MindSpore said something at INFO (GLOG_v=1) in the rank's log"
    assert not any(c in out for c in chatter[:50]), "...and none of it on the console"
    assert out.count(" checksum ") == 1 and f"[{host}:0-1] checksum " in out, out[-2000:]
    (weird_tmp / "replay.py").write_text(REPLAY)
    again = run_launcher("--device", "cpu", "--cards", "2", "--log-dir", str(weird_tmp / "all"),
                         "--runtime-logs", "--no-merge-lines", str(weird_tmp / "replay.py"),
                         str(logs / "rank_RANK.log"))
    assert again.returncode == 0, again.stderr[-3000:]
    everything = again.stdout
    assert any(line.startswith((f"[{host}:0] [INFO] ", f"[{host}:1] [WARNING] ",
                                f"[{host}:0] [WARNING] ", f"[{host}:1] [INFO] "))
               for line in everything.splitlines()), "--runtime-logs shows them"
    assert f"[{host}:0] checksum" in everything and f"[{host}:1] checksum" in everything
    assert f"[{host}:0] {chatter[0]}" in everything, "line for line"


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
