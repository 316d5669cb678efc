"""Multi-node launches over real ssh between real (namespace) hosts, with real MindSpore ranks.

Each host is a network namespace with its own address, hostname and sshd (cluster.py). The
launcher runs in the root namespace as node 0 would on a login node. "No process left" is
checked inside each host's namespace and by the job id.
"""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from helpers import (RANK_SCRIPTS, assert_no_job_processes, checksums, initialised, job_pids,
                     npu_launch_argv, run_launcher, wait_for, worker_pid)

pytestmark = [pytest.mark.multinode, pytest.mark.mindspore]
JOB = str(RANK_SCRIPTS / "ms_job.py")


def _hostfile(tmp: Path, cluster, extra: str = "") -> Path:
    path = tmp / "hosts"
    path.write_text("# test hosts\n" + "".join(f"{n} slots=2\n" for n in cluster.names) + extra)
    return path


def _argv(cluster, tmp: Path, job: str, *args: str, hostfile: Path = None) -> list[str]:
    return npu_launch_argv("--hostfile", str(hostfile or _hostfile(tmp, cluster)),
                           "--ssh-option", f"-F {cluster.ssh_config_path}", "--device", "cpu",
                           "--job-id", job, "--log-dir", str(tmp / job), "--kill-timeout", "3",
                           *args)


def _nothing_left_on_hosts(cluster, job: str) -> None:
    for host in cluster.names:
        left = []
        for pid in cluster.pids_in(host):
            try:
                if psutil.Process(pid).environ().get("NPU_LAUNCH_JOB_ID") == job:
                    left.append(pid)
            except psutil.Error:
                continue
        assert not left, f"{host} still runs {left} of job {job}"
    assert_no_job_processes(job)


def test_two_nodes_train_like_one_node_of_four(ssh_cluster, weird_tmp: Path) -> None:
    multi = subprocess.run(_argv(ssh_cluster, weird_tmp, "mn-ok", JOB, "--steps", "3"),
                           capture_output=True, text=True, timeout=300, cwd=weird_tmp)
    assert multi.returncode == 0, multi.stderr[-3000:]
    single = run_launcher("--device", "cpu", "--cards", "4", "--log-dir", str(weird_tmp / "one"),
                          JOB, "--steps", "3")
    assert single.returncode == 0, single.stderr[-3000:]
    multi_sums, single_sums = checksums(multi.stdout), checksums(single.stdout)
    a, b = ssh_cluster.names
    assert set(multi_sums) == {f"[{a}:0]", f"[{a}:1]", f"[{b}:2]", f"[{b}:3]"}
    assert len(single_sums) == 4, single.stdout[-2000:]
    assert len(set(multi_sums.values()) | set(single_sums.values())) == 1, (multi_sums,
                                                                          single_sums)
    logs = weird_tmp / "mn-ok"
    assert "checksum" in (logs / "rank_3.log").read_text(), "node 0 keeps a copy of every log"
    assert (logs / "hosts" / b / "rank_3.log").exists()
    assert (logs / "hosts" / a / "scheduler.log").exists()
    _nothing_left_on_hosts(ssh_cluster, "mn-ok")


