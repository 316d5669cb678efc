"""How a job is split across its ranks: data x model x pipeline parallelism.

Pure Python on purpose: the launcher imports this module to check a configuration before it starts
anything, and must not need MindSpore for that. ``ParallelConfig`` crosses to the ranks as JSON in
``contract.PARALLEL``.

Rules ``validate`` enforces, each failure one ``LayoutError`` line naming the numbers:

* ``dp * mp * pp == world size`` (``dp`` is filled in as ``world / (mp * pp)`` when left out);
* ``micro_batches >= pp``: a pipeline needs at least one micro-batch per stage to keep every stage
  busy, and MindSpore refuses fewer;
* the global batch, when given, divides by ``dp * micro_batches`` (each data-parallel replica
  splits its share into equal micro-batches);
* with ``pp > 1`` on several nodes, either ``nnodes % pp == 0`` (every stage owns whole nodes) or
  ``pp % nnodes == 0`` (every node owns whole stages). Both are accepted: what matters is that no
  stage straddles a node boundary, since a stage's model-parallel and data-parallel collectives are
  its heaviest traffic and must not cross the slow link for some stages only;
* mode ``data`` means ``mp == pp == 1``; ``full_batch`` only exists in ``semi``/``auto``.
"""
from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Mapping, Optional

from parallel.contract import BadInput, shown


class ParallelMode(str, enum.Enum):
    """The parallel mode; each maps to one MindSpore ``parallel_mode``."""

    DATA = "data"
    SEMI = "semi"
    AUTO = "auto"

    @property
    def mindspore_name(self) -> str:
        """The value ``mindspore.set_auto_parallel_context(parallel_mode=...)`` takes."""
        return {"data": "data_parallel", "semi": "semi_auto_parallel",
                "auto": "auto_parallel"}[self.value]


class ShardPolicy(str, enum.Enum):
    """What a rank does with the samples left over when the shards do not divide the data.

    ``drop``: every shard gets ``floor(N / shards)`` samples; up to ``shards - 1`` samples are
    skipped per epoch (a different few each epoch when shuffling).
    ``pad``: every shard gets ``ceil(N / shards)`` samples; the missing ones repeat samples from
    the start of the epoch's order, so a few samples count twice.
    """

    DROP = "drop"
    PAD = "pad"


class DeviceTarget(str, enum.Enum):
    """Where a rank computes; the values are MindSpore's device target names."""

    ASCEND = "Ascend"
    CPU = "CPU"


class ExecMode(str, enum.Enum):
    """How MindSpore runs a rank's cells: compiled whole (graph) or op by op (PyNative).

    ``parallel.init()`` selects ``GRAPH`` unless asked otherwise: MindSpore's own default is
    PyNative, which runs the digits job's train step about 2x slower on CPU.
    """

    GRAPH = "graph"
    PYNATIVE = "pynative"


class LayoutError(BadInput):
    """A parallel layout that cannot be: one line naming the numbers (exit 2 at the CLI)."""


