"""Files on the hosts' own filesystems: put a job's directory on them, read back what a job left.

A host's ``/tmp`` (and so every launch and log directory the tests use) is its own
(``hostns.py``): nothing the test writes in its own ``tmp_path`` is on any host until it is
copied there, as a user would with rsync or a container image. ``put_tree`` copies a directory
to the same path on each host (through ``tar``, run inside the host); ``fetch_tree`` brings one
back into a local directory; ``read_text`` and ``exists`` look at one file as the host sees it.
"""
from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

from .common import ClusterError
from .hostns import PRIVATE_DIRS

if TYPE_CHECKING:
    from .cluster import Cluster


def put_tree(cluster: "Cluster", path: Path, hosts: Optional[Iterable[str]] = None) -> None:
    """Copy the directory tree at ``path`` to the same path on each host (default: all).

    Files there already are overwritten, others kept (``rsync`` without ``--delete``)."""
    if not any(path.is_relative_to(d) for d in PRIVATE_DIRS):
        # Elsewhere the hosts share the root namespace's files: a copy would be the original,
        # and a test "on separate hosts" would quietly run on shared storage.
        raise ClusterError(f"put_tree: {path} is not in a host's own directories {PRIVATE_DIRS}")
    archive = _tar_of(path)
    for host in hosts if hosts is not None else cluster.names:
        _host_run(cluster, host, ["mkdir", "-p", "--", str(path)])
        _host_run(cluster, host, ["tar", "-C", str(path), "-xf", "-"], stdin=archive)


def fetch_tree(cluster: "Cluster", host: str, path: Path, dest: Path) -> bool:
    """Copy the host's tree at ``path`` into ``dest`` (made if needed); False if the host has
    no such directory."""
    if not exists(cluster, host, path):
        return False
    res = _host_run(cluster, host, ["tar", "-C", str(path), "-cf", "-", "."])
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
        tar.extractall(dest, filter="tar")
    return True


def read_text(cluster: "Cluster", host: str, path: Path) -> Optional[str]:
    """The file's text as the host sees it, or None if the host has no such file."""
    res = cluster.run_on(host, ["cat", "--", str(path)], text=False)
    return res.stdout.decode(errors="replace") if res.returncode == 0 else None


def exists(cluster: "Cluster", host: str, path: Path) -> bool:
    """The host has something at ``path``."""
    return cluster.run_on(host, ["test", "-e", str(path)]).returncode == 0


def _tar_of(path: Path) -> bytes:
    if not path.is_dir():
        raise ClusterError(f"put_tree: {path} is not a directory")
    res = subprocess.run(["tar", "-C", str(path), "-cf", "-", "."], capture_output=True)
    if res.returncode != 0:
        raise ClusterError(f"tar of {path} failed: {res.stderr.decode(errors='replace')}")
    return res.stdout


def _host_run(cluster: "Cluster", host: str, argv: list[str],
              stdin: Optional[bytes] = None) -> subprocess.CompletedProcess:
    res = cluster.run_on(host, argv, input=stdin, text=False)
    if res.returncode != 0:
        raise ClusterError(f"{argv[0]} on {host} failed ({res.returncode}): "
                           f"{res.stderr.decode(errors='replace')[-2000:]}")
    return res
