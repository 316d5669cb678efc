"""``RankTable`` and ``load_rank_table``: what the launcher reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import RANK_TABLE_EXAMPLES as EXAMPLES

from parallel.contract import BadInput
from rank_tables.errors import RankTableError
from rank_tables.table import DeviceEntry, RankTable, SuperPod, load_rank_table


def test_loads_a_v1_0_table_with_ints_in_memory() -> None:
    table = load_rank_table(EXAMPLES / "rank_table_2x8_v1.0.json")
    assert table.version == "1.0" and table.status == "completed"
    assert table.rank_count == 16
    assert table.server_ids() == ("10.0.0.11", "10.0.0.12")
    second = table.ranks_for_server("10.0.0.12")
    assert [d.rank_id for d in second] == list(range(8, 16))
    assert second[3] == DeviceEntry(device_id=3, device_ip="192.4.11.6", rank_id=11)


def test_ranks_for_server_are_in_rank_order_whatever_the_listing_order(weird_tmp: Path) -> None:
    doc = json.loads((EXAMPLES / "rank_table_1x8_v1.0.json").read_text(encoding="utf-8"))
    doc["server_list"][0]["device"].reverse()
    path = weird_tmp / "reversed.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    table = load_rank_table(path)
    assert [d.rank_id for d in table.ranks_for_server("10.0.0.11")] == list(range(8))
    assert [d.device_id for d in table.servers[0].devices] == list(range(7, -1, -1))


def test_an_unknown_server_is_an_error_listing_the_known_ones() -> None:
    table = load_rank_table(EXAMPLES / "rank_table_2x8_v1.0.json")
    with pytest.raises(RankTableError, match="server '10.9.9.9' is not in the rank table .*10.0.0.11, 10.0.0.12"):
        table.ranks_for_server("10.9.9.9")


def test_loads_a_v1_2_table_with_super_pods() -> None:
    table = load_rank_table(EXAMPLES / "rank_table_superpod_v1.2.json")
    assert table.super_pods == (SuperPod("0", ("node_0", "node_1")), SuperPod("1", ("node_2", "node_3")))
    device = table.ranks_for_server("node_1")[2]
    assert (device.super_device_id, device.device_port, device.backup_device_ip, device.host_port) == \
        (6, 16666, "192.168.2.9", 16667)
    assert table.servers[1].host_ip == "172.16.0.101"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_writing_gives_back_the_file_byte_for_byte(name: str) -> None:
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    assert load_rank_table(EXAMPLES / name).dumps() == text


def test_keys_from_other_tools_survive_a_round_trip(weird_tmp: Path) -> None:
    doc = json.loads((EXAMPLES / "rank_table_1x8_v1.0.json").read_text(encoding="utf-8"))
    doc["server_list"][0]["container_ip"] = "192.168.149.3"
    doc["server_list"][0]["device"][1]["device_logical_id"] = "1"
    doc["job_id"] = "abc"
    path = weird_tmp / "extra.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert load_rank_table(path).to_json() == doc


def test_to_json_writes_every_value_as_a_string() -> None:
    table = load_rank_table(EXAMPLES / "rank_table_superpod_v1.2.json")

    def leaves(value: object) -> list:
        if isinstance(value, dict):
            return [leaf for v in value.values() for leaf in leaves(v)]
        if isinstance(value, list):
            return [leaf for v in value for leaf in leaves(v)]
        return [value]
    assert {type(leaf) for leaf in leaves(table.to_json())} == {str}


def test_a_missing_file(weird_tmp: Path) -> None:
    with pytest.raises(RankTableError) as info:
        load_rank_table(weird_tmp / "none.json")
    assert info.value.message == f"{weird_tmp / 'none.json'}: cannot read the rank table: No such file or directory"
    assert isinstance(info.value, BadInput)  # the CLI: one line, exit 2


def test_bad_json_names_line_and_column(weird_tmp: Path) -> None:
    path = weird_tmp / "bad.json"
    path.write_text('{\n  "version": "1.0",\n  "server_list": [,]\n}\n', encoding="utf-8")
    with pytest.raises(RankTableError) as info:
        load_rank_table(path)
    assert info.value.message == f"{path}:3:19: not valid JSON: Expecting value"


def test_an_invalid_table_gives_one_line_per_problem_each_starting_with_the_file(weird_tmp: Path) -> None:
    doc = json.loads((EXAMPLES / "rank_table_2x8_v1.0.json").read_text(encoding="utf-8"))
    doc["server_list"][1]["device"][3]["rank_id"] = 11
    doc["server_list"][0]["device"][0]["device_ip"] = "192.1.10"
    path = weird_tmp / "merged by merge_hccl.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(RankTableError) as info:
        load_rank_table(path)
    assert info.value.message == (f'{path}: server_list[1].device[3].rank_id: must be a string ("11"), '
                                  "got the number 11 (and 1 more problem)")
    assert list(info.value.lines) == [
        f'{path}: server_list[1].device[3].rank_id: must be a string ("11"), got the number 11',
        f'{path}: server_list[0].device[0].device_ip: "192.1.10" is not an IPv4 or IPv6 address',
    ]


def test_a_table_built_in_code_can_be_checked_through_its_json() -> None:
    from rank_tables.table import ServerEntry, parse_rank_table
    server = ServerEntry("h", (DeviceEntry(0, "10.0.0.1", 0), DeviceEntry(1, "10.0.0.1", 1)))
    with pytest.raises(RankTableError, match=r"^built: server_list\[0\].device\[1\].device_ip: 10.0.0.1 is already"):
        parse_rank_table(RankTable("1.0", (server,)).to_json(), "built")


def test_with_rank_changes_only_the_rank() -> None:
    import dataclasses
    device = DeviceEntry(3, "10.0.0.3", 7, device_port=1, super_device_id=2, backup_device_ip="10.0.0.4",
                         backup_device_port=5, host_port=6, extra=(("device_logical_id", "3"),))
    assert device.with_rank(9) == dataclasses.replace(device, rank_id=9)
    assert {f.name for f in dataclasses.fields(DeviceEntry)} == {
        "device_id", "device_ip", "rank_id", "device_port", "super_device_id", "backup_device_ip",
        "backup_device_port", "host_port", "extra"}, "a new field must be carried by with_rank and to_json"
