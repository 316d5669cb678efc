"""``--bind-cores`` across hosts: node 0's plan carries the rule, and each host's agent finds
its own ranks' cores on its own host and starts them bound, or refuses before it starts any.

The ranks print what the kernel lets them run on (``tests/rank_scripts/affinity.py``, told to
exit at once: its "go" file is the script itself, which every host has).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.config.cpu_list import format_cpu_list
from launcher.plan.binding import split

from .jobs import assert_no_job_processes, job_dir, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode  # plain-Python ranks: no MindSpore anywhere


def _run(cluster, tmp: Path, job: str, cores: str):
    write_hostfile(tmp, cluster, slots=2)
    job_dir(cluster, tmp, scripts=("affinity.py",))
    script = str(tmp / "affinity.py")
    return run_on_node0(cluster, ["--hostfile", str(tmp / "hosts"), "--ssh-option",
                                  f"-F {cluster.ssh_config_path}", "--device", "cpu",
                                  "--job-id", job, "--log-dir", str(tmp / job),
                                  "--kill-timeout", "3", "--bind-cores", cores, script, script],
                        cwd=tmp)


def _said(cluster, host: str, log_dir: Path, rank: int) -> str:
    text = cluster.read_text(host, log_dir / "hosts" / host / f"rank_{rank}.log") or ""
    line = next((x for x in text.splitlines() if x.startswith(f"affinity {rank} ")), "")
    assert line, f"rank {rank} said nothing on {host}: {text[-500:]}"
    return line.split()[3]


def test_each_agent_binds_its_hosts_ranks(ssh_cluster, weird_tmp: Path) -> None:
    job = "mn-bind"
    result = _run(ssh_cluster, weird_tmp, job, "auto")
    assert result.returncode == 0, result.stderr[-3000:]
    a, b = ssh_cluster.names
    plan = json.loads(ssh_cluster.read_text(a, weird_tmp / job / "plan.json") or "{}")
    assert [(r["binding"]["rule"], r["binding"]["cpus"]) for r in plan["ranks"]] == \
        [("auto", [])] * 4, "node 0 leaves each host's cores to that host"
    blocks = [format_cpu_list(block) for block in split(sorted(os.sched_getaffinity(0)), 2)]
    hosts = {0: a, 1: a, 2: b, 3: b}
    assert [_said(ssh_cluster, hosts[r], weird_tmp / job, r) for r in range(4)] == blocks * 2
    said = result.stdout + result.stderr
    for host, ranks in ((a, (0, 1)), (b, (2, 3))):
        assert (f"[{host}:agent] cores: rank {ranks[0]} -> {blocks[0]}, rank {ranks[1]} -> "
                f"{blocks[1]} (this host's allowed cores") in said, said[-3000:]
    assert_no_job_processes(ssh_cluster, job)


def test_an_agent_refuses_a_core_its_host_does_not_have(ssh_cluster, weird_tmp: Path) -> None:
    """Node 0 cannot check another host's cores; each agent does, and starts nothing."""
    job, missing = "mn-bind-refused", str(max(os.sched_getaffinity(0)) + 1)
    result = _run(ssh_cluster, weird_tmp, job, missing)
    assert result.returncode == 2, result.stderr[-3000:]
    assert (f"--bind-cores {missing}: core(s) {missing} are not among the cores this host "
            "allows") in result.stderr, result.stderr[-3000:]
    a, b = ssh_cluster.names
    assert not ssh_cluster.exists(b, weird_tmp / job / "hosts" / b / "rank_2.log") or \
        "affinity" not in (ssh_cluster.read_text(b, weird_tmp / job / "hosts" / b / "rank_2.log")
                           or ""), "no rank started"
    assert_no_job_processes(ssh_cluster, job)
