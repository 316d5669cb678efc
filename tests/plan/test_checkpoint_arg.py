"""``{checkpoint}`` in the script's arguments: replaced, for each rank and on every attempt,
by its newest checkpoint, or the default; ``${checkpoint}`` is not ours; the same path in
``NPU_LAUNCH_CHECKPOINT``."""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.devices import Card, DeviceKind
from launcher.config.launch_config import LaunchConfig
from launcher.plan.checkpoint_arg import dry_run_note, has_placeholder, substitute, with_checkpoints
from launcher.plan.launch_plan import LaunchPlan, Node
from launcher.plan.planner import PlanInputs, build_plan
from parallel import contract


@pytest.mark.parametrize("arg, path, becomes", [
    ("{checkpoint}", "/c/n-3_3.ckpt", "/c/n-3_3.ckpt"),
    ("{checkpoint}", None, ""),
    ("--ckpt_path={checkpoint}", "/c/x.ckpt", "--ckpt_path=/c/x.ckpt"),
    ("{checkpoint:-}", None, ""),
    ("{checkpoint:-pretrained.ckpt}", None, "pretrained.ckpt"),
    ("{checkpoint:-pretrained.ckpt}", "/c/x.ckpt", "/c/x.ckpt"),
    ("${checkpoint}", "/c/x.ckpt", "${checkpoint}"),
    ("{checkpoints}", "/c/x.ckpt", "{checkpoints}"),
])
def test_placeholder_forms(arg: str, path, becomes: str) -> None:
    assert substitute([arg], path) == (becomes,)
    assert has_placeholder([arg]) == (becomes != arg)


def _plan(tmp: Path, *args: str) -> LaunchPlan:
    script = tmp / "train.py"
    script.write_text("")
    config = LaunchConfig(script=str(script), python="/usr/bin/python3", workdir=str(tmp),
                          script_args=args)
    return build_plan(config, PlanInputs(job_id="j", log_dir=str(tmp / "logs"),
                                         master_addr="10.0.0.1", master_port=29500,
                                         device=DeviceKind.CPU,
                                         nodes=(Node("a", 0, (Card(0, 0), Card(1, 1))),)))


def test_every_attempt_gets_each_ranks_newest(weird_tmp: Path) -> None:
    plan = _plan(weird_tmp, "--ckpt_path", "{checkpoint}", "--lr", "0.1")
    first = with_checkpoints(plan, {})
    assert [s.argv[2:] for s in first.ranks] == [("--ckpt_path", "", "--lr", "0.1")] * 2
    assert all(contract.CHECKPOINT not in s.env for s in first.ranks)
    assert dry_run_note(first, {}) is not None
    paths = {0: "/c/r0 x/n-1_5.ckpt", 1: "/c/r1/n-1_5.ckpt"}
    again = with_checkpoints(first.restarted(1), paths)
    assert [s.argv[3] for s in again.ranks] == list(paths.values())
    assert [s.env[contract.CHECKPOINT] for s in again.ranks] == list(paths.values())
    assert dry_run_note(again, paths) is None
    assert LaunchPlan.from_json(again.to_json()) == again, "agents get the same plan"
    later = with_checkpoints(again.restarted(2), {0: "/c/n-2_5.ckpt", 1: "/c/n-2_5.ckpt"})
    assert {s.argv[3] for s in later.ranks} == {"/c/n-2_5.ckpt"}


def test_without_the_placeholder_only_the_variable_is_given(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "--lr", "0.1")
    given = with_checkpoints(plan, {0: "/c/a.ckpt", 1: "/c/a.ckpt"})
    assert plan.script_argv == () and [s.argv for s in given.ranks] == [s.argv for s in plan.ranks]
    assert {s.env[contract.CHECKPOINT] for s in given.ranks} == {"/c/a.ckpt"}
    assert dry_run_note(given, {}) is None
