"""Values that reach a shell arrive as data, on every path that starts processes on hosts.

Every launch below runs for real on the fake hosts (cluster.py), started inside the first host
from a working directory, with script arguments, an ``--env`` value and a log directory full of
what a shell acts on: ``;``, ``$()``, backticks, both quotes, a newline and leading dashes. The
test's directory is copied to every host first (each host's ``/tmp`` is its own). The rank
script writes what it received on its own host; the test collects it from each host and asserts
it came byte for byte, and that no ``PWNED`` file appeared where an injected ``touch PWNED``
would have made one: in each host's own filesystem (its shells' start directories, all of its
``/tmp``, the job's directories), searched from inside the host, and in the root namespace's
(where munged and slurmctld run). One test per path: ssh (the remote user's shell runs the
agent's command), Slurm's srun, OpenMPI's mpirun (its daemons start over ssh), and preflight
(a probe per host over ssh).

Host and user names cannot carry such values: the hostfile parser refuses them
(tests/config/test_hostfile_bounds.py), and no such host could exist to test against.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO

from launcher.config.hostfile import path_shown

from .cluster import Cluster
from .jobs import assert_no_job_processes, mpi_launcher_args, run_on_node0, run_python_on, write_hostfile

pytestmark = pytest.mark.multinode  # plain-Python ranks: no MindSpore anywhere

INJECTIONS = ["; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "'; touch PWNED; '",
              "\"; touch PWNED; \"", "line one\ntouch PWNED", "-rf", "--help", "-", "",
              "  spaced  ", "\\$(touch PWNED)", "*", "~", "$HOME", "a|b&c>PWNED<d", "#", "%h %r"]
"""Script arguments: each would create PWNED (or change the command) if a shell saw it bare."""
ENV_VALUE = "; touch PWNED $(touch PWNED) `touch PWNED` 'sq' \"dq\"\nsecond line -x"

SHOW = """\
import json, os, socket, sys
rank = os.environ["RANK_ID"]
seen = {"argv": sys.argv[1:], "env": os.environ.get("QUOTING_VALUE"), "cwd": os.getcwd(),
        "host": socket.gethostname()}
with open(os.path.join(os.environ["QUOTING_OUT"], f"rank_{rank}.json"), "w") as f:
    json.dump(seen, f)
"""


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    """A working directory whose path is an injection in every way a path component can be."""
    path = (tmp_path / "-dash; touch PWNED" /
            "$(touch PWNED) `touch PWNED` 'sq' \"dq\"\nnewline; touch PWNED")
    path.mkdir(parents=True)
    (path / "show.py").write_text(SHOW)
    (tmp_path / "seen").mkdir()
    return path


def _pwned(cluster: Cluster, tmp_path: Path) -> set[tuple[str, str]]:
    """``(where, path)`` of every PWNED file where an injected ``touch PWNED`` would run.

    On each host, searched from inside it: the shells' start directories (home, /), the
    repository, all of the host's own /tmp (the test's directories are there) and the cluster's
    work dir. In the root namespace: the same flat directories, the test's tree and the work dir.
    """
    flat = [str(Path.home()), "/", str(REPO)]
    trees = ["/tmp", str(tmp_path), str(cluster.workdir)]
    found = set()
    for host in cluster.names:
        answer = cluster.probe(host, "find", "PWNED", json.dumps(trees), json.dumps(flat))
        assert answer["missing"] == [], f"{host} has no {answer['missing']}: the search saw nothing"
        found |= {(host, p) for p in answer["found"]}
    local = [Path(d) / "PWNED" for d in (*flat, "/tmp", Path.cwd()) if (Path(d) / "PWNED").exists()]
    local += [p for tree in (tmp_path, cluster.workdir) for p in tree.rglob("PWNED")]
    return found | {("root namespace", str(p)) for p in local}


def _put_test_dir(cluster: Cluster, tmp_path: Path) -> None:
    """The test's directory (working directory, hostfile, ``seen``) on every host."""
    cluster.put(tmp_path)


