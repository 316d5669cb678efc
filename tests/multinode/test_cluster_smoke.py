"""The fake hosts really behave like separate hosts: own hostname, address and ports, own files
and process table, sshd, Slurm; and the checks that look inside them can fail."""
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
from .jobs import assert_no_job_processes, job_pids

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
    proc = ssh_cluster.popen_on(a, ["sleep", "61"])
    try:
        # Host pids: each host numbers its own processes, so b may well have the same number.
        wait_for(lambda: proc.host_pid in ssh_cluster.pids_in(a), f"pid {proc.host_pid} in {a}", 10)
        assert not any(p["cmdline"] == ["sleep", "61"] for p in ssh_cluster.processes(b))
        sshd = {d.host_pid for d in ssh_cluster.daemons if d.host == a and d.role == "sshd"}
        assert sshd and sshd <= set(ssh_cluster.all_pids_in(a))
        assert not sshd & set(ssh_cluster.pids_in(a))
        assert 1 in ssh_cluster.all_pids_in(a) and 1 not in ssh_cluster.pids_in(a)  # the init
    finally:
        proc.kill()
        proc.wait()
    assert proc.host_pid not in ssh_cluster.pids_in(a)


def test_a_host_sees_and_signals_only_its_own_processes(ssh_cluster: Cluster) -> None:
    a, b = ssh_cluster.names
    proc = ssh_cluster.popen_on(a, ["sleep", "62"])
    try:
        pid = proc.host_pid
        for host in (a, b):  # ps, over ssh as a user would run it
            res = subprocess.run(ssh_cluster.ssh_argv(host, ["ps", "-e", "-o", "pid=,args="]),
                                 capture_output=True, text=True, env=ssh_cluster.env, timeout=60)
            assert res.returncode == 0, res.stderr
            assert (f"{pid} sleep 62" in [line.strip() for line in res.stdout.splitlines()]) == (host == a)
        # b cannot reach a's process by the pid the machine (the root namespace) gives it; a
        # process of b's own that has a's host pid is another one (not sent a signal here).
        root_pid = psutil.Process(proc.pid).children()[0].pid
        assert ssh_cluster.run_on(b, ["kill", "-s", "0", str(root_pid)]).returncode != 0
        same_number = ssh_cluster.run_on(b, ["ps", "-p", str(pid), "-o", "args="]).stdout
        assert "sleep 62" not in same_number
        res = ssh_cluster.run_on(a, ["kill", "-s", "TERM", str(pid)])
        assert res.returncode == 0, res.stderr
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_a_hosts_directories_are_its_own(ssh_cluster: Cluster, tmp_path: Path) -> None:
    a, b = ssh_cluster.names
    job = tmp_path / "job"
    job.mkdir()
    (job / "script.py").write_text("print('hi')\n")
    assert not any(ssh_cluster.exists(h, job) for h in (a, b)), "the test's tmp_path is on a host"
    ssh_cluster.put(job)
    assert [ssh_cluster.read_text(h, job / "script.py") for h in (a, b)] == ["print('hi')\n"] * 2
    for private in ("/tmp", "/var/tmp", "/dev/shm"):
        marker = Path(private) / f"written-on-a-{os.getpid()}"
        # Written over ssh, seen by a's own run_on; not by b, nor by the root namespace.
        res = subprocess.run(ssh_cluster.ssh_argv(a, ["touch", str(marker)]), capture_output=True,
                             text=True, env=ssh_cluster.env, timeout=60)
        assert res.returncode == 0, res.stderr
        assert ssh_cluster.exists(a, marker) and not ssh_cluster.exists(b, marker)
        assert not marker.exists(), f"{marker} of host {a} is in the root namespace"
    (job / "local-only").write_text("x")
    assert not ssh_cluster.exists(a, job / "local-only")
    ssh_cluster.run_on(b, ["sh", "-c", 'echo from-b > "$1/out"', "sh", str(job)], check=True)
    fetched = tmp_path / "from-b"
    assert ssh_cluster.fetch(b, job, fetched)
    assert (fetched / "out").read_text() == "from-b\n" and not (job / "out").exists()
    assert not ssh_cluster.exists(a, job / "out")


def test_the_leftover_check_sees_a_process_left_on_a_host(ssh_cluster: Cluster) -> None:
    """The check every job test ends with fails when a host still runs a process of the job."""
    a, b = ssh_cluster.names
    env = {**ssh_cluster.env, "NPU_LAUNCH_JOB_ID": "left-behind"}
    proc = ssh_cluster.popen_on(b, ["sleep", "63"], env=env)
    try:
        wait_for(lambda: job_pids(ssh_cluster, "left-behind"), "the left process", 10)
        assert job_pids(ssh_cluster, "left-behind") == {(b, proc.host_pid)}
        with pytest.raises(AssertionError, match=f"{b}.*sleep 63"):
            assert_no_job_processes(ssh_cluster, "left-behind")
    finally:
        proc.kill()
        proc.wait()
    assert_no_job_processes(ssh_cluster, "left-behind")


def test_srun_runs_one_task_on_each_host(slurm_cluster: Cluster) -> None:
    login = slurm_cluster.names[0]  # the first host is the login node too
    res = slurm_cluster.run_on(login, ["srun", "-N2", "hostname"])
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == sorted(slurm_cluster.names)
    res = slurm_cluster.run_on(login, ["srun", "-N2", "--ntasks-per-node=1", "--label", "sh", "-c",
                                       "echo $SLURM_NODEID $SLURM_PROCID $SLURMD_NODENAME $(hostname)"])
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
        assert {d.role for d in daemons} == {"init", "sshd", "munged", "slurmctld", "slurmd"}
    job.wait(timeout=10)
    _assert_gone(tag, names, daemons, workdir)
    cluster.teardown()  # again: a no-op
    Cluster(1, tag=tag).teardown()  # never set up: a no-op


def test_teardown_after_partial_setup(can_host_ssh_clusters: None) -> None:
    tag = unique_tag("p")
    cluster = Cluster(2, tag=tag).setup()  # network and inits only, no services yet
    names, workdir, inits = cluster.names, cluster.workdir, list(cluster.daemons)
    assert [d.role for d in inits] == ["init", "init"]
    cluster.teardown()
    _assert_gone(tag, names, inits, workdir)


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
    # Loaded by path, as scripts/test-hosts and bench/bench_nodes.py load it.
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
