"""``merge_tables``: property tests over any set of valid per-server tables, and the merge errors."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rank_tables.errors import RankTableError
from rank_tables.merge import merge_tables
from rank_tables.table import DeviceEntry, RankTable, ServerEntry, SuperPod
from rank_tables.validate import validate


@st.composite
def server(draw: st.DrawFn, name: str, subnet: int, version: str) -> ServerEntry:
    """1-16 distinct physical devices in any listing order, with any in-server rank order."""
    device_ids = draw(st.lists(st.integers(0, 15), min_size=1, max_size=16, unique=True))
    ranks = draw(st.permutations(range(len(device_ids))))
    sdid = (lambda d: subnet * 16 + d) if version == "1.2" else (lambda d: None)
    devices = tuple(DeviceEntry(device_id=d, device_ip=f"10.{subnet // 250}.{subnet % 250}.{d + 1}", rank_id=r,
                                super_device_id=sdid(d)) for d, r in zip(device_ids, ranks))
    return ServerEntry(name, devices, host_nic_ip="reserve" if version == "1.0" else None)


@st.composite
def tables(draw: st.DrawFn, min_tables: int = 1) -> list[tuple[str, RankTable]]:
    """1 (or ``min_tables``) to 5 valid tables of one version with distinct servers and device
    IPs; v1.2 ones in 1-3 pods."""
    version = draw(st.sampled_from(["1.0", "1.2"]))
    sizes = draw(st.lists(st.integers(1, 3), min_size=min_tables, max_size=5))
    named, subnet = [], 0
    for index, size in enumerate(sizes):
        servers = []
        for _ in range(size):
            servers.append(draw(server(f"host-{subnet}", subnet, version)))
            subnet += 1
        servers = _renumbered_in_order(servers)
        pods = ()
        if version == "1.2":
            pod = draw(st.sampled_from(["a", "b", "c"]))
            pods = (SuperPod(pod, tuple(s.server_id for s in servers)),)
        named.append((f"table{index}.json", RankTable(version, tuple(servers), pods)))
    return named


def _renumbered_in_order(servers: list[ServerEntry]) -> list[ServerEntry]:
    """Offset each server's ranks so that the input table itself is valid."""
    result, start = [], 0
    for s in servers:
        devices = tuple(dataclasses.replace(d, rank_id=d.rank_id + start) for d in s.devices)
        result.append(dataclasses.replace(s, devices=devices))
        start += len(devices)
    return result


def devices_of(table: RankTable) -> set[tuple[str, int, Any]]:
    return {(s.server_id, d.device_id, d.device_ip) for s in table.servers for d in s.devices}


def expected_server_order(named: list[tuple[str, RankTable]]) -> list[str]:
    servers = [s for _, t in named for s in t.server_ids()]
    if named[0][1].version == "1.0":
        return servers
    pod_order: list[str] = []
    pod_of = {}
    for _, table in named:
        for pod in table.super_pods:
            pod_order += [] if pod.super_pod_id in pod_order else [pod.super_pod_id]
            pod_of.update({s: pod.super_pod_id for s in pod.server_ids})
    return sorted(servers, key=lambda s: pod_order.index(pod_of[s]))


@settings(max_examples=60, deadline=None)
@given(tables())
def test_merging_valid_tables_gives_a_valid_table_ranked_in_server_order(named: list) -> None:
    for _, table in named:
        assert validate(table.to_json()) == []
    merged = merge_tables(named)
    assert validate(merged.to_json()) == []
    assert merged.server_ids() == tuple(expected_server_order(named))
    ranks_in_server_order = [sorted(d.rank_id for d in s.devices) for s in merged.servers]
    assert [r for ranks in ranks_in_server_order for r in ranks] == list(range(merged.rank_count))
    assert devices_of(merged) == set().union(*(devices_of(t) for _, t in named))


@settings(max_examples=40, deadline=None)
@given(tables())
def test_merging_keeps_each_servers_device_order_and_relative_rank_order(named: list) -> None:
    merged = {s.server_id: s for s in merge_tables(named).servers}
    for _, table in named:
        for before in table.servers:
            after = merged[before.server_id]
            assert [d.device_id for d in after.devices] == [d.device_id for d in before.devices]
            assert _rank_order(after) == _rank_order(before)


def _rank_order(s: ServerEntry) -> list[int]:
    return [d.device_id for d in sorted(s.devices, key=lambda d: d.rank_id)]


@settings(max_examples=40, deadline=None)
@given(tables(min_tables=2), st.data())
def test_merge_never_returns_an_invalid_table(named: list, data: st.DataObject) -> None:
    # Reuse a server id or a device IP from another input: merging must refuse, not write a bad table.
    victim = data.draw(st.integers(1, len(named) - 1))
    name, table = named[victim]
    donor = named[0][1].servers[0]
    clash = data.draw(st.sampled_from(["server", "ip"]))
    first = table.servers[0]
    if clash == "server":
        first = dataclasses.replace(first, server_id=donor.server_id)
    else:
        moved = dataclasses.replace(first.devices[0], device_ip=donor.devices[0].device_ip)
        first = dataclasses.replace(first, devices=(moved,) + first.devices[1:])
    pods = tuple(SuperPod(p.super_pod_id, tuple(first.server_id if s == table.servers[0].server_id else s
                                                for s in p.server_ids)) for p in table.super_pods)
    named[victim] = (name, RankTable(table.version, (first,) + table.servers[1:], pods))
    with pytest.raises(RankTableError) as info:
        merge_tables(named)
    if clash == "server":
        assert info.value.message == f"{name}: server {donor.server_id!r} is already in table0.json"
    else:
        assert f"device_ip: {donor.devices[0].device_ip} is already used by server_list[0].device[0]" in \
            info.value.message


def test_merge_writes_string_rank_ids_unlike_merge_hccl() -> None:
    one = RankTable("1.0", (ServerEntry("a", (DeviceEntry(0, "10.0.0.1", 0),)),))
    two = RankTable("1.0", (ServerEntry("b", (DeviceEntry(0, "10.0.0.2", 0),)),))
    doc = merge_tables([("1.json", one), ("2.json", two)]).to_json()
    assert [d["rank_id"] for s in doc["server_list"] for d in s["device"]] == ["0", "1"]
    assert doc["server_count"] == "2"


def test_merge_errors() -> None:
    one = RankTable("1.0", (ServerEntry("a", (DeviceEntry(0, "10.0.0.1", 0),)),))
    other = RankTable("1.2", (ServerEntry("b", (DeviceEntry(0, "10.0.0.2", 0),)),))
    with pytest.raises(RankTableError, match="nothing to merge"):
        merge_tables([])
    with pytest.raises(RankTableError, match="cannot merge tables of different versions: x.json is 1.0, y.json is 1.2"):
        merge_tables([("x.json", one), ("y.json", other)])