def _job_args(hostile: Path, tmp_path: Path, job: str, *launcher: str) -> list[str]:
    return [*launcher, "--device", "cpu", "--cards", "1", "--job-id", job,
            "--log-dir", str(hostile / f"logs -x; touch PWNED\n{job}"),
            "--kill-timeout", "3",
            "--env", f"QUOTING_VALUE={ENV_VALUE}",
            "--env", f"QUOTING_OUT={tmp_path / 'seen'}",
            str(hostile / "show.py"), *INJECTIONS]


def _assert_arrived(cluster: Cluster, tmp_path: Path, hostile: Path) -> None:
    """Each rank's record, read where it ran: rank i on host i (one slot per host)."""
    seen = {}
    for host in cluster.names:
        local = tmp_path / f"seen-on-{host}"
        assert cluster.fetch(host, tmp_path / "seen", local), f"{host} has no {tmp_path / 'seen'}"
        seen |= {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in local.glob("rank_*.json")}
    assert sorted(seen) == list(range(len(cluster.names))), seen
    for rank, host in enumerate(cluster.names):
        assert seen[rank] == {"argv": INJECTIONS, "env": ENV_VALUE, "cwd": str(hostile),
                              "host": host}, seen[rank]


def _hostfile(tmp_path: Path, cluster: Cluster, user: str = "") -> Path:
    """The cluster's hosts, one slot each; ``user`` logs in to the last (ssh only)."""
    return write_hostfile(tmp_path, cluster, slots=1, user_on_last=user)


def _run(cluster: Cluster, args: list[str], cwd: Path, prefix: tuple[str, ...] = ()
         ) -> subprocess.CompletedProcess:
    result = run_on_node0(cluster, args, cwd=cwd, prefix=prefix)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _assert_launched_as_data(cluster: Cluster, args: list[str], job: str, tmp_path: Path,
                             hostile_dir: Path, prefix: tuple[str, ...] = ()) -> None:
    """Put the test's directory on every host, run the job from the hostile directory on the
    first; everything arrived byte for byte on every host, no PWNED anywhere, and nothing of
    the job is left running on any host."""
    _put_test_dir(cluster, tmp_path)
    before = _pwned(cluster, tmp_path)
    _run(cluster, args, hostile_dir, prefix)
    _assert_arrived(cluster, tmp_path, hostile_dir)
    assert sorted(_pwned(cluster, tmp_path) - before) == []
    assert_no_job_processes(cluster, job)


def test_the_pwned_search_looks_inside_every_host(ssh_cluster, tmp_path: Path) -> None:
    """The search the tests below rely on finds a PWNED file that only one host has."""
    _put_test_dir(ssh_cluster, tmp_path)
    before = _pwned(ssh_cluster, tmp_path)
    a, b = ssh_cluster.names
    planted = {(b, str(tmp_path / "PWNED")), (a, "/tmp/PWNED")}
    for host, path in planted:
        ssh_cluster.run_on(host, ["touch", path], check=True)
    try:
        assert _pwned(ssh_cluster, tmp_path) - before == planted
    finally:
        for host, path in planted:
            ssh_cluster.run_on(host, ["rm", "-f", path], check=True)
    assert _pwned(ssh_cluster, tmp_path) == before


def test_ssh_passes_directory_arguments_and_env_as_data(ssh_cluster, tmp_path: Path,
                                                        hostile_dir: Path) -> None:
    args = _job_args(hostile_dir, tmp_path, "q-ssh", "--hostfile",
                     str(_hostfile(tmp_path, ssh_cluster, user="root")),
                     "--ssh-option", f"-F {ssh_cluster.ssh_config_path}")
    _assert_launched_as_data(ssh_cluster, args, "q-ssh", tmp_path, hostile_dir)


