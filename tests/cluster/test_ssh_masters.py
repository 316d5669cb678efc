"""``launcher.cluster.backends.ssh_mux`` without a host to reach: a master that cannot connect says why
and leaves nothing; ``ssh_argv`` rides on a master once there is one. (Masters that connect:
``tests/multinode/test_ssh_masters_hosts.py``.)"""
from __future__ import annotations

import glob
import os
import sys
import tempfile

from launcher.cluster.backends import TransportOptions
from launcher.cluster.backends.ssh import ssh_argv
from launcher.cluster.backends.ssh_mux import SshMasters

NO_NETWORK = ("-o ProxyCommand=false",)  # ssh fails at once, no DNS or TCP involved


def _ours() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "npl-ssh-*")))


def test_a_master_that_cannot_connect_says_why_and_leaves_nothing() -> None:
    before = _ours()
    masters = SshMasters()
    first = masters.open("node1", "me", 2222, NO_NETWORK, "true", timeout=60)
    assert first is not None and first.returncode == 255, first
    assert first.stderr.strip().splitlines()[-1] == "Connection closed by UNKNOWN port 65535"
    path = masters.path_for("node1", "me", 2222)
    assert path is not None and not os.path.exists(path)
    assert masters.open("node1", "me", 2222, NO_NETWORK, "true", 60) is None, "one per host"
    masters.close()
    masters.close()  # idempotent
    assert _ours() == before
    assert masters.open("node2", "me", 2222, NO_NETWORK, "true", 60) is None, "ending"


def test_ssh_argv_rides_on_the_hosts_master_when_there_is_one() -> None:
    with SshMasters() as masters:
        options = TransportOptions(ssh_port=2222, ssh_options=("-F 'my config'",),
                                   masters=masters)
        plain = ssh_argv("node1", None, ["true"], "/w", options)
        assert "ControlPath" not in " ".join(plain)
        masters.open("node1", None, 2222, NO_NETWORK, "true", timeout=60)
        argv = ssh_argv("node1", None, ["true"], "/w", options)
        path = masters.path_for("node1", None, 2222)
        assert argv[:9] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                            "ControlMaster=no", "-o", f"ControlPath={path}"]
        assert argv[9:13] == ["-p", "2222", "-F", "my config"]
        other = ssh_argv("node2", None, ["true"], "/w", options)
        assert "ControlPath" not in " ".join(other), "only a host with a master rides on one"


LAGGING_SSH = """#!{python}
# A stand-in for ssh whose stderr lags its stdout, as the two channels of a real session may:
# it runs the remote command line (its last argument) here, passing stdout and stdin through
# and stderr on only after half a second (but for a line of its own, at once, as ssh's warnings).
import subprocess, sys, threading, time
sys.stderr.write("Warning: a line of ssh's own\\n")
sys.stderr.flush()
child = subprocess.Popen(["sh", "-c", sys.argv[-1]], stderr=subprocess.PIPE)
def late() -> None:
    for line in child.stderr:
        time.sleep(0.5)
        sys.stderr.buffer.write(line)
        sys.stderr.flush()
threading.Thread(target=late).start()
sys.exit(child.wait())
"""


def test_the_first_sessions_stderr_is_read_to_its_end_though_it_lags_its_stdout(
        tmp_path, monkeypatch) -> None:
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(LAGGING_SSH.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with SshMasters() as masters:
        first = masters.open("node1", None, None, (), "cd -- /no/such/dir && true", timeout=30)
    assert first is not None and first.returncode != 0 and first.stdout == "", first
    assert "/no/such/dir" in first.stderr and "npl-first-session-exit" not in first.stderr, first
    assert first.stderr.startswith("Warning: a line of ssh's own\n"), \
        "what ssh said first is not overwritten by what came later"
