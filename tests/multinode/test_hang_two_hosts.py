"""A hang over 2 private hosts x 1 rank: rank 1, on the second host, sleeps before its 4th step. Neither host alone can tell who hangs
(each sees one silent rank); node 0 judges from both hosts' progress and stacks, names rank 1
and its host, and keeps both ranks' stacks in its own log directory although rank 1's were read
on a disk node 0 does not share.

The ranks are plain Python (``rank_scripts/plain_job.py``: the contract's events, peers met over
MASTER_PORT, each step an all-reduce through rank 0): what crosses hosts here is the launcher's.
A victim waiting inside MindSpore's collective, its stack and py-spy's native one, is
``ranks/test_hangs.py``'s (one host); until stop 36 this test ran real MindSpore ranks too."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, wait_for

from launcher.hangs.stalls import HANG_EXIT_CODE

from .jobs import assert_no_job_processes, job_dir, job_pids, launch_on, write_hostfile

pytestmark = pytest.mark.multinode
PLAIN = RANK_SCRIPTS / "plain_job.py"
SLEEP_LINE = 1 + next(n for n, line in enumerate(PLAIN.read_text().splitlines(), 1)
                      if "rank == args.hang_rank and step == args.hang_at_step" in line)
"""The line of ``plain_job.py`` where the hanging rank sleeps."""


def test_the_straggler_on_another_host_is_named_and_its_stacks_reach_node_0(
        ssh_cluster, weird_tmp: Path) -> None:
    job = "mn-hang"
    write_hostfile(weird_tmp, ssh_cluster, slots=1)
    shutil.copy(PLAIN, weird_tmp / PLAIN.name)
    job_dir(ssh_cluster, weird_tmp, scripts=())
    logs = weird_tmp / job
    proc = launch_on(ssh_cluster, ssh_cluster.names[0],
                     ["--hostfile", str(weird_tmp / "hosts"), "--ssh-option",
                      f"-F {ssh_cluster.ssh_config_path}", "--device", "cpu", "--job-id", job,
                      "--log-dir", str(logs), "--kill-timeout", "3", "--hang-timeout", "8",
                      str(weird_tmp / PLAIN.name), "--steps", "400", "--hang-rank", "1",
                      "--hang-at-step", "3"], cwd=weird_tmp)
    wait_for(lambda: job_pids(ssh_cluster, job) or proc.poll() is not None, "the job's ranks", every=0.5)
    out, err = proc.communicate(timeout=600)
    a, b = ssh_cluster.names
    assert proc.returncode == HANG_EXIT_CODE, err[-3000:]
    assert f"rank 1 on {b} hangs" in err and "while rank(s) 0 wait" in err, err[-3000:]
    plan = json.loads(ssh_cluster.read_text(a, logs / "plan.json"))
    paths = {p["rank"]: p["stack_path"] for p in plan["ranks"]}
    assert "rank 1 is at" in err, err[-3000:]
    assert f"plain_job.py:{SLEEP_LINE} in <module>" in err.split("rank 1 is at")[1], \
        "the straggler's frame, read on its host: " + err[-3000:]
    summary = json.loads(ssh_cluster.read_text(a, logs / "summary.json"))
    cause = summary["root_cause"]
    assert (cause["outcome"], cause["rank"], cause["host"], cause["ranks"]) == (
        "stalled", 1, b, [0])
    remote = ssh_cluster.read_text(a, Path(paths[1]))
    where = f'plain_job.py", line {SLEEP_LINE} in <module>'
    assert remote is not None and where in remote, "rank 1's stacks on node 0's disk"
    assert ssh_cluster.read_text(b, Path(paths[1])) is not None, "and on its own host"
    assert not ssh_cluster.exists(b, Path(paths[0])), "the disks are private"
    assert "in all_reduce" in (ssh_cluster.read_text(a, Path(paths[0])) or ""), "the victim's"
    assert_no_job_processes(ssh_cluster, job)
