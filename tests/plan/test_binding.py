"""Core and NUMA binding as planned (``launcher.plan.binding``): CPU lists, the even split, the
cards' CPU affinity from ``npu-smi info -t topo`` (the fake prints a recorded 910B3 capture,
``tests/fixtures/ascend/README.md``), what ``--dry-run`` and ``plan.json`` show, what a node
agent finds on its own host, and bad values refused in one line before anything starts.

Real ranks bound to real cores are in ``test_binding_ranks.py``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from helpers import ASCEND_FIXTURES, RANK_SCRIPTS, assert_one_line_error, fake_ascend_env, run_launcher

from launcher.config.cpu_list import format_cpu_list, parse_cpu_list
from launcher.config.devices import Card, DeviceKind
from launcher.config.launch_config import LaunchConfig
from launcher.errors import ConfigError
from launcher.plan import binding
from launcher.plan.binding import Binding, HostCores, read_topo, resolve, split
from launcher.plan.host_binding import bind_node
from launcher.plan.launch_plan import LaunchPlan, Node
from launcher.plan.planner import PlanInputs, build_plan

SCRIPT = str(RANK_SCRIPTS / "affinity.py")
TOPO = (ASCEND_FIXTURES / "a2_host" / "topo.txt").read_text()
RECORDED = {0: "144-167", 1: "144-167", 2: "96-119", 3: "96-119", 4: "0-23", 5: "0-23",
            6: "48-71", 7: "48-71"}
"""The CPU Affinity column of the recorded 910B3 capture."""
ALLOWED = tuple(sorted(os.sched_getaffinity(0)))
TOOLS = frozenset({"taskset", "numactl"})


def _host(allowed=tuple(range(192)), affinity=None, **kw) -> HostCores:
    return HostCores(tuple(allowed), read_topo(TOPO) if affinity is None else affinity,
                     tools=kw.pop("tools", TOOLS), **kw)


# CPU lists and the split ------------------------------------------------------------------------

@pytest.mark.parametrize("text, cores, written", [
    ("0", (0,), "0"), ("0-3,8", (0, 1, 2, 3, 8), "0-3,8"), ("3,1,2", (1, 2, 3), "1-3"),
    (" 0-1 , 4-5 ", (0, 1, 4, 5), "0-1,4-5"), ("7-7", (7,), "7"), ("0,0,0-1", (0, 1), "0-1")])
def test_cpu_lists_read_and_written_as_the_kernel_does(text: str, cores: tuple, written: str) -> None:
    assert parse_cpu_list(text) == cores
    assert format_cpu_list(cores) == written


@pytest.mark.parametrize("text, needle", [
    ("x", "expected auto, none or cores like 0-3,8"), ("0-", "expected auto"),
    ("1,,2", "expected auto"), ("-1", "expected auto"), ("", "expected auto"),
    ("3-1", "3-1 runs backwards"), ("0-99999999999", "core 99999999999 is past 8191"),
    ("٣", "expected auto"), ("0" * 5000, "longer than 4096 characters")])
def test_garbage_lists_are_refused_naming_the_option(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)) as caught:
        parse_cpu_list(text)
    assert caught.value.message.startswith("--bind-cores ")


@pytest.mark.parametrize("cores, count, blocks", [
    (range(8), 2, [(0, 1, 2, 3), (4, 5, 6, 7)]),
    (range(7), 3, [(0, 1, 2), (3, 4), (5, 6)]),
    (range(2), 2, [(0,), (1,)]),
    (range(2), 3, [(0,), (0,), (1,)]),
    (range(1), 2, [(0,), (0,)]),
    ((4, 9, 10), 1, [(4, 9, 10)])])
def test_split_is_contiguous_and_even_and_shares_only_when_short(cores, count, blocks) -> None:
    assert split(tuple(cores), count) == blocks


# npu-smi info -t topo ----------------------------------------------------------------------------

def test_the_recorded_topology_gives_each_card_its_affinity() -> None:
    assert {n: format_cpu_list(c) for n, c in read_topo(TOPO).items()} == RECORDED
    assert read_topo("NPU0  X  NA\nLegend:\n  X = Self\n") == {}, "NA is no affinity"


def test_cards_that_share_an_affinity_split_it() -> None:
    """A 910B3 server, all 192 cores allowed: cards 0 and 1 share 144-167 and get 12 each."""
    found = resolve([Binding("auto", card=c) for c in range(8)], _host())
    assert [format_cpu_list(b.cpus) for b in found] == [
        "144-155", "156-167", "96-107", "108-119", "0-11", "12-23", "48-59", "60-71"]
    assert all(b.sharing == 1 for b in found)
    assert "card 3: its share of CPU affinity 96-119, which 2 card(s) report" in found[3].how


def test_a_card_gets_its_own_share_when_its_neighbour_is_another_jobs() -> None:
    """ASCEND_RT_VISIBLE_DEVICES=1: the one rank on card 1 keeps off card 0's share, which
    another job on this host may be using."""
    (found,) = resolve([Binding("auto", card=1)], _host())
    assert format_cpu_list(found.cpus) == "156-167"


def test_a_cpuset_narrows_the_affinity_and_else_the_allowed_cores_are_split() -> None:
    inside = resolve([Binding("auto", card=4), Binding("auto", card=5)], _host(range(24)))
    assert [format_cpu_list(b.cpus) for b in inside] == ["0-11", "12-23"]
    outside = resolve([Binding("auto", card=0), Binding("auto", card=4)], _host(range(24)))
    assert [format_cpu_list(b.cpus) for b in outside] == ["0-11", "12-23"]
    assert outside[0].how == ("this host's allowed cores 0-23 split by local rank: card 0's "
                              "share 144-155 of its CPU affinity 144-167 is outside them")
    missing = resolve([Binding("auto", card=9)], _host(range(4)))
    assert "npu-smi info -t topo has no row for device 9" in missing[0].how


def test_without_npu_smi_or_cards_the_allowed_cores_are_split() -> None:
    host = _host(range(4), affinity={}, topo_note="npu-smi is not on PATH")
    found = resolve([Binding("auto", card=0), Binding("auto", card=1)], host)
    assert [b.cpus for b in found] == [(0, 1), (2, 3)]
    assert found[0].how.endswith("split by local rank: npu-smi is not on PATH")
    cpu = resolve([Binding("auto")] * 3, _host(range(2)))
    assert [(b.cpus, b.sharing) for b in cpu] == [((0,), 2), ((0,), 2), ((1,), 1)]
    assert "3 ranks on 2 core(s): up to 2 ranks share each core" in binding.summary([0, 1, 2], cpu)


def test_a_list_is_split_and_must_be_allowed() -> None:
    found = resolve([Binding("2-5")] * 2, _host(range(8)))
    assert [b.cpus for b in found] == [(2, 3), (4, 5)]
    with pytest.raises(ConfigError, match=re.escape(
            "--bind-cores 0-999: core(s) 8-999 are not among the cores this host allows (0-7)")):
        resolve([Binding("0-999")], _host(range(8)))


def test_numa_binds_memory_to_the_nodes_of_the_cores() -> None:
    nodes = {0: tuple(range(0, 48)), 1: tuple(range(48, 96))}
    found = resolve([Binding("auto", numa=True, card=c) for c in (4, 6)],
                    _host(range(96), nodes=nodes, mems_allowed=(0, 1)))
    assert [(format_cpu_list(b.cpus), b.mems) for b in found] == [("0-11", (0,)), ("48-59", (1,))]
    assert found[1].wrap(("python", "t.py")) == (
        "numactl", "--physcpubind=48-59", "--membind=1", "python", "t.py")
    assert found[1].env() == {"NPU_LAUNCH_CPUS": "48-59", "NPU_LAUNCH_NUMA_NODES": "1",
                              "MSRUN_CPU_LIST": str(list(range(48, 60)))}
    with pytest.raises(ConfigError, match="--bind-numa: this host shows no NUMA nodes"):
        resolve([Binding("auto", numa=True)], _host(range(2)))


def test_a_missing_tool_is_one_line_naming_the_option() -> None:
    with pytest.raises(ConfigError, match=re.escape(
            "--bind-numa: numactl is not installed on this host (the numactl package)")):
        resolve([Binding("auto", numa=True)], _host(range(2), tools=frozenset({"taskset"})))
    with pytest.raises(ConfigError, match=re.escape("--bind-cores: taskset is not installed")):
        resolve([Binding("auto")], _host(range(2), tools=frozenset()))


def test_this_hosts_facts_are_read_from_the_kernel() -> None:
    host = HostCores.here(with_topo=False)
    assert host.allowed == ALLOWED
    assert "taskset" in host.tools  # util-linux, on every Linux this runs on
    if os.path.isdir("/sys/devices/system/node/node0"):
        assert set(ALLOWED) <= {c for cores in host.nodes.values() for c in cores}
        assert host.mems_allowed, "Mems_allowed_list from /proc/self/status"


# The plan: what --dry-run and plan.json carry, what an agent finds --------------------------------

def _plan(tmp: Path, nodes, device=DeviceKind.CPU, **config) -> LaunchPlan:
    script = tmp / "train.py"
    script.write_text("")
    return build_plan(LaunchConfig(script=str(script), python="/usr/bin/python3",
                                   workdir=str(tmp), **config),
                      PlanInputs(job_id="j", log_dir=str(tmp / "logs"), master_addr="10.0.0.1",
                                 master_port=29500, device=device, nodes=tuple(nodes),
                                 agents=len(nodes) > 1))


def test_the_plan_carries_the_rule_and_each_node_finds_its_own_cores(weird_tmp: Path) -> None:
    """Node 0 cannot see another host's cpuset: the plan it sends carries the rule, and each
    agent finds its node's cores on its host (here both 'hosts' are this machine)."""
    cards = (Card(0, 0), Card(1, 1))
    plan = _plan(weird_tmp, [Node("a", 0, cards), Node("b", 1, cards)], bind_cores="auto")
    assert all(r.binding == Binding("auto") for r in plan.ranks), "CPU ranks follow no card"
    assert "cores auto: found on b before its ranks start there" in plan.render()
    assert LaunchPlan.from_json(plan.to_json()) == plan
    host = _host(range(4), affinity={})
    on_b, notes = bind_node(plan, 1, host)
    assert [r.binding.cpus if r.binding else None for r in on_b.ranks] == [(), (), (0, 1), (2, 3)]
    assert notes == ["cores: rank 2 -> 0-1, rank 3 -> 2-3 (this host's allowed cores 0-3 split "
                     "by local rank)"]
    bound = on_b.ranks[3]
    assert bound.env["NPU_LAUNCH_CPUS"] == "2-3" and bound.env["MSRUN_CPU_LIST"] == "[2, 3]"
    assert bound.command == ("taskset", "-c", "2-3", *bound.argv)
    assert bound.argv == ("/usr/bin/python3", str(weird_tmp / "train.py")), "argv stays the user's"
    assert LaunchPlan.from_json(on_b.to_json()) == on_b, "plan.json keeps the cores"
    restarted = on_b.restarted(1)
    assert restarted.ranks[3].binding == bound.binding and restarted.ranks[3].env["NPU_LAUNCH_CPUS"] == "2-3"
    with pytest.raises(RuntimeError, match="started before its cores were found"):
        _ = on_b.ranks[0].command


