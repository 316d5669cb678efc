"""Rank-table mode: which rank and device each process gets, as the HCCL table says.

Each node is found in the table by ``--server-id`` or by its addresses; the launch is refused
before anything starts when the table and the launch disagree (this host missing, another card
count, devices this host does not have).
"""
from __future__ import annotations

import dataclasses
import socket
from pathlib import Path
from typing import Mapping, Optional, Sequence

import psutil

from launcher.config.devices import Card, DeviceKind
from launcher.errors import ConfigError
from launcher.limits import shown
from launcher.plan.launch_plan import RankAssignment
from parallel import contract
from rank_tables.ascend import AscendHost, this_host_ip
from rank_tables.generate import GenerateConfig, generate_server
from rank_tables.host_devices import tool_path
from rank_tables.table import RankTable, load_rank_table

AUTO = "auto"
GENERATED_NAME = "rank_table.json"


@dataclasses.dataclass(frozen=True)
class NodeShare:
    """One node's part of the table: its cards (local-rank order) and their assignments."""

    server_id: str
    cards: tuple[Card, ...]
    assignments: tuple[RankAssignment, ...]


def load_or_generate(option: str, cards: Optional[int], environ: Mapping[str, str],
                     server_id: Optional[str]) -> RankTable:
    """``--rank-table FILE`` read and validated, or ``auto``: this host's table generated."""
    if option != AUTO:
        return load_rank_table(option)
    config = GenerateConfig(server_id=server_id or this_host_ip())
    # PATH, then /usr/local/sbin and the driver's tool folder: as the card checks look.
    host = AscendHost(devfs=Path(environ.get(contract.DEVFS, "/dev")), tool_path=tool_path(environ))
    table = generate_server(config, host).table
    if cards is not None:
        devices = table.servers[0].devices[:cards]
        table = dataclasses.replace(table, servers=(dataclasses.replace(
            table.servers[0], devices=devices),))
    return table


def node_share(table: RankTable, candidates: Sequence[str], server_id: Optional[str],
               cards: Optional[int], found: tuple[Card, ...], device: DeviceKind,
               where: str) -> NodeShare:
    """This node's share; ``found`` are the cards the host has (empty on CPU)."""
    sid = server_id or _match_server(table, candidates, where)
    if sid not in table.server_ids():
        raise ConfigError(f"--rank-table: server {shown(sid)} ({where}) is not in the table "
                          f"(servers: {_listing(table.server_ids())})")
    entries = table.ranks_for_server(sid)
    if cards is not None and cards != len(entries):
        raise ConfigError(f"--cards {cards}: the rank table gives server {sid} "
                          f"{len(entries)} device(s)")
    by_physical = {c.physical: c for c in found}
    node_cards = []
    for entry in entries:
        if device is DeviceKind.NPU and entry.device_id not in by_physical:
            raise ConfigError(f"--rank-table: server {sid} device {entry.device_id} is not on "
                              f"{where} (cards: {', '.join(map(str, by_physical)) or 'none'})")
        node_cards.append(by_physical.get(entry.device_id, Card(entry.device_id, entry.device_id)))
    assignments = tuple(RankAssignment(e.rank_id, c.logical) for e, c in zip(entries, node_cards))
    return NodeShare(sid, tuple(node_cards), assignments)


def local_candidates() -> list[str]:
    """Every name and address this host answers to, for finding it in a table."""
    names = [socket.gethostname(), socket.getfqdn()]
    for addresses in psutil.net_if_addrs().values():
        names += [a.address for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
    return names


def _match_server(table: RankTable, candidates: Sequence[str], where: str) -> str:
    matches = [sid for sid in table.server_ids() if sid in candidates]
    if len(matches) != 1:
        found = "is not" if not matches else f"matches {len(matches)} servers"
        raise ConfigError(f"--rank-table: {where} {found} in the table (servers: "
                          f"{_listing(table.server_ids())}); give --server-id")
    return matches[0]


_LISTED = 8


def _listing(server_ids: Sequence[str]) -> str:
    """The first few server ids: a table may hold a thousand."""
    more = len(server_ids) - _LISTED
    return ", ".join(server_ids[:_LISTED]) + (f", ... ({len(server_ids)} in all)" if more > 0 else "")