def test_rank_killed_on_node_1_ends_the_job_everywhere(ssh_cluster, weird_tmp: Path) -> None:
    job = "mn-kill"
    proc = subprocess.Popen(_argv(ssh_cluster, weird_tmp, job, JOB, "--sleep-after-init", "3600"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: initialised(weird_tmp / job, range(4)), "4 ranks initialised")
    victim = worker_pid(job, 3)
    assert victim in ssh_cluster.pids_in(ssh_cluster.names[1])
    psutil.Process(victim).kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 137, err[-3000:]
    assert f"rank 3 on {ssh_cluster.names[1]} (pid {victim}) killed by SIGKILL" in err
    _nothing_left_on_hosts(ssh_cluster, job)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_on_node_0_leaves_nothing_on_any_node(ssh_cluster, weird_tmp: Path, sig,
                                                      code) -> None:
    job = f"mn-{sig.name.lower()}"
    proc = subprocess.Popen(_argv(ssh_cluster, weird_tmp, job, JOB, "--sleep-after-init", "3600"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: initialised(weird_tmp / job, range(4)), "4 ranks initialised")
    for host in ssh_cluster.names:
        assert any(psutil.Process(p).environ().get("NPU_LAUNCH_JOB_ID") == job
                   for p in ssh_cluster.pids_in(host)), f"no rank of {job} on {host}"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]
    _nothing_left_on_hosts(ssh_cluster, job)


def test_second_job_survives_first_jobs_teardown(ssh_cluster, weird_tmp: Path) -> None:
    first = subprocess.Popen(_argv(ssh_cluster, weird_tmp, "mn-first", JOB,
                                   "--sleep-after-init", "3600"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(_argv(ssh_cluster, weird_tmp, "mn-second", JOB,
                                    "--sleep-after-init", "5", "--steps", "2"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for job, proc in (("mn-first", first), ("mn-second", second)):
        # Eight MindSpore ranks start on two cores here: give them time, and say why on failure.
        wait_for(lambda: initialised(weird_tmp / job, range(4)) or proc.poll() is not None,
                 f"{job} up", 300)
        assert proc.poll() is None, f"{job} ended early: {proc.communicate()[1][-3000:]}"
    survivors = set(job_pids("mn-second"))
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    assert first.returncode == 130
    _nothing_left_on_hosts(ssh_cluster, "mn-first")
    assert survivors <= set(job_pids("mn-second")), "the first job's teardown hit the second"
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    sums = checksums(out)
    assert len(sums) == 4 and len(set(sums.values())) == 1, sums


def test_unreachable_host_fails_preflight_and_starts_nothing(ssh_cluster,
                                                             weird_tmp: Path) -> None:
    hostfile = _hostfile(weird_tmp, ssh_cluster, extra="npl-nowhere.invalid slots=2\n")
    result = subprocess.run(_argv(ssh_cluster, weird_tmp, "mn-pre", JOB, hostfile=hostfile),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "npl-nowhere.invalid" in result.stderr and "unreachable" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "npu-launch: error: preflight failed on npl-nowhere.invalid")
    assert not job_pids("mn-pre") and not (weird_tmp / "mn-pre").exists()
    table = subprocess.run(npu_launch_argv("preflight", "--hostfile", str(hostfile),
                                           "--ssh-option", f"-F {ssh_cluster.ssh_config_path}"),
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 1
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert rows[ssh_cluster.names[0]].rstrip().endswith("ok")
    assert "FAIL: unreachable" in rows["npl-nowhere.invalid"]


def test_environment_reaches_remote_ranks_intact(ssh_cluster, weird_tmp: Path) -> None:
    script = weird_tmp / "show_env.py"
    script.write_text("import json, os\nprint('ENV', json.dumps({k: os.environ.get(k) for k in "
                      "('FROM_FLAG', 'FROM_FILE', 'MS_FROM_PREFIX', 'NOT_FORWARDED')}))\n")
    (weird_tmp / ".npu_launch_env").write_text("# forwarded to every host\n"
                                               "FROM_FILE=it's \"quoted\"; echo pwned\n")
    env = {**ssh_cluster.env, "MS_FROM_PREFIX": "a b", "NOT_FORWARDED": "local only"}
    argv = _argv(ssh_cluster, weird_tmp, "mn-env", "--env", "FROM_FLAG=x; rm -rf /tmp/nothing $HOME",
                 str(script))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=weird_tmp,
                            env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads(line.split("ENV ", 1)[1]) for line in result.stdout.splitlines()
            if "ENV " in line]
    assert len(seen) == 4
    for values in seen:
        assert values == {"FROM_FLAG": "x; rm -rf /tmp/nothing $HOME",
                          "FROM_FILE": "it's \"quoted\"; echo pwned",
                          "MS_FROM_PREFIX": "a b", "NOT_FORWARDED": None}


def test_dead_node_0_is_a_dropped_connection_and_agents_stop(ssh_cluster,
                                                            weird_tmp: Path) -> None:
    job = "mn-orphan"
    proc = subprocess.Popen(_argv(ssh_cluster, weird_tmp, job, JOB, "--sleep-after-init", "3600"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: initialised(weird_tmp / job, range(4)), "4 ranks initialised")
    proc.kill()  # node 0 dies without a word: each agent only sees its connection end
    proc.communicate(timeout=60)
    wait_for(lambda: not job_pids(job), "agents to stop their ranks", 60)
    _nothing_left_on_hosts(ssh_cluster, job)
