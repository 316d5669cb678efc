"""Golden files for the tables ``generate``, ``merge`` and ``from-hostfile`` write.

Each test runs the real command against fake Ascend hosts (``tests/fixtures/ascend``) and compares
the file it wrote, byte for byte, with ``tests/golden/<name>``. After an intended change, refresh
them with ``NPU_LAUNCH_UPDATE_GOLDEN=1 python -m pytest tests/rank_tables/test_rank_tables_golden.py`` and
review the diff (a refreshing run compares nothing, so it reports each test as skipped).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from click.testing import CliRunner, Result
from helpers import ASCEND_FIXTURES as FIXTURES
from helpers import GOLDEN, RANK_TABLE_EXAMPLES, fake_ascend_env
from helpers import assert_golden as golden

from launcher.cli.rank_table import rank_table
from rank_tables.validate import validate


def assert_golden(name: str, text: str) -> None:
    """``text`` must equal ``tests/golden/<name>``."""
    golden(GOLDEN / name, text, name)


def run(args: list[str], env: dict[str, str], cwd: Path) -> Result:
    old = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(rank_table, args, env=env)
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.output
    return result


def written(directory: Path, name: str) -> str:
    text = (directory / name).read_text(encoding="utf-8")
    assert validate(json.loads(text)) == []
    return text


def test_generate_8_devices_v1_0_named_like_hccl_tools(weird_tmp: Path) -> None:
    env = fake_ascend_env(weird_tmp, range(8))
    result = run(["generate", "--server-id", "10.0.0.11"], env, weird_tmp)
    assert "device IPs of device(s) 0,1,2,3,4,5,6,7 from hccn_tool" in result.output
    assert_golden("generate_a2_8p_v1.0.json", written(weird_tmp, "hccl_8p_01234567_10.0.0.11.json"))


def test_generate_in_a_container_uses_physical_ids_for_table_and_ips(weird_tmp: Path) -> None:
    # A container given physical devices 4-7 sees only /dev/davinci4..7; logical 0-1 are physical 4-5.
    env = fake_ascend_env(weird_tmp, range(4, 8))
    run(["generate", "--server-id", "10.0.0.12", "--devices", "[0,2)"], env, weird_tmp)
    assert_golden("generate_a2_container_2p_v1.0.json", written(weird_tmp, "hccl_2p_01_10.0.0.12.json"))


def test_generate_16_devices_v1_2_from_npu_smi(weird_tmp: Path) -> None:
    env = fake_ascend_env(weird_tmp, range(16), "a3_host")
    args = ["generate", "--format", "1.2", "--server-id", "node_7", "--host-ip", "172.16.0.7",
            "--device-port", "16666", "--host-port", "16000", "--backup-device-ip", "0=10.20.1.21",
            "--backup-device-ip", "1=10.20.0.21", "--backup-device-port", "16667", "-o", "a3.json"]
    run(args, env, weird_tmp)
    assert_golden("generate_a3_16p_v1.2.json", written(weird_tmp, "a3.json"))


def test_merge_two_servers_v1_0(weird_tmp: Path) -> None:
    env = fake_ascend_env(weird_tmp, range(8))
    run(["generate", "--server-id", "10.0.0.11", "-o", "one.json"], env, weird_tmp)
    env["FAKE_ASCEND_NIC_CONF"] = str(weird_tmp / "second hccn.conf")
    (weird_tmp / "second hccn.conf").write_text(
        "".join(f"address_{d}=192.{d % 4 + 1}.11.{6 + d // 4}\n" for d in range(8)), encoding="utf-8")
    run(["generate", "--server-id", "10.0.0.12", "-o", "two.json"], env, weird_tmp)
    run(["merge", "two.json", "one.json"], env, weird_tmp)
    assert_golden("merge_2x8_v1.0.json", written(weird_tmp, "hccl_2s_16p.json"))


def test_merge_super_pod_tables_v1_2(weird_tmp: Path) -> None:
    example = json.loads((RANK_TABLE_EXAMPLES / "rank_table_superpod_v1.2.json").read_text(encoding="utf-8"))
    for index, server in enumerate(example["server_list"]):
        for rank, device in enumerate(server["device"]):
            device["rank_id"] = str(rank)
        pod = next(p for p in example["super_pod_list"] if {"server_id": server["server_id"]} in p["server_list"])
        single = {"version": "1.2", "server_count": "1", "server_list": [server],
                  "super_pod_list": [{"super_pod_id": pod["super_pod_id"],
                                      "server_list": [{"server_id": server["server_id"]}]}],
                  "status": "completed"}
        (weird_tmp / f"s{index}.json").write_text(json.dumps(single), encoding="utf-8")
    # Pods interleaved on the command line come out grouped, in order of first appearance (pod 1 first).
    run(["merge", "s2.json", "s0.json", "s3.json", "s1.json", "-o", "pods.json"], {}, weird_tmp)
    assert_golden("merge_superpod_4x4_v1.2.json", written(weird_tmp, "pods.json"))


def test_from_hostfile_two_hosts(weird_tmp: Path) -> None:
    (weird_tmp / "hosts").write_text("10.0.0.11 slots=8\nroot@10.0.0.12 slots=8  # spare\n", encoding="utf-8")
    (weird_tmp / "b.conf").write_text(
        "".join(f"address_{d}=192.{d % 4 + 1}.11.{6 + d // 4}\n" for d in range(8)), encoding="utf-8")
    args = ["from-hostfile", "hosts", "--hccn-conf", f"10.0.0.11={FIXTURES / 'a2_host' / 'hccn.conf'}",
            "--hccn-conf", "10.0.0.12=b.conf", "--exclude", "10.0.0.12:6,7"]
    run(args, {}, weird_tmp)
    assert_golden("from_hostfile_8p_6p_v1.0.json", written(weird_tmp, "hccl_2s_14p.json"))
