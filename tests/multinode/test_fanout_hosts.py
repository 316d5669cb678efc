"""``--fanout`` over real ssh between hosts of their own: with ``--fanout 1`` preflight asks one
host at a time and the agents connect one at a time, and a plan far larger than a pipe holds
reaches every host whole.

Every ``ssh`` node 0 runs goes through a recorder first on its ``PATH`` (``RECORDER``): it runs
the real ssh as its child and marks, with the time, its start, the first control line it passes
on (an agent counts as connecting until node 0 reads that line: the recorder sees it first), and
the real ssh's end (node 0 waits for the recorder, which ends after); a probe run as its host's
ssh control master's own session is done when its end marker passes. Each marked interval lies
inside the one node 0 counts, so intervals that do not overlap show node 0's did not either.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from .jobs import assert_no_job_processes, job_dir, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode  # plain-Python ranks: no MindSpore anywhere

RECORDER = """#!{python}
import os, subprocess, sys, time
command = " ".join(sys.argv[1:])
kind = "agent" if "launcher.cluster.agent" in command else "probe" if "launcher.cluster.probe" in command else "other"

def mark(word):
    with open({log!r}, "a") as f:
        f.write(f"{{word}} {{kind}} {{os.getpid()}} {{time.time()}}\\n")

mark("start")
ssh = subprocess.Popen([{ssh!r}, *sys.argv[1:]], stdout=subprocess.PIPE)
said = False
while chunk := os.read(ssh.stdout.fileno(), 65536):
    if not said and (b"\\x1eNPL " in chunk or b"npl-first-session-exit:" in chunk):
        mark("up")
        said = True
    os.write(1, chunk)
code = ssh.wait()
mark("end")
sys.exit(code)
"""

SHOW_ENV = "import os\nprint('BIG', len(os.environ['BIG']), os.environ['BIG'][-3:])\n"
BIG = "x" * 100_000 + "end"  # each rank's environment carries it: the plan is over 200 KB


def _recording_path(cluster, tmp: Path) -> tuple[dict, Path]:
    """An environment whose ``ssh`` is the recorder, and the file it writes (on node 0)."""
    bin_dir, log = tmp / "bin", tmp / "ssh-marks.txt"
    bin_dir.mkdir()
    recorder = bin_dir / "ssh"
    recorder.write_text(RECORDER.format(python=sys.executable, log=str(log),
                                        ssh=shutil.which("ssh", path=cluster.env["PATH"])))
    recorder.chmod(0o755)
    return {**cluster.env, "PATH": f"{bin_dir}:{cluster.env['PATH']}"}, log


def _intervals(cluster, log: Path, kind: str, *until: str) -> list[tuple[float, float]]:
    """Each ssh of ``kind``: its start to the first of its ``until`` marks."""
    text = cluster.read_text(cluster.names[0], log) or ""
    marks = [line.split() for line in text.splitlines()]
    began = {pid: float(t) for word, k, pid, t in marks if word == "start" and k == kind}
    ended: dict[str, float] = {}
    for word, k, pid, t in marks:
        if word in until and k == kind:
            ended[pid] = min(ended.get(pid, float(t)), float(t))
    return sorted((began[pid], ended[pid]) for pid in ended)


def _one_at_a_time(intervals: list[tuple[float, float]]) -> bool:
    return all(end <= later for (_, end), (later, _) in zip(intervals, intervals[1:]))


def test_fanout_1_asks_and_connects_one_host_at_a_time(ssh_cluster, tmp_path: Path) -> None:
    env, log = _recording_path(ssh_cluster, tmp_path)
    (tmp_path / "show_env.py").write_text(SHOW_ENV)
    write_hostfile(tmp_path, ssh_cluster, slots=1)
    job_dir(ssh_cluster, tmp_path, scripts=())
    args = ["--hostfile", str(tmp_path / "hosts"), "--device", "cpu",
            "--ssh-option", f"-F {ssh_cluster.ssh_config_path}", "--fanout", "1", "--job-id", "fan-1", "--log-dir",
            str(tmp_path / "logs"), "--env", f"BIG={BIG}", str(tmp_path / "show_env.py")]
    result = run_on_node0(ssh_cluster, args, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):  # node 0's copy of each rank's log: every host had the plan whole
        text = ssh_cluster.read_text(ssh_cluster.names[0], tmp_path / "logs" / f"rank_{rank}.log")
        assert text is not None and "BIG 100003 end" in text, (rank, text)
    # A probe runs as its host's ssh control master's first session (launcher.cluster.backends.ssh_mux):
    # it is done when its end marker passes, while that ssh lives on for the agent.
    probes = _intervals(ssh_cluster, log, "probe", "up", "end")
    agents = _intervals(ssh_cluster, log, "agent", "up")
    assert len(probes) == 2 and len(agents) == 2, ssh_cluster.read_text(ssh_cluster.names[0], log)
    assert _one_at_a_time(probes), probes
    assert _one_at_a_time(agents), agents
    assert_no_job_processes(ssh_cluster, "fan-1")


def test_preflight_command_takes_fanout(ssh_cluster, tmp_path: Path) -> None:
    env, log = _recording_path(ssh_cluster, tmp_path)
    write_hostfile(tmp_path, ssh_cluster, slots=1)
    job_dir(ssh_cluster, tmp_path, scripts=())
    result = ssh_cluster.run_on(ssh_cluster.names[0], [
        sys.executable, "-m", "launcher.cli", "preflight", "--hostfile", str(tmp_path / "hosts"),
        "--ssh-option", f"-F {ssh_cluster.ssh_config_path}", "--fanout", "1"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(line.rstrip().endswith("ok") for line in result.stdout.splitlines()[1:])
    probes = _intervals(ssh_cluster, log, "probe", "end")
    assert len(probes) == 2 and _one_at_a_time(probes), probes
