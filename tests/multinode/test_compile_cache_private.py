"""The compile cache on hosts that share no storage: 2 hosts x 1 rank, rank 1 fails once.

Each host keeps its own rank's graphs in its own log dir (``compile_cache/<launch>/rank_N``),
and the restarted ranks load them there: MindSpore says so in each rank's log (node 0's streamed
copy), and no host holds another's rank folder.
"""
from __future__ import annotations

import pytest

from .jobs import assert_no_job_processes, job_dir, run_on_node0, write_hostfile

pytestmark = [pytest.mark.multinode, pytest.mark.mindspore]
LOADED = "Use the compilation cache and execute the backend actions only"


def test_each_host_keeps_and_reloads_its_ranks_graphs(ssh_cluster, tmp_path_factory) -> None:
    work = tmp_path_factory.mktemp("cache")
    hostfile = write_hostfile(work, ssh_cluster, slots=1)
    job_dir(ssh_cluster, work, scripts=("compiled_steps.py",))
    result = run_on_node0(ssh_cluster, [
        "--hostfile", str(hostfile), "--ssh-option", f"-F {ssh_cluster.ssh_config_path}",
        "--device", "cpu", "--console", "none", "--job-id", "cache-hosts", "--max-restarts", "1",
        "--log-dir", str(work / "logs"), str(work / "compiled_steps.py"), "--fail-rank", "1",
        "--fail-after-step", "0"], cwd=work, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "restart 1 of 1" in result.stderr, result.stderr[-4000:]
    a, b = ssh_cluster.names
    for rank, host, _other in ((0, a, b), (1, b, a)):
        found = ssh_cluster.run_on(host, ["find", str(work / "logs" / "compile_cache"),
                                          "-name", "*.mindir"], check=True).stdout
        assert f"/rank_{rank}/graph_cache/" in found and f"/rank_{1 - rank}/" not in found, \
            (host, found)
        log = ssh_cluster.read_text(a, work / "logs" / f"rank_{rank}.log") or ""
        assert LOADED in log, log[-2000:]
    assert_no_job_processes(ssh_cluster, "cache-hosts")
