"""The fake hosts really behave like separate hosts: own hostname, own address and ports, sshd, Slurm."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from helpers import wait_for

from . import cluster as cluster_mod
from .cluster import HOSTS_FILE, NETNS_DIR, STATE_ROOT, Cluster, Daemon, recorded_daemons, unique_tag

pytestmark = pytest.mark.multinode

ECHO_SERVER = textwrap.dedent("""
    import socket, sys
    srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
    print("listening", flush=True)
    srv.settimeout(60)
    conn, _ = srv.accept()
    conn.sendall(socket.gethostname().encode())
    conn.close()
""")

CLIENT = textwrap.dedent("""
    import socket, sys
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as c:
            print(c.recv(100).decode())
    except ConnectionRefusedError:
        print("refused")
""")


def _ssh(cluster: Cluster, host: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cluster.ssh_argv(host, argv), capture_output=True, text=True,
                          env=cluster.env, timeout=60)


def test_ssh_to_each_host_prints_its_own_hostname(ssh_cluster: Cluster) -> None:
    for name in ssh_cluster.names:
        res = subprocess.run(["ssh", "-F", str(ssh_cluster.ssh_config_path), "-o", "BatchMode=yes",
                              name, "hostname"], capture_output=True, text=True, timeout=60)
        assert (res.returncode, res.stdout, res.stderr) == (0, f"{name}\n", "")


def test_run_on_enters_the_host(ssh_cluster: Cluster) -> None:
    a, b = ssh_cluster.hosts
    res = ssh_cluster.run_on(a.name, ["sh", "-c", "hostname; ip -o -4 addr show dev eth0"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == a.name
    assert f"inet {a.address}/24" in res.stdout


def test_hosts_reach_each_other_over_tcp_with_separate_port_spaces(ssh_cluster: Cluster) -> None:
    a, b = ssh_cluster.names
    port = 18765
    server = ssh_cluster.popen_on(a, [sys.executable, "-c", ECHO_SERVER, str(port)],
                                  stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline() == "listening\n"
        # Same port on b's loopback: nothing listens there, b has its own port space.
        on_loopback = ssh_cluster.run_on(b, [sys.executable, "-c", CLIENT, "127.0.0.1", str(port)])
        assert on_loopback.stdout == "refused\n", on_loopback.stderr
        by_name = ssh_cluster.run_on(b, [sys.executable, "-c", CLIENT, a, str(port)])
        assert by_name.stdout == f"{a}\n", by_name.stderr
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()


def test_names_resolve_everywhere(ssh_cluster: Cluster) -> None:
    code = "import socket, sys; print(' '.join(socket.gethostbyname(n) for n in sys.argv[1:]))"
    want = " ".join(ssh_cluster.addresses) + "\n"
    assert subprocess.run([sys.executable, "-c", code, *ssh_cluster.names],
                          capture_output=True, text=True).stdout == want
    res = ssh_cluster.run_on(ssh_cluster.names[1], [sys.executable, "-c", code, *ssh_cluster.names])
    assert res.stdout == want, res.stderr


def test_python_over_ssh_is_ours_and_imports_launcher(ssh_cluster: Cluster) -> None:
    # The interpreter goes by path, as the launcher sends it (backends/common.py python_of):
    # a bare python3 would be the remote login shell's pick from its PATH.
    code = "import socket, sys, launcher; print(socket.gethostname(), sys.executable, launcher.__file__)"
    import launcher

    for name in ssh_cluster.names:
        res = _ssh(ssh_cluster, name, [sys.executable, "-c", code])
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == [name, sys.executable, launcher.__file__]


def test_pids_in_sees_a_process_of_one_host_only(ssh_cluster: Cluster) -> None:
    a, b = ssh_cluster.names
    proc = ssh_cluster.popen_on(a, ["sleep", "60"])
    try:
        # popen_on's pid is nsenter's, which execs sleep in place: same pid.
        wait_for(lambda: proc.pid in ssh_cluster.pids_in(a), f"pid {proc.pid} in {a}", 10)
        assert proc.pid not in ssh_cluster.pids_in(b)
        sshd = {d.pid for d in ssh_cluster.daemons if d.host == a}
        assert sshd and sshd <= set(ssh_cluster.all_pids_in(a))
        assert not sshd & set(ssh_cluster.pids_in(a))
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in ssh_cluster.pids_in(a)


def test_srun_runs_one_task_on_each_host(slurm_cluster: Cluster) -> None:
    res = subprocess.run(["srun", "-N2", "hostname"], capture_output=True, text=True,
                         env=slurm_cluster.env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == sorted(slurm_cluster.names)
    res = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "--label", "sh", "-c",
                          "echo $SLURM_NODEID $SLURM_PROCID $SLURMD_NODENAME $(hostname)"],
                         capture_output=True, text=True, env=slurm_cluster.env, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = sorted(line.split(": ", 1)[1].split() for line in res.stdout.splitlines())
    assert rows == [[str(i), str(i), n, n] for i, n in enumerate(sorted(slurm_cluster.names))]


def test_teardown_leaves_nothing_behind_and_is_idempotent(can_host_slurm_clusters: None) -> None:
    tag = unique_tag("t")
    cluster = Cluster(2, tag=tag)
    with cluster:
        cluster.start_ssh()
        cluster.start_slurm()
        workdir, names, daemons = cluster.workdir, cluster.names, list(cluster.daemons)
        job = cluster.popen_on(names[0], ["sleep", "300"])  # a stray job process
        assert {d.role for d in daemons} == {"sshd", "munged", "slurmctld", "slurmd"}
    job.wait(timeout=10)
    _assert_gone(tag, names, daemons, workdir)
    cluster.teardown()  # again: a no-op
    Cluster(1, tag=tag).teardown()  # never set up: a no-op


def test_teardown_after_partial_setup(can_host_ssh_clusters: None) -> None:
    tag = unique_tag("p")
    cluster = Cluster(2, tag=tag).setup()  # network only, no services yet
    names, workdir = cluster.names, cluster.workdir
    cluster.teardown()
    _assert_gone(tag, names, [], workdir)


def test_cluster_of_a_killed_run_is_cleaned_at_next_setup(can_host_ssh_clusters: None) -> None:
    tag = unique_tag("k")
    owner = subprocess.Popen([sys.executable, "-c", _KILLED_OWNER, cluster_mod.__file__, tag],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = owner.stdout.readline()
        assert line.startswith("ready "), line
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
    workdir, *names = line.split()[1:]
    daemons = recorded_daemons(tag)
    assert daemons and all(d.alive() for d in daemons), "the killed run's sshd should outlive it"
    assert set(names) <= set(os.listdir(NETNS_DIR))

    with Cluster(1, tag=tag) as fresh:  # same tag: setup cleans the stale one first
        assert fresh.names == [names[0]]
        assert not any(d.alive() for d in daemons)
        assert names[1] not in os.listdir(NETNS_DIR)
        assert not Path(workdir).exists()
        assert names[1] not in HOSTS_FILE.read_text()
    _assert_gone(tag, names, daemons, Path(workdir))


_KILLED_OWNER = textwrap.dedent("""
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("npl_cluster", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["npl_cluster"] = mod
    spec.loader.exec_module(mod)
    c = mod.Cluster(2, tag=sys.argv[2]).setup()
    c.start_ssh()
    print("ready", c.workdir, *c.names, flush=True)
    time.sleep(600)
""")


def _assert_gone(tag: str, names: list[str], daemons: list[Daemon], workdir: Path) -> None:
    namespaces = set(os.listdir(NETNS_DIR)) if NETNS_DIR.exists() else set()
    assert not set(names) & namespaces, f"namespaces left: {set(names) & namespaces}"
    assert [d for d in daemons if d.alive()] == []
    for name in names:
        assert name not in HOSTS_FILE.read_text()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"npl-{tag}-br" not in links and f"nv-{tag}-" not in links
    assert not workdir.exists()
    assert not (STATE_ROOT / tag).exists()
    stragglers = [p.pid for p in psutil.process_iter(["cmdline"])
                  if any(str(workdir) in a for a in (p.info["cmdline"] or []))]
    assert stragglers == []
