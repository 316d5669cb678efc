"""Multi-node launches over real ssh between real (namespace) hosts, with real MindSpore ranks.

Each host has its own address, hostname, sshd, filesystem and process table (cluster.py). The
launcher runs inside the first host, as node 0 does on a real cluster; the job's directory
(script, hostfile, env file) is copied to every host before it starts. What the job wrote and
what it left running are looked up inside each host: node 0's log dir on the first host, each
node's own logs and events on its own disk, "no process left" in every host's process table.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from helpers import checksums, npu_launch_argv, per_rank, wait_for

from .jobs import (
    assert_no_job_processes,
    initialised,
    job_dir,
    job_pids,
    job_processes,
    kill_in_host,
    launch_on,
    run_on_node0,
    worker,
    write_hostfile,
)

pytestmark = pytest.mark.multinode


def _job(cluster, tmp: Path, extra_hosts: str = "", script: str = "plain_job.py",
         slots: int = 2) -> tuple[Path, Path]:
    """The job directory ``tmp`` on every host: the rank script and a hostfile of ``slots``
    slots per host. Returns (script, hostfile). The ranks are plain Python (``plain_job.py``: no
    MindSpore on any host) unless the test is about MindSpore's own training."""
    hostfile = write_hostfile(tmp, cluster, slots=slots, extra=extra_hosts)
    job_dir(cluster, tmp, scripts=(script,))
    return tmp / script, hostfile


def _args(cluster, tmp: Path, job: str, *args: str, hostfile: Path = None) -> list[str]:
    return ["--hostfile", str(hostfile or tmp / "hosts"),
            "--ssh-option", f"-F {cluster.ssh_config_path}", "--device", "cpu",
            "--job-id", job, "--log-dir", str(tmp / job), "--kill-timeout", "3", *args]


def _start(cluster, tmp: Path, job: str, *args: str):
    """The job started from its directory on node 0 (the first host)."""
    return launch_on(cluster, cluster.names[0], _args(cluster, tmp, job, *args), cwd=tmp)


def _wait_initialised(cluster, tmp: Path, job: str, proc=None, timeout: float = 120) -> None:
    wait_for(lambda: initialised(cluster, tmp / job, range(4))
                or (proc is not None and proc.poll() is not None), f"{job}: 4 ranks initialised",
                timeout, every=0.5)
    if proc is not None:
        assert proc.poll() is None, f"{job} ended early: {proc.communicate()[1][-3000:]}"


@pytest.mark.mindspore
def test_two_nodes_train_like_one_node_of_two(ssh_cluster, ms_job_checksum,
                                              weird_tmp: Path) -> None:
    """2 hosts x 1 rank over ssh end with the parameters of 1 node x 2 ranks (``ms_job_checksum``,
    run once per test run for the engine and pod tests too)."""
    script, _ = _job(ssh_cluster, weird_tmp, script="ms_job.py", slots=1)
    result = run_on_node0(ssh_cluster, _args(ssh_cluster, weird_tmp, "mn-ok", str(script),
                                             "--steps", "3"), cwd=weird_tmp)
    assert result.returncode == 0, result.stderr[-3000:]
    sums = checksums(result.stdout)
    a, b = ssh_cluster.names
    assert set(sums) == {f"[{a}:0]", f"[{b}:1]"}, result.stdout[-2000:]
    assert set(sums.values()) == {ms_job_checksum(2)}, sums
    logs = weird_tmp / "mn-ok"
    for rank in (0, 1):
        copy = ssh_cluster.read_text(a, logs / f"rank_{rank}.log")
        assert copy is not None and "checksum" in copy, f"node 0 keeps a copy of rank {rank}'s log"
    assert ssh_cluster.exists(b, logs / "hosts" / b / "rank_1.log"), "node 1 keeps its own logs"
    assert ssh_cluster.exists(a, logs / "hosts" / a / "scheduler.log")
    assert_no_job_processes(ssh_cluster, "mn-ok")


def test_rank_killed_on_node_1_ends_the_job_everywhere(ssh_cluster, weird_tmp: Path) -> None:
    job = "mn-kill"
    script, _ = _job(ssh_cluster, weird_tmp)
    proc = _start(ssh_cluster, weird_tmp, job, str(script), "--sleep-after-init", "3600")
    _wait_initialised(ssh_cluster, weird_tmp, job)
    host, victim = worker(ssh_cluster, job, 3)
    assert host == ssh_cluster.names[1]
    kill_in_host(ssh_cluster, host, victim, "KILL")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 137, err[-3000:]
    assert f"rank 3 on {ssh_cluster.names[1]} (pid {victim}) killed by SIGKILL" in err
    # The agent's structured cause reaches node 0's summary.json whole.
    summary = json.loads(ssh_cluster.read_text(ssh_cluster.names[0], weird_tmp / job / "summary.json"))
    cause = summary["root_cause"]
    assert (summary["outcome"], cause["outcome"], cause["process"], cause["rank"], cause["host"],
            cause["pid"], cause["returncode"]) == ("failed", "failed", "rank", 3, host, victim, -9)
    assert_no_job_processes(ssh_cluster, job)


