"""The launch directory on every host, over real ssh between hosts that share no files.

Each host's ``/tmp`` is its own (cluster.py), so a file changed on the second host is changed
there only, as on servers without shared storage. Preflight, run by the launcher on the first
host, names the second host and the files that differ, and nothing starts; ``--sync-workdir``
copies the launch directory there (leaving its logs behind), and the same launch runs. A launch
directory the second host lacks entirely is copied too, from a path that is an injection.

The rank script prints and exits; the scheduler npu-launch starts beside it is MindSpore's.
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from .jobs import assert_no_job_processes, job_dir, mpi_launcher_args, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode  # plain-Python ranks: no MindSpore anywhere

HELLO = """\
import os, socket, sys
MARK = "node 0"
with open(sys.argv[1]) as f:
    print("hello", MARK, os.environ["RANK_ID"], socket.gethostname(), f.read().strip(), flush=True)
"""
CONF = "lr: 1\n"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _launch_dir(cluster, path: Path) -> Path:
    """``path`` with the script, its config file and a hostfile of one slot per host."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "hello.py").write_text(HELLO)
    (path / "conf.txt").write_text(CONF)
    write_hostfile(path, cluster, slots=1)
    return path


def _args(cluster, work: Path, job: str, *extra: str) -> list[str]:
    return ["--hostfile", str(work / "hosts"), "--ssh-option", f"-F {cluster.ssh_config_path}",
            "--device", "cpu", "--cards", "1", "--job-id", job, "--log-dir", str(work / job),
            "--kill-timeout", "3", *extra, "hello.py", "conf.txt"]


def _write_on(cluster, host: str, path: Path, text: str) -> None:
    """``text`` into ``path`` (its folder made) on ``host`` only, in its own filesystem."""
    script = 'mkdir -p -- "$(dirname -- "$2")" && printf %s "$1" > "$2"'
    cluster.run_on(host, ["sh", "-c", script, "sh", text, str(path)], check=True)


def _hello_lines(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if "] hello " in line)


def test_preflight_names_the_host_whose_files_differ_and_sync_makes_the_job_run(
        ssh_cluster, weird_tmp: Path) -> None:
    a, b = ssh_cluster.names
    work = _launch_dir(ssh_cluster, weird_tmp / "launch")
    job_dir(ssh_cluster, work, scripts=())
    changed = HELLO.replace("node 0", "node 9")  # the same size: the sha256 tells
    _write_on(ssh_cluster, b, work / "hello.py", changed)
    _write_on(ssh_cluster, b, work / "conf.txt", "lr: 10\n")
    _write_on(ssh_cluster, b, work / "only-here.txt", "kept\n")
    _write_on(ssh_cluster, a, work / "npu_launch_logs" / "old.log", "an earlier job's log\n")

    refused = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-differs"), cwd=work)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    rows = {line.split()[0]: line for line in refused.stderr.splitlines()[1:-1]}
    assert rows[a].rstrip().endswith("  ok"), refused.stderr
    assert rows[b].endswith(
        f"FAIL: hello.py differs from node 0's (sha256 {_sha(changed)} vs {_sha(HELLO)}), "
        f"conf.txt differs from node 0's (size 7 vs 6 bytes)"), refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        f"npu-launch: error: preflight failed on {b}: nothing was started")
    assert_no_job_processes(ssh_cluster, "ws-differs")
    for host in (a, b):
        assert not ssh_cluster.exists(host, work / "ws-differs"), f"{host} has a log directory"

    synced = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-synced", "--sync-workdir"),
                          cwd=work)
    assert synced.returncode == 0, synced.stdout[-2000:] + synced.stderr[-3000:]
    assert f"npu-launch: --sync-workdir: copied {work} (" in synced.stderr
    assert f") to {b}\n" in synced.stderr, synced.stderr
    assert _hello_lines(synced.stdout) == [f"[{a}:0] hello node 0 0 {a} lr: 1",
                                           f"[{b}:1] hello node 0 1 {b} lr: 1"], synced.stdout
    for name, text in (("hello.py", HELLO), ("conf.txt", CONF), ("only-here.txt", "kept\n")):
        assert ssh_cluster.read_text(b, work / name) == text, name
    assert not ssh_cluster.exists(b, work / "npu_launch_logs"), "logs are not copied"
    assert_no_job_processes(ssh_cluster, "ws-synced")

    again = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-same", "--sync-workdir"),
                         cwd=work)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "--sync-workdir: copied" not in again.stderr, "nothing differs: nothing is copied"


