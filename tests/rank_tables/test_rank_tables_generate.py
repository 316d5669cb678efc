"""``generate``: device selection (logical vs physical ids), options, and the table it builds."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import ASCEND_FIXTURES as FIXTURES
from helpers import fake_devfs

from rank_tables.ascend import AscendHost
from rank_tables.errors import RankTableError, TableInputError
from rank_tables.generate import GenerateConfig, generate_server, parse_assignments, parse_device_list

TOOLS = str(FIXTURES / "bin")


@pytest.mark.parametrize("text, ids", [
    ("0-7", tuple(range(8))),
    ("0,2,4,6", (0, 2, 4, 6)),
    ("6,4, 2,0", (0, 2, 4, 6)),
    ("[0,8)", tuple(range(8))),
    ("[8,16)", tuple(range(8, 16))),  # hccl_tools.py reads only one digit per bound
    ("[ 4 , 6 )", (4, 5)),
    ("0-3,8-11", (0, 1, 2, 3, 8, 9, 10, 11)),
    ("15", (15,)),
])
def test_device_lists(text: str, ids: tuple) -> None:
    assert parse_device_list(text) == ids


@pytest.mark.parametrize("text, words", [
    ("[3,3)", "names no device"),
    ("7-3", "range 7-3 runs backwards"),
    ("0,1,0", "names a device twice"),
    ("0-3,2", "names a device twice"),
    ("a", "expected ids like 0-7"),
    ("", "expected ids like"),
    ("[0,8]", "expected ids like"),
    ("-1", "expected ids like"),
])
def test_bad_device_lists(text: str, words: str) -> None:
    with pytest.raises(TableInputError, match="^--devices") as info:
        parse_device_list(text)
    assert words in info.value.message


def test_assignments() -> None:
    assert parse_assignments(["3=10.0.0.3", " 1 = 10.0.0.1"], "--device-ip") == ((1, "10.0.0.1"), (3, "10.0.0.3"))
    for bad, words in [("3", "expected N=VALUE"), ("x=1", "expected N=VALUE"), ("3=", "expected N=VALUE")]:
        with pytest.raises(TableInputError, match=words):
            parse_assignments([bad], "--device-ip")
    with pytest.raises(TableInputError, match="device 2 is given twice"):
        parse_assignments(["2=a", "2=b"], "--device-ip")


@pytest.mark.parametrize("kwargs, words", [
    ({"version": "1.1"}, "--format 1.1: must be one of 1.0, 1.2"),
    ({"server_id": ""}, "--server-id '': must be 1 to 64 characters"),
    ({"super_pod_id": "0"}, "--super-pod-id: only for --format 1.2"),
    ({"backup_device_ips": ((0, "10.0.0.1"),), "backup_device_port": 1}, "--backup-device-ip, --backup-device-port"),
    ({"device_port": 0}, "--device-port 0: must be within 1-65535"),
    ({"host_port": 65530}, "--host-port 65530: devices get consecutive host ports"),
])
def test_config_checks_itself(kwargs: dict, words: str) -> None:
    with pytest.raises(TableInputError) as info:
        GenerateConfig(**{"server_id": "10.0.0.1", **kwargs})
    assert words in info.value.message


@pytest.fixture
def host(weird_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> AscendHost:
    """An 8-device host with the fake hccn_tool; device k's NIC has address 192.168.0.(100+k)."""
    devfs = fake_devfs(weird_tmp / "dev", range(8))
    nics = weird_tmp / "nics.conf"
    nics.write_text("".join(f"address_{k}=192.168.0.{100 + k}\n" for k in range(16)), encoding="utf-8")
    monkeypatch.setenv("FAKE_ASCEND_NIC_CONF", str(nics))
    return AscendHost(devfs=devfs, tool_path=TOOLS, hccn_conf=weird_tmp / "absent")


def summary(config: GenerateConfig, host: AscendHost) -> list[tuple[int, str, int]]:
    table = generate_server(config, host).table
    return [(d.device_id, d.device_ip, d.rank_id) for d in table.servers[0].devices]


def test_all_visible_devices_by_default(host: AscendHost) -> None:
    assert summary(GenerateConfig("10.0.0.1"), host) == [(k, f"192.168.0.{100 + k}", k) for k in range(8)]


