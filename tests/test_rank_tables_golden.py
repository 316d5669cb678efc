"""Golden files for the tables ``generate``, ``merge`` and ``from-hostfile`` write.

Each test runs the real command against fake Ascend hosts (``tests/fixtures/ascend``) and compares
the file it wrote, byte for byte, with ``tests/golden/<name>``. After an intended change, refresh
them with ``NPU_LAUNCH_UPDATE_GOLDEN=1 python -m pytest tests/test_rank_tables_golden.py`` and
review the diff.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rank_tables.cli import rank_table
from rank_tables.validate import validate

FIXTURES = Path(__file__).parent / "fixtures" / "ascend"
GOLDEN = Path(__file__).parent / "golden"
UPDATE_ENV = "NPU_LAUNCH_UPDATE_GOLDEN"


def assert_golden(name: str, text: str) -> None:
    """``text`` must equal ``tests/golden/<name>``; rewrite it instead when asked to refresh."""
    path = GOLDEN / name
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}: create it with {UPDATE_ENV}=1 python -m pytest {__file__}"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (f"{name} differs from the golden file {path}. If the change is intended, refresh with "
                              f"{UPDATE_ENV}=1 python -m pytest {__file__} and review the diff.")


@pytest.fixture
def weird_dir(tmp_path: Path) -> Path:
    path = tmp_path / "rank \"tables\" o'clock"
    path.mkdir()
    return path


def fake_host(root: Path, kind: str, nodes: range) -> dict[str, str]:
    """Environment of a fake host: davinciN files, fake tools first on PATH, their data files."""
    devfs = root / f"{kind} dev"
    devfs.mkdir()
    for name in [f"davinci{n}" for n in nodes] + ["davinci_manager", "devmm_svm", "hisi_hdc"]:
        (devfs / name).touch()
    return {"NPU_LAUNCH_DEVFS": str(devfs), "PATH": f"{FIXTURES / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "FAKE_ASCEND_NIC_CONF": str(FIXTURES / kind / "hccn.conf"),
            "FAKE_NPU_SMI_DIR": str(FIXTURES / kind)}


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


def test_generate_8_devices_v1_0_named_like_hccl_tools(weird_dir: Path) -> None:
    env = fake_host(weird_dir, "a2_host", range(8))
    result = run(["generate", "--server-id", "10.0.0.11"], env, weird_dir)
    assert "device IPs of device(s) 0,1,2,3,4,5,6,7 from hccn_tool" in result.output
    assert_golden("generate_a2_8p_v1.0.json", written(weird_dir, "hccl_8p_01234567_10.0.0.11.json"))


def test_generate_in_a_container_uses_physical_ids_for_table_and_ips(weird_dir: Path) -> None:
    # A container given physical devices 4-7 sees only /dev/davinci4..7; logical 0-1 are physical 4-5.
    env = fake_host(weird_dir, "a2_host", range(4, 8))
    run(["generate", "--server-id", "10.0.0.12", "--devices", "[0,2)"], env, weird_dir)
    assert_golden("generate_a2_container_2p_v1.0.json", written(weird_dir, "hccl_2p_01_10.0.0.12.json"))


def test_generate_16_devices_v1_2_from_npu_smi(weird_dir: Path) -> None:
    env = fake_host(weird_dir, "a3_host", range(16))
    args = ["generate", "--format", "1.2", "--server-id", "node_7", "--host-ip", "172.16.0.7",
            "--device-port", "16666", "--host-port", "16000", "--backup-device-ip", "0=10.20.1.21",
            "--backup-device-ip", "1=10.20.0.21", "--backup-device-port", "16667", "-o", "a3.json"]
    run(args, env, weird_dir)
    assert_golden("generate_a3_16p_v1.2.json", written(weird_dir, "a3.json"))


def test_merge_two_servers_v1_0(weird_dir: Path) -> None:
    env = fake_host(weird_dir, "a2_host", range(8))
    run(["generate", "--server-id", "10.0.0.11", "-o", "one.json"], env, weird_dir)
    env["FAKE_ASCEND_NIC_CONF"] = str(weird_dir / "second hccn.conf")
    (weird_dir / "second hccn.conf").write_text(
        "".join(f"address_{d}=192.{d % 4 + 1}.11.{6 + d // 4}\n" for d in range(8)), encoding="utf-8")
    run(["generate", "--server-id", "10.0.0.12", "-o", "two.json"], env, weird_dir)
    run(["merge", "two.json", "one.json"], env, weird_dir)
    assert_golden("merge_2x8_v1.0.json", written(weird_dir, "hccl_2s_16p.json"))


def test_merge_super_pod_tables_v1_2(weird_dir: Path) -> None:
    example = json.loads((Path(__file__).parents[1] / "rank_tables" / "examples"
                          / "rank_table_superpod_v1.2.json").read_text(encoding="utf-8"))
    for index, server in enumerate(example["server_list"]):
        for rank, device in enumerate(server["device"]):
            device["rank_id"] = str(rank)
        pod = next(p for p in example["super_pod_list"] if {"server_id": server["server_id"]} in p["server_list"])
        single = {"version": "1.2", "server_count": "1", "server_list": [server],
                  "super_pod_list": [{"super_pod_id": pod["super_pod_id"],
                                      "server_list": [{"server_id": server["server_id"]}]}],
                  "status": "completed"}
        (weird_dir / f"s{index}.json").write_text(json.dumps(single), encoding="utf-8")
    # Pods interleaved on the command line come out grouped, in order of first appearance (pod 1 first).
    run(["merge", "s2.json", "s0.json", "s3.json", "s1.json", "-o", "pods.json"], {}, weird_dir)
    assert_golden("merge_superpod_4x4_v1.2.json", written(weird_dir, "pods.json"))


def test_from_hostfile_two_hosts(weird_dir: Path) -> None:
    (weird_dir / "hosts").write_text("10.0.0.11 slots=8\nroot@10.0.0.12 slots=8  # spare\n", encoding="utf-8")
    (weird_dir / "b.conf").write_text(
        "".join(f"address_{d}=192.{d % 4 + 1}.11.{6 + d // 4}\n" for d in range(8)), encoding="utf-8")
    args = ["from-hostfile", "hosts", "--hccn-conf", f"10.0.0.11={FIXTURES / 'a2_host' / 'hccn.conf'}",
            "--hccn-conf", "10.0.0.12=b.conf", "--exclude", "10.0.0.12:6,7"]
    run(args, {}, weird_dir)
    assert_golden("from_hostfile_8p_6p_v1.0.json", written(weird_dir, "hccl_2s_14p.json"))
