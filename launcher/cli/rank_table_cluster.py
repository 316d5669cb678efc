"""A whole cluster's v1.0 rank table from a hostfile, in one step.

Each selected host becomes one server, in hostfile order; its ``server_id`` is the host as the
hostfile writes it (write IPs there: MindSpore practice is an IP as ``server_id``). A host's cards
(slots ``0 .. slots-1``, narrowed by ``--include``/``--exclude``) are taken as physical device ids,
which holds on bare-metal hosts where every device is visible. Device IPs come from
``device_ips_for_host``: for now from an ``hccn.conf`` copied from each host.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping, Optional, Sequence

from launcher.config.hostfile import HostSelection, read_hostfile, select_hosts
from launcher.errors import ConfigError
from launcher.limits import shown
from rank_tables.ascend import read_hccn_conf
from rank_tables.bounded import display_name
from rank_tables.table import DeviceEntry, RankTable, ServerEntry, check_table
from rank_tables.validate import HOST_NIC_RESERVED, MAX_PORT


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Inputs of ``from-hostfile``; ``hccn_confs`` pairs a hostfile host with its ``hccn.conf`` copy."""

    hostfile: Path
    hccn_confs: tuple[tuple[str, Path], ...] = ()
    include: Optional[str] = None
    exclude: Optional[str] = None
    nnodes: Optional[int] = None
    device_port: Optional[int] = None

    def __post_init__(self) -> None:
        hosts = [host for host, _ in self.hccn_confs]
        twice = sorted({h for h in hosts if hosts.count(h) > 1})
        if twice:
            raise ConfigError(f"--hccn-conf: host {shown(twice[0])} is given twice")
        # As generate checks it: else the built table is refused, naming its own key.
        if self.device_port is not None and not 1 <= self.device_port <= MAX_PORT:
            raise ConfigError(f"--device-port {self.device_port}: must be within 1-{MAX_PORT}")


def parse_host_paths(items: Sequence[str]) -> tuple[tuple[str, Path], ...]:
    """``["node1=/path/hccn.conf", ...]`` -> ``(("node1", Path(...)), ...)``."""
    pairs = []
    for item in items:
        host, sep, path = item.partition("=")
        if not sep or not host.strip() or not path:
            raise ConfigError(f"--hccn-conf {shown(item)}: expected HOST=PATH")
        pairs.append((host.strip(), Path(path)))
    return tuple(pairs)


def cluster_table(config: ClusterConfig) -> RankTable:
    """Read the hostfile, select hosts and cards, gather device IPs and build a valid table."""
    entries = read_hostfile(config.hostfile)
    known = {e.host for e in entries}
    strangers = [host for host, _ in config.hccn_confs if host not in known]
    if strangers:
        raise ConfigError(f"--hccn-conf {display_name(strangers[0])}: not a host in {display_name(config.hostfile)}")
    selected = select_hosts(entries, config.include, config.exclude, config.nnodes)
    confs = dict(config.hccn_confs)
    servers, start = [], 0
    for selection in selected:
        servers.append(_server(selection, device_ips_for_host(selection.host, selection.cards, confs), start, config))
        start += len(selection.cards)
    table = RankTable(version="1.0", servers=tuple(servers))
    return check_table(table, f"table from {config.hostfile}")


def device_ips_for_host(host: str, devices: Sequence[int], hccn_confs: Mapping[str, Path]) -> dict[int, str]:
    """The NIC address of each physical device of ``host``.

    The one place to extend when the multi-node transport can run ``hccn_tool`` on ``host``; until
    then the addresses come from a copy of the host's ``/etc/hccn.conf`` given as ``--hccn-conf``.
    """
    if host not in hccn_confs:
        raise ConfigError(f"no device IPs for host {host!r}: pass --hccn-conf {host}=PATH with a copy of its "
                          "/etc/hccn.conf (reading them over ssh is not supported yet)")
    path = hccn_confs[host]
    if not path.exists():
        raise ConfigError(f"--hccn-conf {host}={display_name(path)}: no such file")
    addresses = read_hccn_conf(path)
    missing = [d for d in devices if d not in addresses]
    if missing:
        raise ConfigError(f"{display_name(path)} (host {host!r}) has no address_N for device(s) "
                          f"{','.join(map(str, missing))}")
    return {d: addresses[d] for d in devices}


def _server(selection: HostSelection, ips: Mapping[int, str], start: int, config: ClusterConfig) -> ServerEntry:
    devices = tuple(DeviceEntry(device_id=card, device_ip=ips[card], rank_id=start + i, device_port=config.device_port)
                    for i, card in enumerate(selection.cards))
    return ServerEntry(server_id=selection.host, devices=devices, host_nic_ip=HOST_NIC_RESERVED)
