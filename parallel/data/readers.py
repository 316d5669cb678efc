"""Every rank's input pipeline: one call gives a sharded, batched MindSpore dataset.

``sharded_dataset`` reads MindRecord files (``MindDataset``), image folders (``ImageFolderDataset``),
NumPy arrays (``NumpySlicesDataset``) and random-access Python sources (``GeneratorDataset``),
and guarantees, for every reader:

* the shards of the ranks in one data-parallel group are disjoint and together cover the data,
  except for what the shard policy declares (``drop`` skips at most ``shards - 1`` samples per
  epoch, ``pad`` repeats at most ``shards - 1``);
* every rank gets the same number of samples, hence of batches, each epoch, so no rank waits in an
  all-reduce for a peer that has run out of data;
* each epoch is reshuffled, identically on every rank, from ``config.seed`` and the epoch number,
  so a run that restarts with ``epoch=e`` reads exactly what epoch ``e`` read before.

How: the three readers that take Python samplers get ``EpochShardSampler``, which computes the
epoch's order with NumPy. ``MindDataset`` accepts only MindSpore's built-in samplers, so it gets a
``DistributedSampler`` limited to ``samples_per_shard`` (its shard ``i`` reads positions
``i, i + S, i + 2S, ...`` of the epoch's shuffled order, wrapping around, which is the same
drop/pad arithmetic). That sampler takes its seed from ``mindspore.dataset.config`` when it is built
and adds one per epoch; ``sharded_dataset`` sets ``seed + epoch`` there for the duration of the
build and restores the previous value.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import mindspore.dataset as ds
import numpy as np

from parallel import contract, events
from parallel.config import ShardPolicy
from parallel.mode.topology import RankInfo


class RandomAccess(Protocol):
    """A random-access source: any object with ``__getitem__`` and ``__len__``."""

    def __getitem__(self, index: int) -> Any: ...

    def __len__(self) -> int: ...


Paths = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]
"""MindRecord file(s): one path or a list of them."""
Source = Union[Paths, Sequence[Any], Mapping[str, np.ndarray], np.ndarray, RandomAccess]


class SourceKind(str, enum.Enum):
    """Which MindSpore reader a source goes to."""

    MINDRECORD = "mindrecord"
    """A MindRecord file or list of files (any one file of a set finds its siblings)."""
    IMAGE_FOLDER = "image_folder"
    """A directory with one sub-directory of images per class."""
    NUMPY = "numpy"
    """A dict of equally long arrays (one column each), one array, or a tuple of arrays."""
    RANDOM_ACCESS = "random_access"
    """Anything else with ``__getitem__(int)`` and ``__len__``, returning a tuple per sample."""


def source_kind(source: Any) -> SourceKind:
    """Classify ``source``; a path is an image folder if it is a directory, else MindRecord."""
    if isinstance(source, (str, os.PathLike)):
        return SourceKind.IMAGE_FOLDER if Path(source).is_dir() else SourceKind.MINDRECORD
    if isinstance(source, (Mapping, np.ndarray)) or _is_array_tuple(source):
        return SourceKind.NUMPY
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(item, (str, os.PathLike)) for item in source):
        return SourceKind.MINDRECORD
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        return SourceKind.RANDOM_ACCESS
    raise TypeError(f"cannot read {type(source).__name__}: pass MindRecord path(s), an image folder, "
                    f"NumPy arrays or an object with __getitem__ and __len__")


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Which samples one shard reads in each epoch; pure arithmetic, no MindSpore."""

    num_shards: int
    shard_id: int
    seed: int
    first_epoch: int = 0
    shuffle: bool = True
    policy: ShardPolicy = ShardPolicy.DROP

    def samples_per_shard(self, num_samples: int) -> int:
        """The same for every shard: ``floor`` (drop) or ``ceil`` (pad) of ``num_samples / shards``."""
        if num_samples < 1:
            raise ValueError("the source has no samples")
        if self.policy is ShardPolicy.DROP and num_samples < self.num_shards:
            raise ValueError(f"{num_samples} samples cannot give each of {self.num_shards} shards one "
                             f"sample under shard policy drop; use pad or fewer ranks")
        return -(-num_samples // self.num_shards) if self.policy is ShardPolicy.PAD \
            else num_samples // self.num_shards

    def order(self, num_samples: int, epoch: int) -> List[int]:
        """The sample indices this shard reads in ``epoch``, in reading order."""
        every = self._epoch_order(num_samples, epoch)
        positions = self.shard_id + self.num_shards * np.arange(self.samples_per_shard(num_samples))
        return every[positions % num_samples].tolist()

    def _epoch_order(self, num_samples: int, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(num_samples)
        return np.random.default_rng([self.seed, epoch]).permutation(num_samples)


class EpochShardSampler(ds.Sampler):
    """A MindSpore sampler yielding ``plan.order`` for one epoch per ``__iter__`` call.

    MindSpore calls ``__iter__`` once per epoch, and copies the sampler for each new iterator,
    so every iterator starts again at ``plan.first_epoch``.
    """

    def __init__(self, plan: ShardPlan, num_samples: int) -> None:
        self.plan = plan
        self.total_samples = num_samples
        self.epochs_started = 0
        super().__init__()

    def __iter__(self) -> Iterator[int]:
        epoch = self.plan.first_epoch + self.epochs_started
        self.epochs_started += 1
        return iter(self.plan.order(self.total_samples, epoch))

    def __len__(self) -> int:
        return self.plan.samples_per_shard(self.total_samples)


def sharded_dataset(source: Source, info: RankInfo, batch_size: int, shuffle: bool = True, *,
                    columns: Optional[Sequence[str]] = None,
                    policy: Union[ShardPolicy, str, None] = None,
                    drop_remainder: Optional[bool] = None, num_workers: int = 1, epoch: int = 0,
                    transforms: Optional[Mapping[str, Sequence[Any]]] = None,
                    reader_options: Optional[Mapping[str, Any]] = None) -> ds.Dataset:
    """This rank's shard of ``source``, mapped and batched.

    ``info`` decides the shard (``info.shard``: ``dp`` shards under semi/auto, one under
    ``full_batch``). ``policy`` defaults to ``info.config.shard_policy``; ``drop_remainder``
    defaults to True under drop (so up to ``batch_size - 1`` more samples per rank go unread),
    False under pad (the last batch is then short on every rank alike). ``epoch`` is the epoch
    the first iteration reads (for resuming). ``transforms`` maps a
    column to the operations applied to it before batching; ``reader_options`` go to the reader's
    constructor (e.g. ``extensions`` for image folders). Image folders are decoded unless
    ``reader_options`` says ``decode=False``; Python sources run in threads unless it says
    ``python_multiprocessing=True``.
    """
    plan = ShardPlan(*info.shard, seed=info.config.seed, first_epoch=epoch, shuffle=shuffle,
                     policy=ShardPolicy(policy or info.config.shard_policy))
    if drop_remainder is None:
        drop_remainder = plan.policy is ShardPolicy.DROP
    batch_size = kept_global_batch(batch_size, plan.num_shards, drop_remainder)
    kind = source_kind(source)
    dataset = _READERS[kind](source, plan, columns, num_workers, dict(reader_options or {}))
    for column, operations in (transforms or {}).items():
        dataset = dataset.map(list(operations), input_columns=column, num_parallel_workers=num_workers)
    if drop_remainder:
        events.emit(contract.EVENT_DATA, batch_size=batch_size,
                    global_batch=batch_size * plan.num_shards, planned_world=_planned_world())
    return dataset.batch(batch_size, drop_remainder=drop_remainder, num_parallel_workers=num_workers)


def kept_global_batch(batch_size: int, shards: int, exact: bool) -> int:
    """This rank's batch: ``batch_size``, or, when the job goes on with fewer ranks than
    planned (``contract.PLANNED_WORLD``: npu-launch's ``--min-nodes`` left a host out), the
    planned global batch over the shards there are now. Global batch ``t`` then holds the same
    samples as before (positions ``t*G .. (t+1)*G - 1`` of the epoch's order), and an epoch
    has as many batches, so a resumed position means the same data. ``exact`` (batches of
    equal size): the global batch must divide, else ``BadInput``; otherwise rounded up."""
    planned, world = _planned_world(), int(os.environ.get(contract.RANK_SIZE, "0") or 0)
    if planned is None or world < 1 or planned <= world or shards < 2:
        return batch_size
    planned_shards, rest = divmod(shards * planned, world)
    total = batch_size * planned_shards
    if rest == 0 and total % shards == 0:
        return total // shards
    if exact:
        raise contract.BadInput(f"the global batch of {total} ({batch_size} on each of "
                                f"{planned_shards} planned shards) does not split over {shards} "
                                f"shards now that {planned - world} rank(s) were left out")
    return -(-total // shards)


def _planned_world() -> Optional[int]:
    text = os.environ.get(contract.PLANNED_WORLD, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _mindrecord(source: Paths, plan: ShardPlan, columns: Optional[Sequence[str]], workers: int,
                options: Dict[str, Any]) -> ds.Dataset:
    files = _paths(source)
    total = ds.MindDataset(files, columns_list=_list(columns)).get_dataset_size()
    with _dataset_seed(plan.seed + plan.first_epoch):
        sampler = ds.DistributedSampler(plan.num_shards, plan.shard_id, shuffle=plan.shuffle,
                                        num_samples=plan.samples_per_shard(total))
    return ds.MindDataset(files, columns_list=_list(columns), num_parallel_workers=workers,
                          sampler=sampler, **options)


def _image_folder(source: Source, plan: ShardPlan, columns: Optional[Sequence[str]], workers: int,
                  options: Dict[str, Any]) -> ds.Dataset:
    options = {"decode": True, **options}
    total = ds.ImageFolderDataset(str(source), **options).get_dataset_size()
    dataset = ds.ImageFolderDataset(str(source), num_parallel_workers=workers,
                                    sampler=EpochShardSampler(plan, total), **options)
    return dataset.project(list(columns)) if columns else dataset


def _numpy(source: Source, plan: ShardPlan, columns: Optional[Sequence[str]], workers: int,
           options: Dict[str, Any]) -> ds.Dataset:
    data, names = _numpy_columns(source, _list(columns))
    return ds.NumpySlicesDataset(data, column_names=names, num_parallel_workers=workers,
                                 sampler=EpochShardSampler(plan, _numpy_length(data)), **options)


def _numpy_columns(source: Any, names: Optional[List[str]]) -> Tuple[Any, Optional[List[str]]]:
    if isinstance(source, Mapping):
        return {name: np.asarray(source[name]) for name in (names or list(source))}, None
    if isinstance(source, np.ndarray):
        return source, names or ["data"]
    return tuple(source), names


def _numpy_length(data: Any) -> int:
    if isinstance(data, Mapping):
        return len(next(iter(data.values())))
    return len(data if isinstance(data, np.ndarray) else data[0])


def _random_access(source: RandomAccess, plan: ShardPlan, columns: Optional[Sequence[str]], workers: int,
                   options: Dict[str, Any]) -> ds.Dataset:
    if not columns:
        raise ValueError("a random-access source needs columns=[...] naming the fields of a sample")
    options = {"python_multiprocessing": False, **options}
    return ds.GeneratorDataset(source, column_names=list(columns), num_parallel_workers=workers,
                               sampler=EpochShardSampler(plan, len(source)), **options)


_READERS: Dict[SourceKind, Callable[..., ds.Dataset]] = {
    SourceKind.MINDRECORD: _mindrecord,
    SourceKind.IMAGE_FOLDER: _image_folder,
    SourceKind.NUMPY: _numpy,
    SourceKind.RANDOM_ACCESS: _random_access,
}


@contextlib.contextmanager
def _dataset_seed(seed: int) -> Iterator[None]:
    # The global dataset seed also drives random augmentations; leave it as the caller set it.
    previous = ds.config.get_seed()
    ds.config.set_seed(seed)
    try:
        yield
    finally:
        ds.config.set_seed(previous)


def _paths(source: Paths) -> Union[str, List[str]]:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return [str(path) for path in source]


def _list(columns: Optional[Sequence[str]]) -> Optional[List[str]]:
    return list(columns) if columns else None


def _is_array_tuple(source: Any) -> bool:
    return isinstance(source, tuple) and bool(source) and all(
        isinstance(item, np.ndarray) for item in source)