def test_npu_ranks_follow_their_physical_card(weird_tmp: Path) -> None:
    """Under ASCEND_RT_VISIBLE_DEVICES=6,7 the ranks' DEVICE_IDs are 0 and 1; the topology
    rows they follow are 6 and 7."""
    plan = _plan(weird_tmp, [Node("h", 0, (Card(0, 6), Card(1, 7)))], DeviceKind.NPU,
                 bind_cores="auto")
    assert [(r.device_id, r.binding.card if r.binding else None) for r in plan.ranks] == [
        (0, 6), (1, 7)]
    bound, _ = bind_node(plan, 0, _host())
    assert [format_cpu_list(r.binding.cpus) for r in bound.ranks if r.binding] == ["48-59", "60-71"]


def test_no_binding_by_default(weird_tmp: Path) -> None:
    plan = _plan(weird_tmp, [Node("h", 0, (Card(0, 0), Card(1, 1)))])
    assert all(r.binding is None and "NPU_LAUNCH_CPUS" not in r.env for r in plan.ranks)
    assert bind_node(plan, 0) == (plan, [])
    assert plan.ranks[0].command == plan.ranks[0].argv


# The command line -------------------------------------------------------------------------------

def _dry_run(tmp: Path, *args: str, env=None) -> tuple[dict, str]:
    result = run_launcher(*args, "--log-dir", str(tmp / "logs"), "--dry-run", "--json", SCRIPT,
                          "go", cwd=tmp, env=env)
    assert result.returncode == 0, result.stderr
    assert not (tmp / "logs").exists(), "a dry run creates nothing"
    return json.loads(result.stdout), result.stderr


