"""Reading an Ascend host: device nodes, hccn_tool, hccn.conf and npu-smi (fakes in tests/fixtures/ascend)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helpers import ASCEND_FIXTURES, fake_devfs

from rank_tables.ascend import (
    AscendHost,
    DeviceIp,
    SuperPodInfo,
    parse_chip_map,
    parse_hccn_conf,
    parse_hccn_tool_ip,
    parse_spod_info,
    this_host_ip,
)
from rank_tables.errors import TableInputError

TOOLS = str(ASCEND_FIXTURES / "bin")
A2_CONF = ASCEND_FIXTURES / "a2_host" / "hccn.conf"


@pytest.fixture
def devfs(weird_tmp: Path) -> Path:
    """Device nodes of a 16-device host as plain files, beside the driver's other nodes."""
    path = fake_devfs(weird_tmp / "dev", range(16))
    (path / "davinci").touch()  # no number: not a device either
    return path


@pytest.fixture
def fake_nics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ASCEND_NIC_CONF", str(A2_CONF))
    monkeypatch.setenv("FAKE_NPU_SMI_DIR", str(ASCEND_FIXTURES / "a3_host"))


def test_devices_are_the_davinci_nodes_in_numeric_order(devfs: Path) -> None:
    assert AscendHost(devfs=devfs).devices() == tuple(range(16))


def test_no_devfs_means_no_devices(tmp_path: Path) -> None:
    assert AscendHost(devfs=tmp_path / "absent").devices() == ()


def test_parse_hccn_tool_output() -> None:
    assert parse_hccn_tool_ip("ipaddr:192.98.92.100\nnetmask:255.255.255.0\n") == "192.98.92.100"
    assert parse_hccn_tool_ip("netmask:255.255.255.0\n") is None
    assert parse_hccn_tool_ip("") is None


def test_parse_hccn_conf_reads_only_addresses() -> None:
    addresses = parse_hccn_conf(A2_CONF.read_text(encoding="utf-8"))
    assert addresses == {d: f"192.{d % 4 + 1}.10.{6 + d // 4}" for d in range(8)}
    assert parse_hccn_conf("# c\naddress_12 = 10.0.0.1\nnetmask_12=255.0.0.0\n") == {12: "10.0.0.1"}


def test_device_ips_come_from_hccn_tool_when_it_is_on_the_tool_path(fake_nics: None, tmp_path: Path) -> None:
    host = AscendHost(tool_path=TOOLS, hccn_conf=tmp_path / "no hccn.conf")
    assert host.device_ips([0, 5], {}) == {0: DeviceIp("192.1.10.6", "hccn_tool"), 5: DeviceIp("192.2.10.7", "hccn_tool")}


def test_device_ips_fall_back_to_hccn_conf_per_device(fake_nics: None, tmp_path: Path) -> None:
    conf = tmp_path / "hccn.conf"
    conf.write_text("address_9=10.1.1.9\nnetmask_9=255.255.0.0\n", encoding="utf-8")
    found = AscendHost(tool_path=TOOLS, hccn_conf=conf).device_ips([7, 9], {})
    assert found == {7: DeviceIp("192.4.10.7", "hccn_tool"), 9: DeviceIp("10.1.1.9", str(conf))}


def test_device_ips_without_hccn_tool_come_from_hccn_conf(tmp_path: Path) -> None:
    host = AscendHost(tool_path=str(tmp_path), hccn_conf=A2_CONF)
    assert host.device_ips([1], {}) == {1: DeviceIp("192.2.10.6", str(A2_CONF))}


def test_device_ips_given_by_hand_win(fake_nics: None) -> None:
    host = AscendHost(tool_path=TOOLS, hccn_conf=A2_CONF)
    assert host.device_ips([0, 1], {1: "10.9.9.9", 4: "10.9.9.4"}) == {
        0: DeviceIp("192.1.10.6", "hccn_tool"), 1: DeviceIp("10.9.9.9", "--device-ip")}


def test_devices_without_any_address_are_named(fake_nics: None, tmp_path: Path) -> None:
    with pytest.raises(TableInputError) as info:
        AscendHost(tool_path=TOOLS, hccn_conf=tmp_path / "none").device_ips([3, 8, 11], {})
    message = info.value.message
    assert message.startswith("no device IP for device(s) 8,11: hccn_tool gave no 'ipaddr:'")
    assert "pass --device-ip N=IP" in message
    with pytest.raises(TableInputError, match="no hccn_tool on the tool path"):
        AscendHost(tool_path=str(tmp_path), hccn_conf=tmp_path / "none").device_ips([0], {})


A2_CHIP_MAP = ("\tNPU ID                         Chip ID                        Chip Logic ID                  "
               "Chip Name                     \n"
               "\t0                              0                              0                              "
               "Ascend 910B3\n")


def test_parse_chip_map_skips_mcu_rows_and_needs_the_phy_id_column() -> None:
    chips = parse_chip_map((ASCEND_FIXTURES / "a3_host" / "info-m.txt").read_text(encoding="utf-8"))
    assert chips == {npu * 2 + chip: (npu, chip) for npu in range(8) for chip in range(2)}
    with pytest.raises(TableInputError, match="no 'Chip Phy-ID' column"):
        parse_chip_map(A2_CHIP_MAP)
    with pytest.raises(TableInputError, match="no 'NPU ID' header"):
        parse_chip_map("dcmi model initialized failed\n")


def test_parse_spod_info() -> None:
    text = "SDID                           : 16777216\nSuper Pod Size                 : 384\n" \
           "Super Pod ID                   : 0\nServer Index                   : 4\n"
    assert parse_spod_info(text) == SuperPodInfo(16777216, "0")
    with pytest.raises(TableInputError, match="no SDID"):
        parse_spod_info("Super Pod ID : 0\n")


def test_super_pod_info_asks_npu_smi_per_chip(fake_nics: None) -> None:
    info = AscendHost(tool_path=TOOLS).super_pod_info([0, 3, 15])
    assert info == {0: SuperPodInfo(100663296, "7"), 3: SuperPodInfo(100663296 + 3 * 65536, "7"),
                    15: SuperPodInfo(100663296 + 15 * 65536, "7")}


def test_super_pod_info_errors(fake_nics: None, tmp_path: Path) -> None:
    with pytest.raises(TableInputError, match="no npu-smi on the tool path"):
        AscendHost(tool_path=str(tmp_path)).super_pod_info([0])
    with pytest.raises(TableInputError, match="lists no chip with Chip Phy-ID 16"):
        AscendHost(tool_path=TOOLS).super_pod_info([16])


def test_this_host_ip_is_the_address_its_name_resolves_to(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "192.0.2.7")  # resolves to itself, no DNS
    assert this_host_ip() == "192.0.2.7"


def test_a_name_resolving_only_to_loopback_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    with pytest.raises(TableInputError, match="^this host's name 'localhost' resolves only to loopback; "
                                          "pass --server-id$"):
        this_host_ip()


def test_a_name_that_does_not_resolve_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "npl-nowhere.invalid")
    with pytest.raises(TableInputError, match="^cannot resolve this host's name to an IP .*; pass --server-id$"):
        this_host_ip()
