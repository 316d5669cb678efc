"""Values that reach a shell arrive as data, on every path that starts processes on hosts.

Every launch below runs for real on the fake hosts (cluster.py) from a working directory, with
script arguments, an ``--env`` value and a log directory full of what a shell acts on: ``;``,
``$()``, backticks, both quotes, a newline and leading dashes. The rank script writes what it
received; the test asserts it came byte for byte, and that no ``PWNED`` file appeared where an
injected ``touch PWNED`` would have made one (the remote shells' start directories, the job's
directories, the daemons'). One test per path: ssh (the remote user's shell runs the agent's
command), Slurm's srun, OpenMPI's mpirun (its daemons start over ssh), and preflight (a probe
per host over ssh). The hosts share this machine's file system, so the search covers them too.

Host and user names cannot carry such values: the hostfile parser refuses them
(tests/test_hostfile_bounds.py), and no such host could exist to test against.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, assert_no_job_processes, npu_launch_argv
from launcher.backends import TransportOptions
from launcher.backends.slurm import allocation_hosts
from launcher.devices import DeviceKind
from launcher.errors import ConfigError
from launcher.hostfile import HostSelection, path_shown
from launcher.preflight import run_preflight

pytestmark = [pytest.mark.multinode, pytest.mark.mindspore]

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


def _pwned(tmp_path: Path, *trees: Path) -> list[Path]:
    """Every PWNED file where an injected ``touch PWNED`` would run: the shells' start
    directories (home, /, /tmp), the directories of the launcher, test and daemons, and all of
    the test's and cluster's trees."""
    flat = [Path.home(), Path("/"), Path("/tmp"), Path.cwd(), REPO]
    found = [d / "PWNED" for d in flat if (d / "PWNED").exists()]
    for tree in (tmp_path, *trees):
        found += [p for p in tree.rglob("*") if "PWNED" == p.name]
    return found


@pytest.fixture
def no_pwned(tmp_path: Path):
    """Fails the test if a PWNED file appears (one already there before is not this test's)."""
    before = set(_pwned(tmp_path))
    yield lambda *trees: sorted(set(_pwned(tmp_path, *trees)) - before)


def _job_argv(hostile: Path, tmp_path: Path, job: str, *launcher: str) -> list[str]:
    return npu_launch_argv(*launcher, "--device", "cpu", "--cards", "1", "--job-id", job,
                           "--log-dir", str(hostile / f"logs -x; touch PWNED\n{job}"),
                           "--kill-timeout", "3",
                           "--env", f"QUOTING_VALUE={ENV_VALUE}",
                           "--env", f"QUOTING_OUT={tmp_path / 'seen'}",
                           str(hostile / "show.py"), *INJECTIONS)


def _assert_arrived(tmp_path: Path, hostile: Path, hosts: list[str]) -> None:
    seen = {int(p.stem.split("_")[1]): json.loads(p.read_text())
            for p in (tmp_path / "seen").glob("rank_*.json")}
    assert sorted(seen) == list(range(len(hosts))), seen
    for rank, host in enumerate(hosts):
        assert seen[rank] == {"argv": INJECTIONS, "env": ENV_VALUE, "cwd": str(hostile),
                              "host": host}, seen[rank]


def _hostfile(tmp_path: Path, cluster, user: str = "") -> Path:
    """The cluster's hosts, one slot each; ``user`` logs in to the last (ssh only)."""
    path = tmp_path / "hosts"
    first, last = cluster.names
    path.write_text(f"{first} slots=1\n{user + '@' if user else ''}{last} slots=1\n")
    return path


def _run(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _assert_launched_as_data(argv: list[str], cluster, job: str, tmp_path: Path,
                             hostile_dir: Path, no_pwned) -> None:
    """Run the job from the hostile directory; everything arrived byte for byte on every host,
    no PWNED anywhere, and nothing of the job is left running."""
    _run(argv, hostile_dir, cluster.env)
    _assert_arrived(tmp_path, hostile_dir, cluster.names)
    assert no_pwned(cluster.workdir) == []
    assert_no_job_processes(job)


def test_ssh_passes_directory_arguments_and_env_as_data(ssh_cluster, tmp_path: Path,
                                                        hostile_dir: Path, no_pwned) -> None:
    argv = _job_argv(hostile_dir, tmp_path, "q-ssh", "--hostfile",
                     str(_hostfile(tmp_path, ssh_cluster, user="root")),
                     "--ssh-option", f"-F {ssh_cluster.ssh_config_path}")
    _assert_launched_as_data(argv, ssh_cluster, "q-ssh", tmp_path, hostile_dir, no_pwned)


def test_srun_passes_directory_arguments_and_env_as_data(slurm_cluster, tmp_path: Path,
                                                         hostile_dir: Path, no_pwned) -> None:
    argv = ["salloc", "-N2", "--job-name=npl-quoting",
            *_job_argv(hostile_dir, tmp_path, "q-srun", "--launcher", "slurm")]
    _assert_launched_as_data(argv, slurm_cluster, "q-srun", tmp_path, hostile_dir, no_pwned)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_mpirun_passes_directory_arguments_and_env_as_data(ssh_cluster, tmp_path: Path,
                                                           hostile_dir: Path, no_pwned) -> None:
    subnet = f"{ssh_cluster.bridge_address.rsplit('.', 1)[0]}.0/24"
    mca = (f"--mca plm_rsh_args '-F {ssh_cluster.ssh_config_path}' "
           f"--mca oob_tcp_if_include {subnet} --mca btl_tcp_if_include {subnet}")
    argv = _job_argv(hostile_dir, tmp_path, "q-mpi", "--launcher", "mpi",
                     "--hostfile", str(_hostfile(tmp_path, ssh_cluster)), "--launcher-args", mca,
                     "--ssh-option", f"-F {ssh_cluster.ssh_config_path}")
    _assert_launched_as_data(argv, ssh_cluster, "q-mpi", tmp_path, hostile_dir, no_pwned)


def test_preflight_probes_from_a_hostile_directory_as_data(ssh_cluster, tmp_path: Path,
                                                           hostile_dir: Path, no_pwned) -> None:
    hostfile = _hostfile(tmp_path, ssh_cluster, user="root")
    result = _run(npu_launch_argv("preflight", "--hostfile", str(hostfile),
                                  "--ssh-option", f"-F {ssh_cluster.ssh_config_path}"),
                  hostile_dir, ssh_cluster.env)
    rows = result.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ssh_cluster.names, result.stdout
    assert all(row.rstrip().endswith("ok") for row in rows), result.stdout
    assert no_pwned(ssh_cluster.workdir) == []


def test_preflight_names_a_working_directory_missing_on_a_host(ssh_cluster,
                                                               hostile_dir: Path) -> None:
    """The remote ``cd`` fails: preflight says so, instead of blaming the Python."""
    gone = str(hostile_dir / "gone; touch PWNED")
    hosts = [HostSelection(name, None, (0,)) for name in ssh_cluster.names]
    options = TransportOptions(None, (f"-F {ssh_cluster.ssh_config_path}",))
    checks = run_preflight(hosts, options, gone, DeviceKind.CPU, None)
    assert [c.problems for c in checks] == [(f"no directory {path_shown(gone)} there",)] * 2


@pytest.mark.parametrize("nodelist", ["-oProxyCommand=x", "node`touch PWNED`", "n$(id)[1-2]",
                                      "a" * 300, "n[1-1025]"])
def test_allocation_node_names_are_held_to_the_hostfile_rules(slurm_cluster,
                                                              nodelist: str) -> None:
    """Slurm's node names reach srun's command line and log paths, as hostfile names do."""
    with pytest.raises(ConfigError) as info:
        allocation_hosts({**slurm_cluster.env, "SLURM_JOB_NODELIST": nodelist})
    assert info.value.message.startswith("--launcher slurm: ")
    assert "scontrol" not in info.value.message, "scontrol itself must not be confused"
    assert "\n" not in info.value.message and len(info.value.message) < 400
