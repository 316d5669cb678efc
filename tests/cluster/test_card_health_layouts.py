"""Card checks on each Ascend generation's ``npu-smi`` layout (``rank_tables.host_devices``,
``launcher.cluster.card_health``), with the recordings of ``tests/fixtures/ascend_tools``
replayed by the fake tools: 910A, 910B, Atlas A3 (two dies per NPU, 16 devices; npu-smi 24.1 and
26.0 with ``Process id in container``), and a layout no rule reads (Ascend 950 as issue 41
describes it). One test per verdict: a free die, a held die, an alarmed die, an unknown layout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ASCEND_FIXTURES, TESTS, fake_devfs, run_launcher

from launcher.cluster.card_checks import skipped_note, tools_note
from launcher.cluster.card_health import check_cards
from launcher.cluster.preflight import HostCheck, render
from launcher.cluster.probe import HostFacts
from launcher.plan.binding import HostCores, card_affinity
from rank_tables import host_devices
from rank_tables.host_devices import Die, HostDevices, parse_chip_map, parse_info

TOOLS = TESTS / "fixtures" / "ascend_tools"
A3 = "npu-smi-info-a3.txt"
A3_26 = "npu-smi-info-a3-26.0.txt"
NEW_950 = "npu-smi-info-950.txt"


def recording(name: str) -> str:
    """A recording as the tool printed it: without the fixture's leading ``# `` lines (its
    source and npu-smi version)."""
    lines = (TOOLS / name).read_text().splitlines(keepends=True)
    return "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("# ")):])


def _recorded(name: str) -> HostDevices:
    return parse_info(recording(name))


def a3_host(weird_tmp: Path, recording: str = A3) -> dict:
    """This machine as a fake 16-device Atlas A3 host replaying ``recording``."""
    faults = weird_tmp / "faults"
    faults.mkdir(exist_ok=True)
    (faults / "recording").write_text(recording + "\n")
    return {**os.environ, "NPU_LAUNCH_DEVFS": str(fake_devfs(weird_tmp / "dev", range(16))),
            "PATH": f"{TOOLS / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "NPL_FAKE_ASCEND_FAULTS": str(faults)}


def _fault(env: dict, name: str, value: str) -> None:
    Path(env["NPL_FAKE_ASCEND_FAULTS"], name).write_text(value + "\n")


# The recordings, read ----------------------------------------------------------------------------

def test_a3_devices_are_keyed_by_phy_id_with_health_per_die() -> None:
    host = _recorded(A3)
    assert host.read and host.version == "npu-smi 24.1.rc3.7"
    assert sorted(host.dies) == list(range(16))
    assert [(d.npu, d.chip) for d in (host.dies[0], host.dies[1], host.dies[15])] == [(0, 0), (0, 1), (7, 1)]
    assert host.idle == frozenset(range(16)) and not host.processes


def test_a3_process_rows_map_npu_and_chip_to_the_die() -> None:
    """npu-smi 26.0's table (with ``Process id in container``): NPU 0 chip 0 is device 0,
    NPU 7 chip 1 device 15; NPU 0's other die runs nothing."""
    host = _recorded(A3_26)
    assert host.read and host.version == "npu-smi 26.0.rc2"
    assert host.processes == {0: ((632268, "python3.1"),), 15: ((632301, "python3.1"),)}
    assert 1 in host.idle and 14 in host.idle and 0 not in host.idle


@pytest.mark.parametrize("name, version, devices", [
    ("npu-smi-info.txt", "npu-smi 25.2.0", 8), ("npu-smi-info-910a.txt", "npu-smi 24.1.0", 8)])
def test_one_die_per_npu_the_npu_id_is_the_device(name: str, version: str, devices: int) -> None:
    host = _recorded(name)
    assert host.read and host.version == version
    assert sorted(host.dies) == list(range(devices)) and all(d.health == "OK" for d in host.dies.values())


def test_a_layout_no_rule_reads_is_said_not_guessed() -> None:
    host = _recorded(NEW_950)
    assert not host.read and not host.dies and host.version == "npu-smi 25.7.rc1"
    assert host.not_understood == "no '| NPU  Name | Health |' header"


def test_several_dies_without_a_phy_id_column_need_the_chip_map() -> None:
    """NPU 0 with two dies and no Phy-ID column (910A rows rearranged): not guessed without
    ``npu-smi info -m``, and read with it."""
    text = recording("npu-smi-info-910a.txt")
    text = text.replace("| 1     910ProB  ", "| 0     910ProB  ").replace(
        "| 0                         | 0000:81", "| 1                         | 0000:81")
    assert parse_info(text).not_understood == ("NPU 0 has several dies and neither a Phy-ID column "
                                               "nor npu-smi info -m names their devices")
    chips = {0: Die(0, 0, 0), 1: Die(1, 0, 1), **{n: Die(n, n, 0) for n in range(2, 8)}}
    host = parse_info(text, chips)
    assert host.read and sorted(host.dies) == list(range(8)) and host.dies[1].chip == 1


def test_the_chip_map_maps_logic_ids_to_devices() -> None:
    chips = parse_chip_map((ASCEND_FIXTURES / "a3_host" / "info-m.txt").read_text())
    assert sorted(chips) == list(range(16)) and (chips[9].npu, chips[9].chip) == (4, 1)
    moved = HostDevices(dies={5: Die(5, 2, 1, logic=3)})
    assert moved.device_of_logic(3) == 5 and moved.device_of_logic(7) == 7