def _cores(plan: dict) -> list[str]:
    return [format_cpu_list(r["binding"]["cpus"]) for r in plan["ranks"]]


def test_dry_run_shows_each_ranks_cores(weird_tmp: Path) -> None:
    plan, err = _dry_run(weird_tmp, "--device", "cpu", "--cards", "2", "--bind-cores", "auto")
    expected = [format_cpu_list(b) for b in split(ALLOWED, 2)]
    assert _cores(plan) == expected
    assert [r["env"]["NPU_LAUNCH_CPUS"] for r in plan["ranks"]] == expected
    assert plan["scheduler"]["binding"] is None, "MindSpore's scheduler is not bound"
    assert f"npu-launch: cores: rank 0 -> {expected[0]}, rank 1 -> {expected[1]} (this host's " \
           f"allowed cores {format_cpu_list(ALLOWED)} split by local rank" in err
    text = run_launcher("--device", "cpu", "--cards", "2", "--bind-cores", "auto", "--dry-run",
                        SCRIPT, "go", cwd=weird_tmp).stdout
    assert f"  cores {expected[1]} (this host's allowed cores" in text
    assert f"  cmd: taskset -c {expected[1]} " in text


def test_a_config_file_sets_it_too(weird_tmp: Path) -> None:
    config = weird_tmp / "job.yaml"
    config.write_text("cards: 1\ndevice: cpu\nbind-cores: '0'\n")
    plan, _ = _dry_run(weird_tmp, "--config", str(config))
    assert _cores(plan) == ["0"] and plan["ranks"][0]["binding"]["rule"] == "0"


