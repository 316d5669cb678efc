"""Merge per-server rank tables into one cluster table (what ``merge_hccl.py`` does, checked).

Servers keep argument order and ranks are renumbered so that rank order follows server order;
within a server the devices keep their relative rank order. v1.2 tables are grouped by super pod
(pods in order of first appearance), because HCCL wants a pod's servers listed together. Unlike
``merge_hccl.py``, every value stays a string, a server named twice is an error, and the result
is validated before it is returned.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from rank_tables.errors import RankTableError
from rank_tables.table import RankTable, ServerEntry, SuperPod, check_table

NamedTable = tuple[str, RankTable]


def merge_tables(tables: Sequence[NamedTable]) -> RankTable:
    """One valid table from ``(file name, table)`` pairs; ``RankTableError`` names the culprit."""
    if not tables:
        raise RankTableError("nothing to merge: give at least one rank table")
    version = _common_version(tables)
    _check_unique_servers(tables)
    servers = [server for _, table in tables for server in table.servers]
    pods = _merged_pods([table for _, table in tables])
    if pods:
        servers = _grouped_by_pod(servers, pods)
    merged = RankTable(version=version, servers=tuple(renumbered(servers)), super_pods=pods)
    return check_table(merged, f"merged table of {', '.join(name for name, _ in tables)}")


def renumbered(servers: Sequence[ServerEntry]) -> list[ServerEntry]:
    """The servers with ranks 0..N-1 assigned in server order, devices keeping their order."""
    result, start = [], 0
    for server in servers:
        order = sorted(range(len(server.devices)), key=lambda i: server.devices[i].rank_id)
        new_rank = {index: start + position for position, index in enumerate(order)}
        devices = tuple(d.with_rank(new_rank[i]) for i, d in enumerate(server.devices))
        result.append(dataclasses.replace(server, devices=devices))
        start += len(devices)
    return result


def _common_version(tables: Sequence[NamedTable]) -> str:
    versions = {table.version for _, table in tables}
    if len(versions) > 1:
        listing = ", ".join(f"{name} is {table.version}" for name, table in tables)
        raise RankTableError(f"cannot merge tables of different versions: {listing}")
    return versions.pop()


def _check_unique_servers(tables: Sequence[NamedTable]) -> None:
    first: dict[str, str] = {}
    for name, table in tables:
        for server_id in table.server_ids():
            if server_id in first:
                raise RankTableError(f"{name}: server {server_id!r} is already in {first[server_id]}")
            first[server_id] = name


def _merged_pods(tables: Sequence[RankTable]) -> tuple[SuperPod, ...]:
    members: dict[str, list[str]] = {}
    for table in tables:
        for pod in table.super_pods:
            members.setdefault(pod.super_pod_id, []).extend(pod.server_ids)
    return tuple(SuperPod(pod_id, tuple(ids)) for pod_id, ids in members.items())


def _grouped_by_pod(servers: Sequence[ServerEntry], pods: tuple[SuperPod, ...]) -> list[ServerEntry]:
    pod_of = {server_id: index for index, pod in enumerate(pods) for server_id in pod.server_ids}
    # A stable sort keeps argument order inside each pod; servers in no pod go last (and fail validation).
    return sorted(servers, key=lambda s: pod_of.get(s.server_id, len(pods)))