@pytest.mark.parametrize("name", [A3, "npu-smi-info-910a.txt", NEW_950])
def test_the_fake_replays_each_recording_byte_for_byte(name: str, weird_tmp: Path) -> None:
    out = subprocess.run(["npu-smi", "info"], env=a3_host(weird_tmp, name), capture_output=True,
                         text=True, check=True).stdout
    assert out == recording(name)


# One verdict each, on a 16-device A3 host ---------------------------------------------------------

def test_a3_free_dies_pass_all_sixteen(weird_tmp: Path) -> None:
    report = check_cards(range(16), a3_host(weird_tmp))
    assert report.ok and report.skipped == (), report
    assert report.tools == {"npu-smi": str(TOOLS / "bin" / "npu-smi"),
                            "hccn_tool": str(TOOLS / "bin" / "hccn_tool")}


def test_a3_a_held_die_is_that_die_not_its_npu(weird_tmp: Path) -> None:
    env = a3_host(weird_tmp)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)
    try:
        _fault(env, "process_1", f"{holder.pid} python")  # NPU 0 chip 1
        out = subprocess.run(["npu-smi", "info"], env=env, capture_output=True, text=True).stdout
        assert f"| 0       1                 | {holder.pid}" in out
        said = [p.describe("a3") for p in check_cards([0, 1], env).problems]
        assert said == [f"a3 card 1: held by pid {holder.pid} (python) (npu-smi info)"]
    finally:
        holder.stdin.close()
        holder.wait()


def test_a3_an_alarmed_die_is_refused_and_its_twin_is_not(weird_tmp: Path) -> None:
    env = a3_host(weird_tmp)
    _fault(env, "health_9", "Alarm")  # NPU 4's second die
    report = check_cards(range(16), env)
    assert [p.describe("a3") for p in report.problems] == ["a3 card 9: health Alarm (npu-smi info)"]


def test_an_unknown_layout_skips_the_check_and_refuses_nothing(weird_tmp: Path) -> None:
    env = a3_host(weird_tmp, NEW_950)
    report = check_cards([0, 1], env)
    assert report.ok
    tool = TOOLS / "bin" / "npu-smi"
    assert report.skipped == (f"health and processes: {tool} info (npu-smi 25.7.rc1) not understood: "
                              "no '| NPU  Name | Health |' header",)
    assert "npu-smi 25.7.rc1" in (skipped_note({"h": report}) or "")


def test_hccn_tool_output_no_rule_reads_skips_that_check(weird_tmp: Path) -> None:
    env = a3_host(weird_tmp)
    odd = weird_tmp / "odd bin"
    odd.mkdir()
    (odd / "hccn_tool").write_text("#!/bin/sh\necho 'Link State Info: reserved'\n")
    (odd / "hccn_tool").chmod(0o755)
    env["PATH"] = f"{odd}{os.pathsep}{env['PATH']}"
    report = check_cards([0, 1], env)
    assert report.ok and report.ips == {}
    assert report.skipped[0] == (f"link: {odd / 'hccn_tool'} -i N -link -g printed no 'link status:' "
                                 "line ('Link State Info: reserved') (card(s) 0,1)")
    assert len(report.skipped) == 3


# Where the tools are ------------------------------------------------------------------------------

def test_tools_are_found_after_path_in_sbin_then_the_driver_folder(weird_tmp: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sbin, driver = weird_tmp / "sbin", weird_tmp / "driver tools"
    for folder, tool in ((sbin, "npu-smi"), (driver, "hccn_tool"), (driver, "npu-smi")):
        folder.mkdir(exist_ok=True)
        (folder / tool).write_text(f'#!/bin/sh\nexec "{TOOLS / "bin" / tool}" "$@"\n')
        (folder / tool).chmod(0o755)
    monkeypatch.setattr(host_devices, "TOOL_DIRS", (str(sbin), str(driver)))
    env = {**a3_host(weird_tmp), "PATH": "/usr/bin:/bin"}
    report = check_cards([0], env)
    assert report.ok and report.tools == {"npu-smi": str(sbin / "npu-smi"),
                                          "hccn_tool": str(driver / "hccn_tool")}
    assert tools_note({"h": report}) == (f"npu-launch: card checks ran h ({driver / 'hccn_tool'}, "
                                         f"{sbin / 'npu-smi'})")
    check = HostCheck("node1", HostFacts(hostname="n1", cards=16), (), None, report)
    assert render([check]).splitlines()[-1] == (f"card tools: node1: {driver / 'hccn_tool'}, "
                                                f"{sbin / 'npu-smi'}")


def test_bind_cores_names_the_npu_smi_it_read(weird_tmp: Path) -> None:
    affinity, note = card_affinity(None)
    assert affinity == {} and "/usr/local/sbin" in note
    assert HostCores((0,)).topo_tool == "npu-smi"


# A 16-device job on one A3 host -------------------------------------------------------------------

def test_a_sixteen_device_job_on_an_a3_host_is_planned_and_says_its_tools(weird_tmp: Path) -> None:
    env = a3_host(weird_tmp)
    script = weird_tmp / "job.py"
    script.write_text("print('ran')\n")
    result = run_launcher("--device", "npu", "--dry-run", "--json", "--log-dir", str(weird_tmp / "logs"),
                          str(script), env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert [r["device_id"] for r in plan["ranks"]] == list(range(16))
    assert "npu-launch: card checks ran " in result.stderr
    assert str(TOOLS / "bin" / "npu-smi") in result.stderr
