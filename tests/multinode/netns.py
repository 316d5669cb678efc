"""The hosts' network: one network namespace per host, a veth into a bridge, /etc/hosts lines.

Host *i* of cluster ``<tag>`` is the netns ``npl-<tag>-<i>`` (``ip netns``) with ``lo`` up and an
``eth0`` veth whose peer ``nv-<tag>-<i>`` sits in the bridge ``npl-<tag>-br`` of the root
namespace. Each cluster takes its own free ``10.77.<k>.0/24``: the bridge (the root namespace) is
``10.77.<k>.1``, host *i* is ``10.77.<k>.<i+1>``. There is no default route: a host reaches only
its peers and the root namespace.

Names resolve through ``<address> <name>  # npl-cluster <tag>`` lines appended to ``/etc/hosts``
for the cluster's lifetime (``/etc/hosts`` is not one of a host's private directories, so every
host reads the same lines, as from one image).
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path
from typing import Iterable, Optional

from .common import NAME_PREFIX, STATE_ROOT, ClusterError, locked, run_checked

NETNS_DIR = Path("/run/netns")
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARKER = "# npl-cluster"
SUBNET_BASE = "10.77"


@dataclasses.dataclass(frozen=True)
class Host:
    """One fake host: its name is its hostname, its netns name and its ssh alias."""

    name: str
    address: str

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.name


def make_hosts(tag: str, subnet: int, n: int) -> list[Host]:
    """The n hosts of cluster ``tag`` on ``10.77.<subnet>.0/24`` (nothing created yet)."""
    return [Host(f"{NAME_PREFIX}{tag}-{i}", f"{SUBNET_BASE}.{subnet}.{i + 1}") for i in range(1, n + 1)]


def bridge_address(subnet: int) -> str:
    return f"{SUBNET_BASE}.{subnet}.1"


def build_network(tag: str, subnet: int, hosts: Iterable[Host]) -> None:
    """Create the bridge, and per host its netns and veth with the host's address."""
    br = bridge_name(tag)
    _ip("link", "add", br, "type", "bridge")
    _ip("addr", "add", f"{bridge_address(subnet)}/24", "dev", br)
    _ip("link", "set", br, "up")
    for i, h in enumerate(hosts, start=1):
        veth = veth_name(tag, i)
        _ip("netns", "add", h.name)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.name)
        _ip("link", "set", veth, "master", br, "up")
        _ip("-n", h.name, "addr", "add", f"{h.address}/24", "dev", "eth0")
        _ip("-n", h.name, "link", "set", "eth0", "up")
        _ip("-n", h.name, "link", "set", "lo", "up")


def delete_network(tag: str, names: Iterable[str]) -> None:
    """Delete the namespaces ``names`` and the tag's veths and bridge (what is left of them)."""
    for name in sorted(set(names)):
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for link in links_of(tag):
        subprocess.run(["ip", "link", "del", link], capture_output=True)


def free_subnet(recorded: Iterable[int]) -> int:
    """Smallest k whose 10.77.k.0/24 no interface and no recorded cluster uses."""
    res = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    used = {int(m.group(1)) for m in re.finditer(rf"inet {re.escape(SUBNET_BASE)}\.(\d+)\.", res.stdout)}
    used |= set(recorded)
    for k in range(0, 256):
        if k not in used:
            return k
    raise ClusterError(f"no free {SUBNET_BASE}.k.0/24 left")


def edit_hosts_file(tag: str, entries: list[tuple[str, str]]) -> None:
    """Drop this tag's marked lines from /etc/hosts, then append entries (address, name)."""
    marker = f"{HOSTS_MARKER} {tag}"
    with locked(STATE_ROOT / "hosts.lock"):
        lines = HOSTS_FILE.read_text().splitlines(keepends=True) if HOSTS_FILE.exists() else []
        kept = [line for line in lines if not line.rstrip("\n").endswith(marker)]
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        new = kept + [f"{addr} {name}  {marker}\n" for addr, name in entries]
        if new != lines:
            # Written in place, not renamed over: /etc/hosts is often a bind mount in containers.
            with open(HOSTS_FILE, "r+" if HOSTS_FILE.exists() else "w") as f:
                f.seek(0)
                f.write("".join(new))
                f.truncate()


def ns_inode(path: Path, kind: str = "net") -> Optional[int]:
    """Inode of the namespace bound at path, or None if none is (never the root ns's own)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    own = os.stat(f"/proc/self/ns/{kind}")
    if st.st_dev != own.st_dev:  # not an nsfs file: e.g. a netns file whose bind mount is gone
        return None
    return None if st.st_ino == own.st_ino else st.st_ino


def leftover_namespaces(tag: str) -> set[str]:
    """Network namespaces named for hosts of cluster ``tag``."""
    pat = re.compile(rf"^{re.escape(NAME_PREFIX)}{re.escape(tag)}-\d+$")
    return {n for n in _netns_names() if pat.match(n)}


def tags_of_leftover_namespaces() -> set[str]:
    """The cluster tags that some network namespace is named for."""
    pat = re.compile(rf"^{re.escape(NAME_PREFIX)}([a-z0-9]{{1,8}})-\d+$")
    return {m.group(1) for n in _netns_names() if (m := pat.match(n))}


def links_of(tag: str) -> list[str]:
    """The veths and bridge of cluster ``tag`` in the root namespace."""
    res = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    names = [line.split(":")[1].strip().split("@")[0] for line in res.stdout.splitlines()]
    pat = re.compile(rf"^(nv-{re.escape(tag)}-\d+|{re.escape(bridge_name(tag))})$")
    return [n for n in names if pat.match(n)]


def bridge_name(tag: str) -> str:
    return f"{NAME_PREFIX}{tag}-br"


def veth_name(tag: str, i: int) -> str:
    return f"nv-{tag}-{i}"


def _netns_names() -> list[str]:
    return [p.name for p in NETNS_DIR.iterdir()] if NETNS_DIR.is_dir() else []


def _ip(*args: str) -> None:
    run_checked(["ip", *args])
