"""sshd in every host, and the ssh client configuration that reaches them.

One ``sshd -D`` per host listens on ``<address>:22`` (key auth, root). The client config
(``Cluster.ssh_config_path``) maps every host name to its address with ``HostName`` and pins
the hosts' keys. Keys and configs live in the cluster's work dir under ``/run/npl-clusters``,
which every host shares (as an image would carry them): a host's ``/tmp`` is its own.

The Python over ssh: every host has the same interpreter at the same path, so a command sent
over ssh names it by its path, ``sys.executable``, as the launcher itself does
(``launcher/cluster/backends/common.py`` ``python_of``). A bare ``python3`` would be whatever the remote
login shell finds first on its ``PATH`` (another interpreter when the tests run in a virtualenv).
sshd gives sessions the creating process's ``PATH`` plus the sbin dirs (``SetEnv``) for the
system tools (``ip``, ``nsenter``, ``srun``), not for Python. Before them comes the host's own
``/tmp/npl-ascend/bin`` (``ascend.py``: where a test puts the fake Ascend driver tools), and
``NPU_LAUNCH_DEVFS`` points at the host's ``/tmp/npl-ascend/dev`` (its fake device nodes); both
are missing, and so change nothing, on a host the test gave no cards.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .common import FAKE_ASCEND_DIR, SSH_BINARIES, need_binaries, run_checked, sbin_path, wait_for_port
from .netns import Host

if TYPE_CHECKING:
    from .cluster import Cluster


def start_ssh(cluster: "Cluster", timeout: float) -> Path:
    """Start one sshd per host and write the client config; returns the config's path."""
    need_binaries(SSH_BINARIES)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    sshdir = cluster.work_subdir("ssh")
    key = sshdir / "id_ed25519"
    _keygen(key)
    authorized = sshdir / "authorized_keys"
    authorized.write_text(key.with_suffix(".pub").read_text())
    known = []
    for h in cluster.hosts:
        hostkey = cluster.work_subdir("hosts", h.name) / "ssh_host_ed25519_key"
        _keygen(hostkey)
        pub = " ".join(hostkey.with_suffix(".pub").read_text().split()[:2])
        known.append(f"{h.name},{h.address} {pub}\n")
        config = write_sshd_config(h, hostkey, authorized)
        cluster.start_daemon("sshd", h.name, ["/usr/sbin/sshd", "-D", "-f", str(config)])
    (sshdir / "known_hosts").write_text("".join(known))
    client_config = write_ssh_config(cluster.hosts, key, sshdir / "known_hosts", sshdir / "config")
    for h in cluster.hosts:
        wait_for_port(h.address, 22, timeout, cluster.daemon_alive_check("sshd", h.name))
    return client_config


def write_sshd_config(h: Host, hostkey: Path, authorized_keys: Path) -> Path:
    """The config of host h's sshd, next to its host key."""
    d = hostkey.parent
    lines = [
        f"ListenAddress {h.address}:22",
        f"HostKey {hostkey}",
        f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin yes",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the key files' directories are not root-only (mkdtemp-style checks)
        "UseDNS no",
        "PrintMotd no",
        "MaxStartups 100:30:200",
        "MaxSessions 100",
        f'SetEnv "PATH={FAKE_ASCEND_DIR}/bin:{sbin_path()}" '
        f'"NPU_LAUNCH_DEVFS={FAKE_ASCEND_DIR}/dev"{_pythonpath()}',
        "Subsystem sftp internal-sftp",
        "LogLevel ERROR",
    ]
    path = d / "sshd_config"
    path.write_text("\n".join(lines) + "\n")
    return path


def _pythonpath() -> str:
    """The tests' ``PYTHONPATH`` for the sessions too, when one is set: the code under test (a
    git worktree, say) is then what every host imports, as hosts of one image would."""
    path = os.environ.get("PYTHONPATH")
    return f' "PYTHONPATH={path}"' if path else ""


def write_ssh_config(hosts: list[Host], key: Path, known_hosts: Path, path: Path) -> Path:
    """The client config: each host name to its address, our key, the hosts' keys pinned."""
    out = [f"Host {h.name}\n  HostName {h.address}\n" for h in hosts]
    out.append("Host *\n" + "".join(f"  {line}\n" for line in [
        "User root", "Port 22", f"IdentityFile {key}", "IdentitiesOnly yes",
        f"UserKnownHostsFile {known_hosts}", "GlobalKnownHostsFile /dev/null",
        "StrictHostKeyChecking yes", "BatchMode yes", "ConnectTimeout 10", "LogLevel ERROR",
    ]))
    path.write_text("".join(out))
    return path


def _keygen(path: Path) -> None:
    run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)])
