"""Where each rank sits in a dp x mp x pp layout, which ranks it talks to, and which data it reads.

Pure Python. The ordering is MindSpore's: the pipeline stage is outermost
(``stage = rank // (world / pp)``); inside a stage the model-parallel index is innermost, so the
``mp`` ranks of one model-parallel group are consecutive (on Ascend they share a server's fast
links), and the data-parallel index strides over them.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

from parallel.config import DeviceTarget, ExecMode, ParallelConfig


@dataclasses.dataclass(frozen=True)
class RankCoordinates:
    """A rank's position: its data-parallel replica, model-parallel slice and pipeline stage."""

    dp_index: int
    mp_index: int
    pp_stage: int


@dataclasses.dataclass(frozen=True)
class RankGroups:
    """The global ranks of each communication group a rank belongs to (itself included, sorted)."""

    dp: Tuple[int, ...]
    """Same model slice and stage, other data: gradients are all-reduced over these."""
    mp: Tuple[int, ...]
    """Same data and stage, other slices of the model: tensor-parallel collectives."""
    pp: Tuple[int, ...]
    """Same data and slice, one rank per stage: activations flow through these in order."""


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """What ``parallel.init()`` returns: who this rank is and how the job is laid out."""

    rank: int
    world_size: int
    local_rank: int
    device_id: int
    device_target: DeviceTarget
    coords: RankCoordinates
    groups: RankGroups
    config: ParallelConfig
    """Resolved: ``dp`` is always set."""
    exec_mode: ExecMode = ExecMode.GRAPH
    exec_mode_source: str = "parallel.init()"
    """Who chose ``exec_mode``, for messages: ``parallel.init()``, ``--debug``, ``exec_mode=...``."""

    @classmethod
    def in_layout(cls, rank: int, world_size: int, config: ParallelConfig, *, local_rank: int = 0,
                  device_id: int = 0, device_target: DeviceTarget = DeviceTarget.CPU) -> "RankInfo":
        """Describe ``rank`` of ``world_size`` under ``config`` (validated here), without MindSpore."""
        resolved = config.validate(world_size)
        _check_rank(rank, world_size)
        return cls(rank=rank, world_size=world_size, local_rank=local_rank, device_id=device_id,
                   device_target=device_target, coords=coordinates_of(rank, resolved, world_size),
                   groups=groups_of(rank, resolved, world_size), config=resolved)

    @property
    def shard(self) -> Tuple[int, int]:
        """``(num_shards, shard_id)`` of the data this rank reads; see ``shard_of``."""
        return shard_of(self.rank, self.config, self.world_size)


def coordinates_of(rank: int, config: ParallelConfig, world: int) -> RankCoordinates:
    """Where ``rank`` sits in the layout of ``config`` over ``world`` ranks."""
    resolved = config.validate(world)
    _check_rank(rank, world)
    stage_size = world // resolved.pp
    local = rank % stage_size
    return RankCoordinates(dp_index=local // resolved.mp, mp_index=local % resolved.mp,
                           pp_stage=rank // stage_size)


def rank_at(coords: RankCoordinates, config: ParallelConfig, world: int) -> int:
    """The global rank at ``coords``: the inverse of ``coordinates_of``."""
    resolved = config.validate(world)
    stage_size = world // resolved.pp
    return coords.pp_stage * stage_size + coords.dp_index * resolved.mp + coords.mp_index


def groups_of(rank: int, config: ParallelConfig, world: int) -> RankGroups:
    """The dp, mp and pp groups ``rank`` belongs to."""
    resolved = config.validate(world)
    here = coordinates_of(rank, resolved, world)

    def along(field: str, size: int) -> Tuple[int, ...]:
        return tuple(rank_at(dataclasses.replace(here, **{field: index}), resolved, world)
                     for index in range(size))

    return RankGroups(dp=along("dp_index", world // (resolved.mp * resolved.pp)),
                      mp=along("mp_index", resolved.mp), pp=along("pp_stage", resolved.pp))


def shard_of(rank: int, config: ParallelConfig, world: int) -> Tuple[int, int]:
    """``(num_shards, shard_id)`` of the data ``rank`` reads.

    Plain data parallelism: ``world`` shards, one per rank. Semi/auto parallel (MindFormers'
    formula): ``dp`` shards, ``shard_id = rank % (world // pp) // mp``, i.e. the data-parallel index,
    so the ranks of one model-parallel group and of every pipeline stage read the same shard.
    ``full_batch``: every rank reads everything, one shard.
    """
    resolved = config.validate(world)
    _check_rank(rank, world)
    if resolved.full_batch:
        return 1, 0
    return world // (resolved.mp * resolved.pp), rank % (world // resolved.pp) // resolved.mp


def _check_rank(rank: int, world: int) -> None:
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside world size {world}")
