"""MindSpore's compile cache in the job's log dir, so that a restart loads its graphs.

The plan gives every rank ``MS_COMPILER_CACHE_ENABLE=1`` and ``MS_COMPILER_CACHE_PATH`` =
``<log dir>/compile_cache/<launch>`` unless the user set either variable or gave
``--no-compile-cache``; MindSpore keeps each rank's graphs in ``rank_<N>/graph_cache/`` there.
One real job (``tests/rank_scripts/compiled_steps.py``: GRAPH mode, 8x8 inputs, 3 steps, rank 1
failing after its checksum line in the first attempt) shows the graphs kept in the log dir and
a restart that loads what the first attempt compiled: MindSpore says so in the rank's log
(``GetCachedFuncGraph`` in its ``compile_cache_manager.cc``, a WARNING, so it is there at the
default log level), it writes no cache file once the second attempt started, and the loaded
graphs train to the parameters the compiled ones did. A path of the user's is left to them by
the plan (the tests above: npu-launch sets neither variable, and MindSpore keeps its graphs where
``MS_COMPILER_CACHE_PATH`` says, as the real job shows for npu-launch's own path); a second
real job that showed it again was dropped in stop 36.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, checksums, run_launcher

from launcher.config.devices import Card, DeviceKind
from launcher.config.launch_config import LaunchConfig
from launcher.plan.launch_plan import LaunchPlan, Node
from launcher.plan.planner import COMPILE_CACHE, PlanInputs, build_plan
from launcher.run.events import prepare_dirs
from parallel import contract

JOB = str(RANK_SCRIPTS / "compiled_steps.py")
CACHE_VARS = (contract.MS_COMPILER_CACHE_ENABLE, contract.MS_COMPILER_CACHE_PATH)
LOADED = "Use the compilation cache and execute the backend actions only"
"""MindSpore's WARNING when it runs a graph from the cache instead of compiling it."""
COMPILED = "Execute all the compilation actions"
"""... and when it finds no cache to load (it then compiles and writes one)."""


def _config(tmp: Path, **kw) -> LaunchConfig:
    script = tmp / "train.py"
    script.write_text("")
    return LaunchConfig(script=str(script), python="/usr/bin/python3", workdir=str(tmp), **kw)


def _plan(tmp: Path, nodes: int = 1, config: Optional[dict] = None, **kw) -> LaunchPlan:
    cards = (Card(0, 0), Card(1, 1))
    inputs = PlanInputs(job_id="j", log_dir=str(tmp / "logs"), master_addr="10.0.0.1",
                        master_port=29500, device=DeviceKind.CPU, token=kw.pop("token", "t"),
                        nodes=tuple(Node(f"h{n}", n, cards) for n in range(nodes)), **kw)
    return build_plan(_config(tmp, **(config or {})), inputs)


def _without_cache_vars() -> dict[str, str]:
    """This environment without the user's compile-cache variables (npu-launch leaves the
    cache to a user who set either)."""
    return {k: v for k, v in os.environ.items() if k not in CACHE_VARS}


def _cache_env(plan: LaunchPlan) -> list[dict[str, str]]:
    return [{k: spec.env[k] for k in CACHE_VARS if k in spec.env} for spec in plan.processes]


# The plan -----------------------------------------------------------------------------------------

def test_every_rank_gets_one_cache_in_the_log_dir_and_the_scheduler_none(weird_tmp: Path) -> None:
    plan = _plan(weird_tmp, nodes=2, agents=True)
    path = plan.ranks[0].compile_cache
    assert Path(path).parent == weird_tmp / "logs" / COMPILE_CACHE
    assert _cache_env(plan) == [{}] + [{"MS_COMPILER_CACHE_ENABLE": "1",
                                         "MS_COMPILER_CACHE_PATH": path}] * 4, \
        "MindSpore separates the ranks inside the path itself (rank_<N>/)"
    assert all(spec.compile_cache == path for spec in plan.ranks)
    assert LaunchPlan.from_json(plan.to_json()) == plan, "an agent receives it with its plan"


def test_each_host_makes_the_folder_before_its_ranks_start(weird_tmp: Path) -> None:
    plan = _plan(weird_tmp, nodes=2, agents=True)
    specs = plan.on_node(1)
    prepare_dirs(plan.log_dir, [p for spec in specs for p in spec.files])  # as agent.py does
    assert Path(plan.ranks[2].compile_cache).is_dir()


def test_a_restart_keeps_the_path_and_another_launch_gets_its_own(weird_tmp: Path) -> None:
    """MindSpore checks only that the script's files are unchanged before it runs a cached
    graph; another launch into the same log dir (other arguments, other shapes) must not find
    the graphs of this one."""
    plan = _plan(weird_tmp)
    again = plan.restarted(1)
    assert _cache_env(again) == _cache_env(plan) and again.ranks[0].env[contract.RESTART] == "1"
    other = _plan(weird_tmp, token="u")
    assert other.ranks[0].compile_cache != plan.ranks[0].compile_cache
    assert _plan(weird_tmp, nodes=2).ranks[0].compile_cache != plan.ranks[0].compile_cache, \
        "nor a launch of the same token on another number of ranks"