def test_a_launch_directory_missing_on_a_host_is_copied_there(ssh_cluster, tmp_path: Path) -> None:
    a, b = ssh_cluster.names
    work = _launch_dir(ssh_cluster, tmp_path / "-new; touch PWNED" / "$(touch PWNED) 'q'\nx")
    ssh_cluster.put(tmp_path, hosts=[a])  # only the first host has it
    assert not ssh_cluster.exists(b, work)

    refused = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-missing"), cwd=work)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "FAIL: no directory " in refused.stderr and " there" in refused.stderr, refused.stderr
    assert not ssh_cluster.exists(b, work)

    synced = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-copied", "--sync-workdir"),
                          cwd=work)
    assert synced.returncode == 0, synced.stdout[-2000:] + synced.stderr[-3000:]
    assert _hello_lines(synced.stdout)[1] == f"[{b}:1] hello node 0 1 {b} lr: 1", synced.stdout
    assert ssh_cluster.read_text(b, work / "hello.py") == HELLO
    assert_no_job_processes(ssh_cluster, "ws-copied")
    for host in (a, b):
        for folder in ("/", str(Path.home()), str(tmp_path), str(tmp_path / "-new; touch PWNED")):
            assert not ssh_cluster.exists(host, Path(folder) / "PWNED"), (host, folder)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_mpirun_jobs_get_the_same_copy_over_ssh(ssh_cluster, weird_tmp: Path) -> None:
    """mpirun reaches the hosts over ssh too: the same preflight, the same copy."""
    a, b = ssh_cluster.names
    work = _launch_dir(ssh_cluster, weird_tmp / "mpi launch")
    job_dir(ssh_cluster, work, scripts=())
    _write_on(ssh_cluster, b, work / "hello.py", HELLO.replace("node 0", "node 9"))
    mpi = ["--launcher", "mpi", "--launcher-args", mpi_launcher_args(ssh_cluster)]
    refused = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-mpi-differs", *mpi), cwd=work)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "FAIL: hello.py differs from node 0's (sha256 " in refused.stderr
    synced = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-mpi", *mpi, "--sync-workdir"),
                          cwd=work)
    assert synced.returncode == 0, synced.stdout[-2000:] + synced.stderr[-3000:]
    assert _hello_lines(synced.stdout) == [f"[{a}:0] hello node 0 0 {a} lr: 1",
                                           f"[{b}:1] hello node 0 1 {b} lr: 1"], synced.stdout
    assert ssh_cluster.read_text(b, work / "hello.py") == HELLO
    assert_no_job_processes(ssh_cluster, "ws-mpi")


def test_a_job_refused_after_preflight_copies_nothing(ssh_cluster, weird_tmp: Path) -> None:
    """--sync-workdir copies only once the whole job is known to be good: a --console filter
    naming a rank the job lacks (checked after preflight) leaves the second host untouched."""
    a, b = ssh_cluster.names
    work = _launch_dir(ssh_cluster, weird_tmp / "refused")
    job_dir(ssh_cluster, work, scripts=())
    _write_on(ssh_cluster, b, work / "hello.py", HELLO.replace("node 0", "node 9"))
    refused = run_on_node0(ssh_cluster, _args(ssh_cluster, work, "ws-refused", "--sync-workdir",
                                              "--console", "7"), cwd=work)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "npu-launch: error: --console 7: the job has ranks 0-1, not 7")
    assert "--sync-workdir: copied" not in refused.stderr
    assert ssh_cluster.read_text(b, work / "hello.py") == HELLO.replace("node 0", "node 9")
    assert_no_job_processes(ssh_cluster, "ws-refused")