def _topo_dir(tmp: Path, affinity: dict[int, str]) -> Path:
    """The recorded capture with its CPU Affinity column alone replaced."""
    folder = tmp / "topo host"
    folder.mkdir(exist_ok=True)
    lines = []
    for line in TOPO.splitlines():
        match = re.match(r"NPU(\d+)\s", line)
        if match:
            line = re.sub(r"\S+$", affinity[int(match.group(1))], line)
        lines.append(line)
    (folder / "topo.txt").write_text("\n".join(lines) + "\n")
    return folder


def test_on_ascend_each_card_gets_its_share_of_its_affinity(weird_tmp: Path) -> None:
    """The fake npu-smi prints the capture's layout with affinities on this machine's cores
    (cards 0-3 next to the first allowed core, 4-7 to the last); cards 0 and 1 split theirs."""
    first, last = str(ALLOWED[0]), str(ALLOWED[-1])
    env = {**os.environ, **fake_ascend_env(weird_tmp, range(8))}
    env["FAKE_NPU_SMI_DIR"] = str(_topo_dir(weird_tmp, {n: first if n < 4 else last
                                                        for n in range(8)}))
    plan, err = _dry_run(weird_tmp, "--device", "npu", "--cards", "2", "--bind-cores", "auto",
                         env=env)
    assert [r["binding"]["card"] for r in plan["ranks"]] == [0, 1]
    assert _cores(plan) == [first, first], "four cards share one core: neighbours share it"
    assert "card 1: its share of CPU affinity" in plan["ranks"][1]["binding"]["how"]
    env["ASCEND_RT_VISIBLE_DEVICES"] = "5"
    plan, _ = _dry_run(weird_tmp, "--device", "npu", "--bind-cores", "auto", env=env)
    assert (plan["ranks"][0]["device_id"], plan["ranks"][0]["binding"]["card"]) == (0, 5)
    assert _cores(plan) == [last], "the physical card's row, not DEVICE_ID's"