@pytest.mark.parametrize("where", ["environment", "--env"])
@pytest.mark.parametrize("name,value", [("MS_COMPILER_CACHE_PATH", "/mine"),
                                        ("MS_COMPILER_CACHE_ENABLE", "0"),
                                        ("MS_COMPILER_CACHE_ENABLE", "1")])
def test_a_variable_the_user_set_leaves_the_cache_to_them(weird_tmp: Path, where: str, name: str,
                                                          value: str) -> None:
    if where == "--env":
        plan = _plan(weird_tmp, config={"env": ((name, value),)})
        assert all(spec.env[name] == value and len(env) == 1
                   for spec, env in zip(plan.processes, _cache_env(plan)))
    else:
        plan = _plan(weird_tmp, inherited=frozenset({name}))
        assert _cache_env(plan) == [{}] * 3, "the ranks inherit the user's value"
    assert all(spec.compile_cache == "" for spec in plan.ranks)


def test_no_compile_cache_turns_it_off(weird_tmp: Path) -> None:
    plan = _plan(weird_tmp, config={"compile_cache": False})
    assert _cache_env(plan) == [{}] * 3 and plan.ranks[0].compile_cache == ""
    ours = str(weird_tmp / "logs" / COMPILE_CACHE)
    assert not any(path.startswith(ours) for path in plan.ranks[0].files)


def test_the_flag_and_the_config_file_reach_the_plan(weird_tmp: Path) -> None:
    (weird_tmp / "train.py").write_text("")
    (weird_tmp / "off.yaml").write_text("compile-cache: false\n")
    env = _without_cache_vars()
    for options, expected in (((), True), (("--no-compile-cache",), False),
                              (("--config", str(weird_tmp / "off.yaml")), False)):
        result = run_launcher("--dry-run", "--json", "--device", "cpu", "--cards", "2",
                              *options, str(weird_tmp / "train.py"), cwd=weird_tmp, env=env)
        assert result.returncode == 0, result.stderr
        ranks = json.loads(result.stdout)["ranks"]
        assert all((contract.MS_COMPILER_CACHE_PATH in r["env"]) is expected for r in ranks)


# Real jobs ----------------------------------------------------------------------------------------

def _planned_cache(logs: Path) -> Path:
    ranks = json.loads((logs / "plan.json").read_text())["ranks"]
    [path] = {r["env"][contract.MS_COMPILER_CACHE_PATH] for r in ranks}
    return Path(path)


def _graphs(cache: Path, rank: int) -> list[Path]:
    return sorted((cache / f"rank_{rank}" / "graph_cache").glob("*.mindir"))


@pytest.mark.mindspore
def test_a_restart_loads_the_graphs_the_first_attempt_compiled(weird_tmp: Path) -> None:
    """The first attempt compiles and keeps each rank's graphs in the log dir; the restart,
    whose ranks are warm spares (``launcher.run.spares``: MindSpore was imported before the
    script ran, and the script's folders reach the cache's key anyway), loads them, writes none,
    and trains to what the first attempt's compiled graphs did."""
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "cache-restart",
                          "--log-dir", str(logs), "--max-restarts", "1", JOB, "--fail-rank", "1",
                          "--fail-at-end", env=_without_cache_vars())
    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_job_processes("cache-restart")
    out, err = result.stdout, result.stderr
    assert "restart 1 of 1" in err and "job cache-restart failed: rank 1" in err, err[-3000:]
    cache = _planned_cache(logs)
    assert cache.parent == logs / COMPILE_CACHE
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    second = sorted(r["time"] for r in records if r["event"] == "started")[2]
    warm = [(r["rank"], r.get("warm", False)) for r in records if r["event"] == "framework"]
    assert sorted(warm) == [(0, False), (0, True), (1, False), (1, True)], \
        f"the restart's ranks were warm spares, started during the first attempt: {warm}"
    for rank in (0, 1):
        first_attempt, _, restarted = (logs / f"rank_{rank}.log").read_text().partition(LOADED)
        assert COMPILED in first_attempt and restarted, f"rank {rank} compiled, then loaded"
        assert _graphs(cache, rank), sorted(map(str, cache.rglob("*")))
        written = max(p.stat().st_mtime for p in (cache / f"rank_{rank}").rglob("*"))
        assert written < second, f"rank {rank} wrote its cache again after the restart"
    trained = {attempt: {line.split()[-1] for line in out.splitlines()
                         if f"attempt {attempt} checksum " in line} for attempt in (0, 1)}
    assert len(trained[0]) == 1 and trained[0] == trained[1], \
        f"the loaded graphs train as the compiled ones do: {trained}\n{out[-2000:]}"
    assert len(checksums(out)) == 2
