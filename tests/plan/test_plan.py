"""The plan: every process of a job as data. What --dry-run prints and what agents receive."""
from __future__ import annotations

import os
from pathlib import Path

from launcher.config.devices import Card, DeviceKind
from launcher.config.launch_config import LaunchConfig
from launcher.plan.launch_plan import LaunchPlan, Node, RankAssignment, Role, StartMode
from launcher.plan.planner import PlanInputs, build_plan


def _config(tmp: Path, **kw) -> LaunchConfig:
    script = tmp / "train.py"
    script.write_text("")
    return LaunchConfig(script=str(script), python="/usr/bin/python3", workdir=str(tmp), **kw)


def _inputs(tmp: Path, nodes, **kw) -> PlanInputs:
    return PlanInputs(job_id="j", log_dir=str(tmp / "logs"), master_addr="10.0.0.1",
                      master_port=29500, device=DeviceKind.CPU, nodes=tuple(nodes),
                      boot_dir="/boot", base_pythonpath="/user/lib", **kw)


def test_two_nodes_dynamic_cluster(weird_tmp: Path) -> None:
    cards = tuple(Card(i, i) for i in range(2))
    plan = build_plan(_config(weird_tmp, script_args=("--lr", "0.1")),
                      _inputs(weird_tmp, [Node("a", 0, cards), Node("b", 1, cards)]))
    assert plan.mode is StartMode.DYNAMIC_CLUSTER and plan.world_size == 4 and not plan.foreground
    assert plan.scheduler is not None and plan.scheduler.host == "a"
    assert plan.scheduler.env["MS_ROLE"] == "MS_SCHED"
    assert [(r.rank, r.host, r.local_rank) for r in plan.ranks] == [
        (0, "a", 0), (1, "a", 1), (2, "b", 0), (3, "b", 1)]
    env = plan.ranks[3].env
    assert {k: env[k] for k in ("RANK_ID", "RANK", "RANK_SIZE", "WORLD_SIZE", "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE", "DEVICE_ID", "MASTER_ADDR", "MASTER_PORT",
                                "MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM",
                                "MS_NODE_ID", "NPU_LAUNCH_NODE_RANK")} == {
        "RANK_ID": "3", "RANK": "3", "RANK_SIZE": "4", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2", "DEVICE_ID": "1", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500", "MS_ROLE": "MS_WORKER", "MS_SCHED_HOST": "10.0.0.1",
        "MS_SCHED_PORT": "29500", "MS_WORKER_NUM": "4", "MS_NODE_ID": "3",
        "NPU_LAUNCH_NODE_RANK": "1"}
    assert env["PYTHONPATH"] == os.pathsep.join(["/boot", "/user/lib"])
    assert plan.ranks[3].log_path == str(weird_tmp / "logs" / "hosts" / "b" / "rank_3.log")
    assert plan.ranks[3].argv == ("/usr/bin/python3", str(weird_tmp / "train.py"), "--lr", "0.1")
    assert [p.label for p in plan.on_node(1)] == ["b:2", "b:3"]
    assert LaunchPlan.from_json(plan.to_json()) == plan


def test_single_node_layout_and_user_values_win(weird_tmp: Path) -> None:
    plan = build_plan(_config(weird_tmp, env=(("MS_RETRY_INTERVAL_LOWER", "7"),)),
                      _inputs(weird_tmp, [Node("h", 0, (Card(0, 4),))],
                              inherited=frozenset({"MS_RETRY_INTERVAL_UPPER"})))
    assert plan.foreground and plan.ranks[0].log_path == str(weird_tmp / "logs" / "rank_0.log")
    env = plan.ranks[0].env
    assert env["DEVICE_ID"] == "0", "DEVICE_ID is the logical id"
    assert env["MS_RETRY_INTERVAL_LOWER"] == "7"
    assert "MS_RETRY_INTERVAL_UPPER" not in env, "a value the user set is not overridden"


def test_rank_table_mode_takes_the_tables_ranks(weird_tmp: Path) -> None:
    node = Node("h", 0, (Card(6, 6), Card(7, 7)))
    inputs = _inputs(weird_tmp, [node], assignments={0: [RankAssignment(2, 6),
                                                         RankAssignment(3, 7)]},
                     rank_table_path="/t.json", world_size=4)
    plan = build_plan(_config(weird_tmp), inputs)
    assert plan.mode is StartMode.RANK_TABLE and plan.scheduler is None
    assert [(r.env["RANK_ID"], r.env["DEVICE_ID"], r.env["RANK_SIZE"]) for r in plan.ranks] == [
        ("2", "6", "4"), ("3", "7", "4")]
    assert all(r.env["RANK_TABLE_FILE"] == "/t.json" and "MS_ROLE" not in r.env
               for r in plan.ranks)


def test_debug_is_one_process_without_communication(weird_tmp: Path) -> None:
    plan = build_plan(_config(weird_tmp, debug=True),
                      _inputs(weird_tmp, [Node("h", 0, (Card(0, 0),))]))
    assert plan.mode is StartMode.SINGLE and plan.scheduler is None and plan.foreground
    assert plan.ranks[0].role is Role.RANK and plan.ranks[0].env["NPU_LAUNCH_DEBUG"] == "1"
    assert "MS_ROLE" not in plan.ranks[0].env


def test_agents_never_give_a_rank_the_terminal(weird_tmp: Path) -> None:
    plan = build_plan(_config(weird_tmp), _inputs(weird_tmp, [Node("h", 0, (Card(0, 0),))],
                                                  agents=True))
    assert not plan.foreground
    assert plan.ranks[0].log_path == str(weird_tmp / "logs" / "hosts" / "h" / "rank_0.log")