def test_srun_passes_directory_arguments_and_env_as_data(slurm_cluster, tmp_path: Path,
                                                         hostile_dir: Path) -> None:
    args = _job_args(hostile_dir, tmp_path, "q-srun", "--launcher", "slurm")
    _assert_launched_as_data(slurm_cluster, args, "q-srun", tmp_path, hostile_dir,
                             prefix=("salloc", "-N2", "--job-name=npl-quoting"))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_mpirun_passes_directory_arguments_and_env_as_data(ssh_cluster, tmp_path: Path,
                                                           hostile_dir: Path) -> None:
    args = _job_args(hostile_dir, tmp_path, "q-mpi", "--launcher", "mpi",
                     "--hostfile", str(_hostfile(tmp_path, ssh_cluster)),
                     "--launcher-args", mpi_launcher_args(ssh_cluster),
                     "--ssh-option", f"-F {ssh_cluster.ssh_config_path}")
    _assert_launched_as_data(ssh_cluster, args, "q-mpi", tmp_path, hostile_dir)


def test_preflight_probes_from_a_hostile_directory_as_data(ssh_cluster, tmp_path: Path,
                                                           hostile_dir: Path) -> None:
    hostfile = _hostfile(tmp_path, ssh_cluster, user="root")
    _put_test_dir(ssh_cluster, tmp_path)
    before = _pwned(ssh_cluster, tmp_path)
    result = _run(ssh_cluster, ["preflight", "--hostfile", str(hostfile),
                                "--ssh-option", f"-F {ssh_cluster.ssh_config_path}"], hostile_dir)
    rows = result.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ssh_cluster.names, result.stdout
    assert all(row.rstrip().endswith("ok") for row in rows), result.stdout
    assert sorted(_pwned(ssh_cluster, tmp_path) - before) == []


_PREFLIGHT = """
import json, sys
from launcher.cluster.backends import TransportOptions
from launcher.config.devices import DeviceKind
from launcher.config.hostfile import HostSelection
from launcher.cluster.preflight import run_preflight
names, config, workdir = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
hosts = [HostSelection(name, None, (0,)) for name in names]
checks = run_preflight(hosts, TransportOptions(None, (f"-F {config}",)), workdir, DeviceKind.CPU, None)
print(json.dumps([list(c.problems) for c in checks]))
"""


def test_preflight_names_a_working_directory_missing_on_a_host(ssh_cluster,
                                                               hostile_dir: Path) -> None:
    """The remote ``cd`` fails: preflight (run on the first host) says so, instead of blaming
    the Python."""
    gone = str(hostile_dir / "gone; touch PWNED")
    res = run_python_on(ssh_cluster, ssh_cluster.names[0], _PREFLIGHT,
                        json.dumps(ssh_cluster.names), str(ssh_cluster.ssh_config_path), gone)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout) == [[f"no directory {path_shown(gone)} there"]] * 2


_ALLOCATION = """
import sys
from launcher.cluster.backends.slurm import allocation_hosts
from launcher.errors import ConfigError
import os
try:
    allocation_hosts({**os.environ, "SLURM_JOB_NODELIST": sys.argv[1]})
except ConfigError as e:
    sys.stdout.write(e.message)
else:
    sys.exit("no ConfigError")
"""


@pytest.mark.parametrize("nodelist", ["-oProxyCommand=x", "node`touch PWNED`", "n$(id)[1-2]",
                                      "a" * 300, "n[1-1025]"])
def test_allocation_node_names_are_held_to_the_hostfile_rules(slurm_cluster,
                                                              nodelist: str) -> None:
    """Slurm's node names reach srun's command line and log paths, as hostfile names do.
    Checked where the launcher runs, on the first host, with its scontrol."""
    res = run_python_on(slurm_cluster, slurm_cluster.names[0], _ALLOCATION, nodelist)
    assert res.returncode == 0, res.stderr[-3000:]
    message = res.stdout
    assert message.startswith("--launcher slurm: ")
    assert "scontrol" not in message, "scontrol itself must not be confused"
    assert "\n" not in message and len(message) < 400
