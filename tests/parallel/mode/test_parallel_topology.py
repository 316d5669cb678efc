"""Coordinates, groups and data shards of every rank in dp x mp x pp layouts (pure Python)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import Layout, layouts
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel.config import ParallelConfig
from parallel.mode.topology import RankCoordinates, RankInfo, coordinates_of, groups_of, rank_at, shard_of

WORLD_16 = 16
LAYOUT_16 = ParallelConfig(mode="semi", dp=2, mp=4, pp=2, micro_batches=2)

# Written out by hand for 16 = 2 dp x 4 mp x 2 pp: stage 0 is ranks 0-7, stage 1 is 8-15;
# inside a stage, mp groups are runs of 4 consecutive ranks, and the dp index picks the run.
EXPECTED_16 = {
    0: ((0, 0, 0), (0, 4), (0, 1, 2, 3), (0, 8)),
    1: ((0, 1, 0), (1, 5), (0, 1, 2, 3), (1, 9)),
    3: ((0, 3, 0), (3, 7), (0, 1, 2, 3), (3, 11)),
    4: ((1, 0, 0), (0, 4), (4, 5, 6, 7), (4, 12)),
    6: ((1, 2, 0), (2, 6), (4, 5, 6, 7), (6, 14)),
    8: ((0, 0, 1), (8, 12), (8, 9, 10, 11), (0, 8)),
    11: ((0, 3, 1), (11, 15), (8, 9, 10, 11), (3, 11)),
    13: ((1, 1, 1), (9, 13), (12, 13, 14, 15), (5, 13)),
    15: ((1, 3, 1), (11, 15), (12, 13, 14, 15), (7, 15)),
}


@pytest.mark.parametrize("rank", sorted(EXPECTED_16))
def test_hand_written_ranks_of_2dp_4mp_2pp(rank):
    coords, dp, mp, pp = EXPECTED_16[rank]
    assert coordinates_of(rank, LAYOUT_16, WORLD_16) == RankCoordinates(*coords)
    groups = groups_of(rank, LAYOUT_16, WORLD_16)
    assert (groups.dp, groups.mp, groups.pp) == (dp, mp, pp)


def test_every_rank_of_2dp_4mp_2pp_matches_a_reshaped_rank_grid():
    # MindSpore's device matrix for this layout: ranks laid out as [pp][dp][mp], mp fastest.
    grid = np.arange(WORLD_16).reshape(2, 2, 4)
    for stage, replica, piece in itertools.product(range(2), range(2), range(4)):
        rank = int(grid[stage, replica, piece])
        groups = groups_of(rank, LAYOUT_16, WORLD_16)
        assert coordinates_of(rank, LAYOUT_16, WORLD_16) == RankCoordinates(replica, piece, stage)
        assert groups.dp == tuple(grid[stage, :, piece].tolist())
        assert groups.mp == tuple(grid[stage, replica, :].tolist())
        assert groups.pp == tuple(grid[:, replica, piece].tolist())


def test_shards_of_2dp_4mp_2pp_follow_the_mindformers_formula():
    shards = [shard_of(rank, LAYOUT_16, WORLD_16) for rank in range(WORLD_16)]
    assert shards == [(2, rank % 8 // 4) for rank in range(WORLD_16)]
    # Same mp group or same pp group: same data.
    for rank in range(WORLD_16):
        groups = groups_of(rank, LAYOUT_16, WORLD_16)
        assert {shards[r] for r in groups.mp + groups.pp} == {shards[rank]}


def test_plain_data_parallel_gives_one_shard_per_rank_and_full_batch_one_for_all():
    assert [shard_of(r, ParallelConfig(), 4) for r in range(4)] == [(4, r) for r in range(4)]
    full = ParallelConfig(mode="semi", mp=2, full_batch=True)
    assert {shard_of(r, full, 4) for r in range(4)} == {(1, 0)}


def test_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="rank 16 is outside world size 16"):
        coordinates_of(16, LAYOUT_16, WORLD_16)


@settings(max_examples=80, deadline=None)
@given(layouts())
def test_groups_partition_the_world_and_coordinates_invert(layout: Layout) -> None:
    world, config = layout.world, layout.config
    infos = [RankInfo.in_layout(rank, world, config) for rank in range(world)]
    for kind, size in (("dp", infos[0].config.dp), ("mp", config.mp), ("pp", config.pp)):
        groups = {getattr(info.groups, kind) for info in infos}
        assert sorted(itertools.chain.from_iterable(groups)) == list(range(world)), kind
        assert {len(group) for group in groups} == {size}, kind
        assert all(info.rank in getattr(info.groups, kind) for info in infos), kind
    assert [rank_at(info.coords, config, world) for info in infos] == list(range(world))


@settings(max_examples=80, deadline=None)
@given(layouts(full_batch=st.just(False)))
def test_a_dp_group_reads_every_shard_once(layout: Layout) -> None:
    world, config = layout.world, layout.config
    for rank in range(world):
        group = groups_of(rank, config, world).dp
        shards = [shard_of(member, config, world) for member in group]
        assert sorted(shard_id for _, shard_id in shards) == list(range(len(group)))
        assert {count for count, _ in shards} == {len(group)}