def test_a_rank_stuck_in_its_exit_handlers_on_node_1_is_stopped_from_node_0(
        ssh_cluster, weird_tmp: Path) -> None:
    """Node 0 alone sees every rank's end: once all four scripts ended cleanly and rank 3 on the
    other host stays in its exit handlers past ``--exit-timeout``, node 0 ends the job as a
    success and the agent there stops it; nothing is left on either host, guardians included."""
    job = "mn-linger"
    script, _ = _job(ssh_cluster, weird_tmp)
    done = run_on_node0(ssh_cluster, _args(ssh_cluster, weird_tmp, job, "--exit-timeout", "1",
                                           str(script), "--linger-at-exit", "3"), cwd=weird_tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(set(checksums(done.stdout).values())) == 1, done.stdout[-2000:]
    assert (f"npu-launch: counted as exited 0: rank 3 on {ssh_cluster.names[1]}: still in its "
            "exit handlers 1 s after every rank's script ended cleanly") in done.stderr
    assert_no_job_processes(ssh_cluster, job)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_on_node_0_leaves_nothing_on_any_node(ssh_cluster, weird_tmp: Path, sig,
                                                      code) -> None:
    job = f"mn-{sig.name.lower()}"
    script, _ = _job(ssh_cluster, weird_tmp)
    proc = _start(ssh_cluster, weird_tmp, job, str(script), "--sleep-after-init", "3600")
    _wait_initialised(ssh_cluster, weird_tmp, job)
    for host, procs in job_processes(ssh_cluster, job).items():
        assert procs, f"no rank of {job} on {host}"
    proc.send_signal(sig)  # sent inside node 0, to the launcher itself
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]
    assert_no_job_processes(ssh_cluster, job)


def test_second_job_survives_first_jobs_teardown(ssh_cluster, weird_tmp: Path) -> None:
    script, _ = _job(ssh_cluster, weird_tmp)
    first = _start(ssh_cluster, weird_tmp, "mn-first", str(script), "--sleep-after-init", "3600")
    second = _start(ssh_cluster, weird_tmp, "mn-second", str(script), "--sleep-after-init", "5",
                    "--steps", "2")
    for job, proc in (("mn-first", first), ("mn-second", second)):
        # Eight ranks start on two cores here: give them time, and say why on failure.
        _wait_initialised(ssh_cluster, weird_tmp, job, proc, 300)
    survivors = job_pids(ssh_cluster, "mn-second")
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    assert first.returncode == 130
    assert_no_job_processes(ssh_cluster, "mn-first")
    assert survivors <= job_pids(ssh_cluster, "mn-second"), "the first job's teardown hit the second"
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    sums = checksums(out)
    assert len(sums) == 4 and len(set(sums.values())) == 1, sums


def test_unreachable_host_fails_preflight_and_starts_nothing(ssh_cluster,
                                                             weird_tmp: Path) -> None:
    script, hostfile = _job(ssh_cluster, weird_tmp, extra_hosts="npl-nowhere.invalid slots=2\n")
    result = run_on_node0(ssh_cluster, _args(ssh_cluster, weird_tmp, "mn-pre", str(script)),
                          cwd=weird_tmp, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "npl-nowhere.invalid" in result.stderr and "unreachable" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "npu-launch: error: preflight failed on npl-nowhere.invalid")
    assert_no_job_processes(ssh_cluster, "mn-pre")
    assert not any(ssh_cluster.exists(h, weird_tmp / "mn-pre") for h in ssh_cluster.names)
    table = ssh_cluster.run_on(ssh_cluster.names[0], npu_launch_argv(
        "preflight", "--hostfile", str(hostfile), "--ssh-option", f"-F {ssh_cluster.ssh_config_path}"),
        cwd=weird_tmp)
    assert table.returncode == 1, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert rows[ssh_cluster.names[0]].rstrip().endswith("ok")
    assert "FAIL: unreachable" in rows["npl-nowhere.invalid"]


def test_environment_reaches_remote_ranks_intact(ssh_cluster, weird_tmp: Path) -> None:
    script = weird_tmp / "show_env.py"
    script.write_text("import json, os\nprint('ENV', json.dumps({k: os.environ.get(k) for k in "
                      "('FROM_FLAG', 'FROM_FILE', 'MS_FROM_PREFIX', 'NOT_FORWARDED')}))\n")
    (weird_tmp / ".npu_launch_env").write_text("# forwarded to every host\n"
                                               "FROM_FILE=it's \"quoted\"; echo pwned\n")
    _job(ssh_cluster, weird_tmp)
    env = {**ssh_cluster.env, "MS_FROM_PREFIX": "a b", "NOT_FORWARDED": "local only"}
    args = _args(ssh_cluster, weird_tmp, "mn-env", "--env", "FROM_FLAG=x; rm -rf /tmp/nothing $HOME",
                 str(script))
    result = run_on_node0(ssh_cluster, args, cwd=weird_tmp, env=env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads(line.split("ENV ", 1)[1]) for line in per_rank(result.stdout).splitlines()
            if "ENV " in line]  # the console shows the 4 alike lines once: [a:0-1 b:2-3] ENV ...
    assert len(seen) == 4
    for values in seen:
        assert values == {"FROM_FLAG": "x; rm -rf /tmp/nothing $HOME",
                          "FROM_FILE": "it's \"quoted\"; echo pwned",
                          "MS_FROM_PREFIX": "a b", "NOT_FORWARDED": None}


def test_dead_node_0_is_a_dropped_connection_and_agents_stop(ssh_cluster,
                                                            weird_tmp: Path) -> None:
    job = "mn-orphan"
    script, _ = _job(ssh_cluster, weird_tmp)
    proc = _start(ssh_cluster, weird_tmp, job, str(script), "--sleep-after-init", "3600")
    _wait_initialised(ssh_cluster, weird_tmp, job)
    proc.kill()  # SIGKILL to the launcher on node 0: each agent only sees its connection end
    proc.communicate(timeout=60)
    wait_for(lambda: not job_pids(ssh_cluster, job), "agents to stop their ranks", 60, every=0.5)
    assert_no_job_processes(ssh_cluster, job)