def test_logical_ids_map_through_visible_devices_and_ips_follow_physical_ids(host: AscendHost) -> None:
    config = GenerateConfig("10.0.0.1", devices=(0, 1), visible_devices=(4, 5, 6, 7))
    # hccl_tools.py would ask hccn_tool for devices 0 and 1 here and pair their IPs with devices 4 and 5.
    assert summary(config, host) == [(4, "192.168.0.104", 0), (5, "192.168.0.105", 1)]
    assert generate_server(config, host).default_filename() == "hccl_2p_01_10.0.0.1.json"


def test_two_digit_devices_and_the_hccl_tools_file_name(host: AscendHost) -> None:
    fake_devfs(host.devfs, range(8, 16))
    generated = generate_server(GenerateConfig("10.0.0.1", devices=parse_device_list("[8,16)")), host)
    assert [d.device_id for d in generated.table.servers[0].devices] == list(range(8, 16))
    assert generated.default_filename() == "hccl_8p_89101112131415_10.0.0.1.json"


@pytest.mark.parametrize("kwargs, words", [
    ({"visible_devices": (6, 7, 8)}, "--visible-devices: no device node for 8 (present: 0,1,2,3,4,5,6,7)"),
    ({"devices": (2, 3), "visible_devices": (4, 5, 6)}, "--devices: logical id(s) 3 out of range, 3 device(s) "
                                                        "visible (4,5,6)"),
    ({"devices": (8,)}, "logical id(s) 8 out of range, 8 device(s) visible"),
])
def test_device_selection_errors(host: AscendHost, kwargs: dict, words: str) -> None:
    with pytest.raises(TableInputError) as info:
        generate_server(GenerateConfig("10.0.0.1", **kwargs), host)
    assert words in info.value.message


def test_a_host_without_device_nodes_needs_visible_devices(host: AscendHost, tmp_path: Path) -> None:
    bare = AscendHost(devfs=tmp_path / "no dev", tool_path=host.tool_path, hccn_conf=host.hccn_conf)
    with pytest.raises(TableInputError, match="no Ascend devices found .* pass --visible-devices"):
        generate_server(GenerateConfig("10.0.0.1"), bare)
    assert [d for d, _, _ in summary(GenerateConfig("10.0.0.1", visible_devices=(2, 3)), bare)] == [2, 3]


def test_duplicate_addresses_on_the_host_make_an_invalid_table_an_error(host: AscendHost, tmp_path: Path) -> None:
    conf = tmp_path / "dup.conf"
    conf.write_text("address_0=10.1.1.1\naddress_1=10.1.1.1\n", encoding="utf-8")
    bare = AscendHost(devfs=host.devfs, tool_path=str(tmp_path), hccn_conf=conf)
    with pytest.raises(RankTableError) as info:
        generate_server(GenerateConfig("10.0.0.1", devices=(0, 1)), bare)
    assert info.value.message == ("generated table for 10.0.0.1: server_list[0].device[1].device_ip: "
                                  "10.1.1.1 is already used by server_list[0].device[0]")


def test_v1_2_by_hand_needs_no_npu_smi(host: AscendHost, tmp_path: Path) -> None:
    config = GenerateConfig("node_1", version="1.2", devices=(0, 1), super_pod_id="pod-a",
                            super_device_ids=((0, "40"), (1, "41")), device_port=16666, host_port=16000)
    bare = AscendHost(devfs=host.devfs, tool_path=str(tmp_path), hccn_conf=FIXTURES / "a3_host" / "hccn.conf")
    table = generate_server(config, bare).table
    assert [(d.super_device_id, d.host_port, d.device_port) for d in table.servers[0].devices] == [
        (40, 16000, 16666), (41, 16001, 16666)]
    assert table.to_json()["super_pod_list"] == [{"super_pod_id": "pod-a", "server_list": [{"server_id": "node_1"}]}]
    assert "host_nic_ip" not in table.to_json()["server_list"][0]


def test_v1_2_refuses_a_server_spread_over_super_pods(host: AscendHost, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "smi"
    smi.mkdir()
    shutil.copy(FIXTURES / "a3_host" / "info-m.txt", smi / "info-m.txt")
    (smi / "spod-info.txt").write_text("0 0 10 3 0\n0 1 11 4 0\n", encoding="utf-8")
    monkeypatch.setenv("FAKE_NPU_SMI_DIR", str(smi))
    with pytest.raises(TableInputError, match=r"npu-smi reports super pod ids \['3', '4'\] for one server"):
        generate_server(GenerateConfig("node_1", version="1.2", devices=(0, 1)), host)
    table = generate_server(GenerateConfig("node_1", version="1.2", devices=(0, 1), super_pod_id="3"), host).table
    assert [d.super_device_id for d in table.servers[0].devices] == [10, 11]