def test_on_ascend_an_affinity_outside_the_allowed_cores_falls_back(weird_tmp: Path) -> None:
    """The capture verbatim (cores 0-191) on this machine's cores: card 0's 144-155 is not
    allowed here, so the allowed cores are split, and the note says why."""
    env = {**os.environ, **fake_ascend_env(weird_tmp, range(8))}
    plan, err = _dry_run(weird_tmp, "--device", "npu", "--cards", "2", "--bind-cores", "auto",
                         env=env)
    if set(range(144, 168)) <= set(ALLOWED):  # a machine with the capture's cores
        assert _cores(plan) == ["144-155", "156-167"]
    else:
        assert _cores(plan) == [format_cpu_list(b) for b in split(ALLOWED, 2)]
        assert "card 0's share 144-155 of its CPU affinity 144-167 is outside them" in err
    env["FAKE_NPU_SMI_DIR"] = str(ASCEND_FIXTURES / "a3_host")  # no topo.txt: npu-smi fails
    _, err = _dry_run(weird_tmp, "--device", "npu", "--cards", "2", "--bind-cores", "auto",
                      env=env)
    assert "npu-smi info -t topo failed: 'fake npu-smi: no topo.txt in " in err


@pytest.mark.parametrize("args, needles", [
    (["--bind-cores", "x-y"], ["--bind-cores 'x-y': expected auto, none or cores like 0-3,8"]),
    (["--bind-cores", "0-999"], ["--bind-cores 0-999: core(s)", "-999 are not among the cores "
                                 "this host allows"]),
    (["--bind-cores", "0-99999999999"], ["core 99999999999 is past 8191"]),
    (["--bind-cores", ""], ["--bind-cores '': expected auto"]),
    (["--bind-cores", "none", "--bind-numa"], ["--bind-numa binds each rank's memory to the "
                                                "NUMA nodes of its cores; it goes without "
                                                "--bind-cores none"]),
    (["--bind-cores", "auto", "--env", "MSRUN_CPU_LIST=[0]"],
     ["--env MSRUN_CPU_LIST: npu-launch sets MSRUN_CPU_LIST in every rank with --bind-cores"])])
def test_bad_values_are_one_line_and_nothing_starts(weird_tmp: Path, args, needles) -> None:
    result = run_launcher("--device", "cpu", "--cards", "2", *args, "--log-dir",
                          str(weird_tmp / "logs"), SCRIPT, "go", cwd=weird_tmp)
    assert_one_line_error(result, *needles)
    assert not (weird_tmp / "logs").exists(), "nothing was created"


