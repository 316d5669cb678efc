"""One ssh handshake per host (``launcher.cluster.backends.ssh_mux``), on real sshd between hosts of
their own: preflight's control master to each host carries that host's agent; ``--ssh-port``
and a jump host still work; and however the launch ends (a clean finish, SIGTERM, SIGKILL of
the launcher itself), no master, socket or directory is left on node 0.
"""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
from helpers import wait_for

from .jobs import assert_no_job_processes, job_dir, job_processes, launch_on, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode  # the ranks are plain Python: no MindSpore, no scheduler

RANK = "import sys, time\nprint('up', flush=True)\ntime.sleep(float(sys.argv[1]))\n"


def _ssh_processes(cluster, host: str) -> list[list[str]]:
    return [p["cmdline"] for p in cluster.processes(host)
            if p["cmdline"] and Path(p["cmdline"][0]).name in ("ssh", "sh")
            and any("npl-ssh-" in word for word in p["cmdline"])]


def _left_on_node0(cluster) -> tuple[list[list[str]], str]:
    """Masters (their sh and ssh) and clients still running on node 0, and its npl-ssh dirs."""
    a = cluster.names[0]
    dirs = cluster.run_on(a, ["sh", "-c", "ls -d /tmp/npl-ssh-* 2>/dev/null; true"]).stdout
    return _ssh_processes(cluster, a), dirs.strip()


def _job(cluster, tmp_path_factory, name: str) -> Path:
    work = tmp_path_factory.mktemp(name)
    write_hostfile(work, cluster, slots=1)
    (work / "rank.py").write_text(RANK)
    job_dir(cluster, work, scripts=())
    return work


def _args(cluster, work: Path, job: str, *extra: str) -> list[str]:
    return ["--hostfile", str(work / "hosts"), "--ssh-option", f"-F {cluster.ssh_config_path}",
            "--device", "cpu", "--job-id", job, "--log-dir", str(work / job),
            "--kill-timeout", "3", *extra]


@pytest.mark.parametrize("ending", ["finish", "SIGTERM", "SIGKILL"])
def test_each_agent_rides_on_its_hosts_master_and_nothing_is_left(ssh_cluster, tmp_path_factory,
                                                                   ending: str) -> None:
    cluster = ssh_cluster
    job = f"mux-{ending.lower()}"
    work = _job(cluster, tmp_path_factory, job)
    hold = "8" if ending == "finish" else "3600"
    proc = launch_on(cluster, cluster.names[0], _args(cluster, work, job, "rank.py", hold),
                     cwd=work)
    wait_for(lambda: all(job_processes(cluster, job).values()) or proc.poll() is not None,
                f"{job}: processes on every host", 120, every=0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    ssh = _ssh_processes(cluster, cluster.names[0])
    masters = [c for c in ssh if Path(c[0]).name == "ssh" and "ControlMaster=yes" in c]
    agents = [c for c in ssh if "ControlMaster=no" in c and any("launcher.cluster.agent" in w for w in c)]
    assert len(masters) == 2 and len(agents) == 2, ssh
    sockets = {w.removeprefix("ControlPath=") for c in masters for w in c
               if w.startswith("ControlPath=")}
    assert {w.removeprefix("ControlPath=") for c in agents for w in c
            if w.startswith("ControlPath=")} == sockets, "each agent rides on a master"
    if ending == "finish":
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
    else:
        proc.send_signal(getattr(signal, ending))
        proc.communicate(timeout=120)
    wait_for(lambda: _left_on_node0(cluster) == ([], ""), f"{job}: masters gone", 60, every=0.5)
    wait_for(lambda: not any(job_processes(cluster, job).values()), f"{job}: ranks gone", 60, every=0.5)
    assert_no_job_processes(cluster, job)


def test_ssh_port_and_a_jump_host_keep_working(ssh_cluster, tmp_path_factory) -> None:
    cluster = ssh_cluster
    work = _job(cluster, tmp_path_factory, "mux-jump")
    a, b = cluster.names
    result = run_on_node0(cluster, _args(cluster, work, "mux-jump", "--ssh-port", "22",
                                         "--ssh-option", f"-o ProxyJump={b}", "rank.py", "0"),
                          cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    up = [line for line in result.stdout.splitlines() if line.endswith("] up")]
    assert up and all(f"{host}:{rank}" in " ".join(up) for rank, host in enumerate((a, b))), \
        result.stdout
    assert _left_on_node0(cluster) == ([], "")
    assert_no_job_processes(cluster, "mux-jump")