_INT_FIELDS = ("dp", "mp", "pp", "micro_batches", "global_batch", "seed")
_BOOL_FIELDS = ("optimizer_shard", "gradients_mean", "full_batch")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """The parallel layout of one job; ``validate`` checks it against a world size."""

    mode: ParallelMode = ParallelMode.DATA
    dp: Optional[int] = None
    mp: int = 1
    pp: int = 1
    micro_batches: int = 1
    optimizer_shard: bool = False
    gradients_mean: bool = True
    full_batch: bool = False
    global_batch: Optional[int] = None
    seed: int = 1
    shard_policy: ShardPolicy = ShardPolicy.DROP

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _enum(ParallelMode, self.mode, "mode"))
        object.__setattr__(self, "shard_policy", _enum(ShardPolicy, self.shard_policy, "shard_policy"))
        for name in _INT_FIELDS:
            _check_int(name, getattr(self, name), optional=name in ("dp", "global_batch"))
        for name in _BOOL_FIELDS:
            _check_bool(name, getattr(self, name))

    @property
    def needs_ascend(self) -> bool:
        """True when MindSpore can run this layout on Ascend (or GPU) only, never on CPU."""
        return self.mode is not ParallelMode.DATA or self.mp > 1 or self.pp > 1

    @property
    def per_rank_batch(self) -> Optional[int]:
        """The batch one rank feeds per step: the global batch, or its share of it."""
        if self.global_batch is None or self.dp is None:
            return None
        return self.global_batch if self.full_batch else self.global_batch // self.dp

    def validate(self, world_size: int, nnodes: int = 1) -> "ParallelConfig":
        """Return a copy with ``dp`` resolved for ``world_size``; raise ``LayoutError`` if it cannot fit."""
        _check_positive("world size", world_size)
        _check_positive("nnodes", nnodes)
        dp = self._resolve_dp(world_size)
        self._check_mode()
        self._check_pipeline(nnodes)
        self._check_global_batch(dp)
        return dataclasses.replace(self, dp=dp)

    def to_json(self) -> str:
        """Serialise for ``contract.PARALLEL``; ``from_json`` reads it back."""
        return json.dumps({f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ParallelConfig":
        """Read what ``to_json`` wrote; a broken string raises ``LayoutError``."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LayoutError(f"parallel config is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise LayoutError(f"parallel config must be a JSON object, got {type(data).__name__}")
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "ParallelConfig":
        """Build from a YAML ``parallel:`` section; an unknown key raises ``LayoutError`` naming it."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in known:
                raise LayoutError(f"parallel: unknown key {key!r} (known: {', '.join(known)})")
        return cls(**dict(data))

    def _resolve_dp(self, world: int) -> int:
        model = self.mp * self.pp
        if self.dp is None:
            if world % model:
                raise LayoutError(f"world size {world} is not divisible by mp*pp = "
                                  f"{self.mp}*{self.pp} = {model}")
            return world // model
        if self.dp * model != world:
            raise LayoutError(f"dp*mp*pp = {self.dp}*{self.mp}*{self.pp} = {self.dp * model} "
                              f"!= world size {world}")
        return self.dp

    def _check_mode(self) -> None:
        if self.mode is ParallelMode.DATA and (self.mp > 1 or self.pp > 1):
            raise LayoutError(f"mode data needs mp = pp = 1, got mp = {self.mp}, pp = {self.pp}; "
                              f"use mode semi or auto for model or pipeline parallelism")
        if self.mode is ParallelMode.DATA and self.full_batch:
            raise LayoutError("full_batch applies to modes semi and auto only, not data")

    def _check_pipeline(self, nnodes: int) -> None:
        if self.micro_batches < self.pp:
            raise LayoutError(f"micro_batches {self.micro_batches} < pp {self.pp}: a pipeline needs "
                              f"at least one micro-batch per stage")
        if self.pp > 1 and nnodes > 1 and nnodes % self.pp and self.pp % nnodes:
            raise LayoutError(f"pp {self.pp} stages do not divide {nnodes} nodes evenly: need "
                              f"nnodes % pp == 0 or pp % nnodes == 0")

    def _check_global_batch(self, dp: int) -> None:
        if self.global_batch is None:
            return
        step = dp * self.micro_batches
        if self.global_batch % step:
            raise LayoutError(f"global batch {self.global_batch} is not divisible by "
                              f"dp*micro_batches = {dp}*{self.micro_batches} = {step}")


def _enum(kind: type[enum.Enum], value: Any, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = "|".join(member.value for member in kind)
        raise LayoutError(f"parallel.{name}: {value!r} is not one of {choices}") from None


_MAX_SEED = 2**32 - 1  # numpy's and MindSpore's seeds are 32-bit
_MAX_SIZE = 2**31 - 1


def _check_int(name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise LayoutError(f"parallel.{name}: expected an integer, got {value!r}")
    low, high = (0, _MAX_SEED) if name == "seed" else (1, _MAX_SIZE)
    if value < low:
        raise LayoutError(f"parallel.{name}: must be >= {low}, got {value}")
    if value > high:
        raise LayoutError(f"parallel.{name}: must be at most {high}, got {shown(value)}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise LayoutError(f"parallel.{name}: expected true or false, got {value!r}")


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LayoutError(f"{name} must be a positive integer, got {value!r}")


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value