def test_bind_numa_needs_numactl(weird_tmp: Path) -> None:
    """A host without numactl (here: a PATH that holds only taskset): --bind-numa says so in one
    line and starts nothing. With it (CI installs the numactl package), the dry run shows each
    rank under numactl; ``test_binding_ranks`` runs them."""
    args = ("--device", "cpu", "--cards", "2", "--bind-numa", "--log-dir", str(weird_tmp / "logs"))
    bare = weird_tmp / "bin"
    bare.mkdir()
    (bare / "taskset").symlink_to(shutil.which("taskset") or "/usr/bin/taskset")
    result = run_launcher(*args, SCRIPT, "go", cwd=weird_tmp,
                          env={**os.environ, "PATH": str(bare)})
    assert_one_line_error(result, "--bind-numa: numactl is not installed on this host")
    assert not (weird_tmp / "logs").exists()
    assert shutil.which("numactl"), "numactl is installed (.ci/install-system-deps)"
    plan, _ = _dry_run(weird_tmp, *args[:-2])
    assert all(r["binding"]["numa"] and r["binding"]["mems"] for r in plan["ranks"])


def test_a_multi_host_plan_with_cores_found_on_each_host_passes_the_checks(tmp_path: Path) -> None:
    """Node 0 cannot know another host's cores: every check before the start (the kernel's
    ARG_MAX among them) takes a rank's argv as known there, and --dry-run prints it."""
    (tmp_path / "hosts").write_text("127.0.0.1 slots=2\n127.0.0.2 slots=2\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    result = run_launcher("--hostfile", str(tmp_path / "hosts"), "--no-preflight", "--device", "cpu",
                          "--bind-cores", "auto", "--dry-run", str(tmp_path / "train.py"),
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cmd: " in result.stdout and "taskset" not in result.stdout.split("127.0.0.2:2")[1]


def test_on_an_a3_host_the_topology_rows_are_mapped_through_the_chip_map(weird_tmp: Path) -> None:
    """16 devices (8 NPUs x 2 dies). No A3 ``-t topo`` capture is known: the recorded 910B
    layout is given 16 rows, and the recorded A3 ``npu-smi info -m`` has logic ids 0 and 1
    swapped, so the row ``NPU0`` is device 1's: the binding, the card checks and the rank
    tables read one model of the host (``rank_tables.host_devices``)."""
    first, last = str(ALLOWED[0]), str(ALLOWED[-1])
    folder = weird_tmp / "a3 topo host"
    folder.mkdir()
    rows = [line for line in TOPO.splitlines() if re.match(r"NPU0\s", line)]
    header = next(line for line in TOPO.splitlines() if "CPU Affinity" in line)
    topo = [header] + [re.sub(r"\S+$", first if n == 0 else last, rows[0].replace("NPU0", f"NPU{n}", 1))
                       for n in range(16)]
    (folder / "topo.txt").write_text("\n".join(topo) + "\n")
    chip_map = (ASCEND_FIXTURES / "a3_host" / "info-m.txt").read_text().splitlines()
    for line, (chip, logic) in ((1, (0, 1)), (2, (1, 0))):  # NPU 0's dies: Phy-ID 0 and 1
        chip_map[line] = f"\t{0:<31}{chip:<31}{logic:<31}{chip:<31}Ascend910"
    (folder / "info-m.txt").write_text("\n".join(chip_map) + "\n")
    env = {**os.environ, **fake_ascend_env(weird_tmp, range(16), "a3_host"),
           "FAKE_NPU_SMI_DIR": str(folder), "NPL_FAKE_NPU_SMI_INFO": "npu-smi-info-a3.txt"}
    plan, err = _dry_run(weird_tmp, "--device", "npu", "--cards", "2", "--bind-cores", "auto", env=env)
    assert [r["binding"]["card"] for r in plan["ranks"]] == [0, 1]
    assert _cores(plan) == [last, first], err
    assert str(ASCEND_FIXTURES / "bin" / "npu-smi") in plan["ranks"][1]["binding"]["how"]
