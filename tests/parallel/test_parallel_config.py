"""ParallelConfig: validation (every error line names its numbers), JSON and YAML-section round trips."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Callable

import pytest
import yaml
from helpers import Layout, layouts
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel.config import LayoutError as ConfigError
from parallel.config import ParallelConfig, ParallelMode, ShardPolicy


def test_dp_is_filled_in_from_the_world_size():
    resolved = ParallelConfig(mode="semi", mp=2, pp=2, micro_batches=2).validate(16)
    assert (resolved.dp, resolved.mp, resolved.pp) == (4, 2, 2)


def test_validate_returns_a_copy_and_leaves_the_original_alone():
    config = ParallelConfig()
    assert config.validate(8).dp == 8
    assert config.dp is None


@pytest.mark.parametrize("config, world, nnodes, message", [
    (ParallelConfig(mode="semi", dp=2, mp=2), 8, 1, "dp*mp*pp = 2*2*1 = 4 != world size 8"),
    (ParallelConfig(mode="semi", mp=3), 8, 1, "world size 8 is not divisible by mp*pp = 3*1 = 3"),
    (ParallelConfig(mode="semi", mp=2, pp=4, micro_batches=2), 8, 1,
     "micro_batches 2 < pp 4: a pipeline needs at least one micro-batch per stage"),
    (ParallelConfig(global_batch=30), 4, 1,
     "global batch 30 is not divisible by dp*micro_batches = 4*1 = 4"),
    (ParallelConfig(mode="semi", mp=2, pp=2, micro_batches=3, global_batch=10), 8, 1,
     "global batch 10 is not divisible by dp*micro_batches = 2*3 = 6"),
    (ParallelConfig(mode="semi", pp=2, micro_batches=2), 12, 3,
     "pp 2 stages do not divide 3 nodes evenly: need nnodes % pp == 0 or pp % nnodes == 0"),
    (ParallelConfig(mode="semi", pp=3, micro_batches=3), 12, 2,
     "pp 3 stages do not divide 2 nodes evenly"),
    (ParallelConfig(mp=2), 4, 1, "mode data needs mp = pp = 1, got mp = 2, pp = 1"),
    (ParallelConfig(full_batch=True), 4, 1, "full_batch applies to modes semi and auto only"),
    (ParallelConfig(), 0, 1, "world size must be a positive integer, got 0"),
])
def test_each_bad_layout_is_one_line_naming_the_numbers(config, world, nnodes, message):
    with pytest.raises(ConfigError) as caught:
        config.validate(world, nnodes)
    assert message in caught.value.message
    assert "\n" not in caught.value.message


@pytest.mark.parametrize("pp, nnodes", [(2, 4), (4, 2), (2, 2), (4, 4), (8, 2)])
def test_pipeline_stages_that_align_with_nodes_are_accepted(pp, nnodes):
    resolved = ParallelConfig(mode="semi", pp=pp, micro_batches=pp).validate(16, nnodes)
    assert resolved.dp * resolved.pp == 16


@pytest.mark.parametrize("fields, message", [
    ({"mode": "pipeline"}, "parallel.mode: 'pipeline' is not one of data|semi|auto"),
    ({"shard_policy": "repeat"}, "parallel.shard_policy: 'repeat' is not one of drop|pad"),
    ({"mp": 0}, "parallel.mp: must be >= 1, got 0"),
    ({"mp": "2"}, "parallel.mp: expected an integer, got '2'"),
    ({"dp": True}, "parallel.dp: expected an integer, got True"),
    ({"seed": -1}, "parallel.seed: must be >= 0, got -1"),
    ({"full_batch": "yes"}, "parallel.full_batch: expected true or false, got 'yes'"),
])
def test_bad_field_values_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|").replace("(", r"\(")):
        ParallelConfig(**fields)


def test_a_yaml_section_builds_the_config_and_an_unknown_key_is_named():
    section = yaml.safe_load("mode: semi\nmp: 2\npp: 2\nmicro_batches: 4\nshard_policy: pad\n")
    config = ParallelConfig.from_mapping(section)
    assert (config.mode, config.mp, config.shard_policy) == (ParallelMode.SEMI, 2, ShardPolicy.PAD)
    with pytest.raises(ConfigError, match="parallel: unknown key 'tensor_parallel'"):
        ParallelConfig.from_mapping({"mode": "semi", "tensor_parallel": 2})


def test_broken_json_is_a_config_error():
    with pytest.raises(ConfigError, match="not valid JSON"):
        ParallelConfig.from_json("{mode: semi")
    with pytest.raises(ConfigError, match="must be a JSON object, got list"):
        ParallelConfig.from_json("[1, 2]")


configs = st.builds(
    ParallelConfig, mode=st.sampled_from(ParallelMode), dp=st.none() | st.integers(1, 8),
    mp=st.integers(1, 8), pp=st.integers(1, 8), micro_batches=st.integers(1, 16),
    optimizer_shard=st.booleans(), gradients_mean=st.booleans(), full_batch=st.booleans(),
    global_batch=st.none() | st.integers(1, 512), seed=st.integers(0, 2**31),
    shard_policy=st.sampled_from(ShardPolicy))


@settings(max_examples=60, deadline=None)
@given(configs)
def test_json_round_trip_is_exact(config):
    assert ParallelConfig.from_json(config.to_json()) == config


@settings(max_examples=200, deadline=None)
@given(layouts(nnodes=st.integers(1, 4)))
def test_a_valid_layout_resolves_and_obeys_every_rule(layout: Layout) -> None:
    config, world, nnodes = layout.config, layout.world, layout.nnodes
    resolved = config.validate(world, nnodes)
    assert resolved.dp * resolved.mp * resolved.pp == world
    assert resolved.micro_batches >= resolved.pp
    assert resolved.global_batch is None or resolved.global_batch % (
        resolved.dp * resolved.micro_batches) == 0
    assert resolved.pp == 1 or nnodes % resolved.pp == 0 or resolved.pp % nnodes == 0
    assert resolved.mode is not ParallelMode.DATA or resolved.mp == resolved.pp == 1
    assert resolved == dataclasses.replace(config, dp=world // (config.mp * config.pp))
    assert resolved.validate(world, nnodes) == resolved


@dataclasses.dataclass(frozen=True)
class Broken:
    """A layout with one rule broken, and the words its ``LayoutError`` must say."""

    world: int
    nnodes: int
    config: ParallelConfig
    message: str


def _breakers(layout: Layout, draw: st.DrawFn) -> list[Callable[[], Broken]]:
    """Ways to break exactly one rule of ``layout``: only those that apply to it."""
    c, world, nnodes = layout.config, layout.world, layout.nnodes
    mp, pp, dp = c.mp, c.pp, world // (c.mp * c.pp)
    step = dp * c.micro_batches
    ways = [
        lambda: Broken(world, nnodes, dataclasses.replace(c, dp=dp + draw(st.integers(1, 4))),
                       f"!= world size {world}"),
        lambda: Broken(draw(st.integers(-2, 0)), nnodes, c, "world size must be a positive integer"),
    ]
    if mp * pp > 1:
        ways.append(lambda: Broken(world + draw(st.integers(1, mp * pp - 1)), nnodes,
                                   dataclasses.replace(c, dp=None), "is not divisible by mp*pp"))
        ways.append(lambda: Broken(world, nnodes, dataclasses.replace(c, mode=ParallelMode.DATA,
                                                                     full_batch=False),
                                   f"mode data needs mp = pp = 1, got mp = {mp}, pp = {pp}"))
    else:
        ways.append(lambda: Broken(world, nnodes, dataclasses.replace(c, mode=ParallelMode.DATA,
                                                                     full_batch=True),
                                   "full_batch applies to modes semi and auto only"))
    if pp > 1:
        ways.append(lambda: Broken(world, nnodes, dataclasses.replace(
            c, micro_batches=draw(st.integers(1, pp - 1)), global_batch=None),
            f"< pp {pp}: a pipeline needs at least one micro-batch per stage"))
        ways.append(lambda: Broken(world, pp + 1 + pp * draw(st.integers(0, 3)), c,
                                   f"pp {pp} stages do not divide"))
    if step > 1:
        ways.append(lambda: Broken(world, nnodes, dataclasses.replace(
            c, global_batch=step * draw(st.integers(0, 4)) + draw(st.integers(1, step - 1))),
            f"is not divisible by dp*micro_batches = {dp}*{c.micro_batches} = {step}"))
    return ways


@st.composite
def broken_layouts(draw: st.DrawFn) -> Broken:
    """A valid layout with exactly one of ``validate``'s rules broken."""
    layout = draw(layouts(nnodes=st.integers(1, 4)))
    return draw(st.sampled_from(_breakers(layout, draw)))()


@settings(max_examples=200, deadline=None)
@given(broken_layouts())
def test_a_layout_breaking_one_rule_raises_the_config_error_for_that_rule(broken: Broken) -> None:
    with pytest.raises(ConfigError) as caught:
        broken.config.validate(broken.world, broken.nnodes)
    assert broken.message in caught.value.message
    assert "\n" not in caught.value.message


def test_per_rank_batch_is_the_share_or_the_whole_under_full_batch():
    assert ParallelConfig(global_batch=32).validate(4).per_rank_batch == 8
    full = ParallelConfig(mode="semi", mp=2, full_batch=True, global_batch=32)
    assert full.validate(4).per_rank_batch == 32


def test_the_launcher_can_import_the_config_without_mindspore():
    code = ("import sys, parallel, parallel.config, parallel.mode.topology; "
            "parallel.RankInfo; assert 'mindspore' not in sys.modules, 'mindspore imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
