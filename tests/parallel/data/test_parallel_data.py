"""sharded_dataset with real MindSpore readers over real files: disjoint, complete, equally long shards.

Every sample carries its own id (a column, or the pixel values of an image), so the tests see
exactly which samples each rank read.
"""
from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.transforms as transforms
import numpy as np
import pytest
from helpers import REPO, layouts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from parallel import contract
from parallel.config import ParallelConfig, ShardPolicy
from parallel.contract import BadInput
from parallel.data import (
    ShardPlan,
    SourceKind,
    kept_global_batch,
    sharded_dataset,
    source_kind,
    write_mindrecord,
    write_mindrecord_from_folder,
)
from parallel.mode.topology import RankInfo

pytestmark = pytest.mark.mindspore
KINDS = list(SourceKind)


class Samples:
    """A random-access source: sample ``i`` is ``(id, features)``."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        return np.array(index, np.int64), np.full((2, 2), index, np.float32)

    def __len__(self) -> int:
        return self.count


class Store:
    """Writes each source once per sample count, under a directory with a space and a quote."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: Dict[Tuple[SourceKind, int], Any] = {}

    def source(self, kind: SourceKind, count: int) -> Any:
        if (kind, count) not in self.made:
            self.made[kind, count] = self._make(kind, count)
        return self.made[kind, count]

    def _make(self, kind: SourceKind, count: int) -> Any:
        if kind is SourceKind.MINDRECORD:
            files = write_mindrecord(_arrays(count), self.root / f"n{count} set.mindrecord",
                                     num_files=1 + count % 3)
            return str(files[0])
        if kind is SourceKind.IMAGE_FOLDER:
            return str(_image_folder(self.root / f"images {count}", count))
        if kind is SourceKind.NUMPY:
            return _arrays(count)
        return Samples(count)


def _arrays(count: int) -> Dict[str, np.ndarray]:
    return {"id": np.arange(count, dtype=np.int64),
            "x": np.arange(count * 4, dtype=np.float32).reshape(count, 2, 2)}


def _image_folder(root: Path, count: int) -> Path:
    for index in range(count):
        folder = root / f"class {index % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.zeros((8, 8, 3), np.uint8)
        pixels[..., 0], pixels[..., 1] = index % 256, index // 256
        Image.fromarray(pixels).save(folder / f"{index:04d}.png")
    return root


def _columns(kind: SourceKind) -> List[str]:
    return ["image"] if kind is SourceKind.IMAGE_FOLDER else ["id", "x"]


def _ids(batch: np.ndarray, kind: SourceKind) -> List[int]:
    if kind is SourceKind.IMAGE_FOLDER:
        return (batch[:, 0, 0, 0].astype(int) + 256 * batch[:, 0, 0, 1].astype(int)).tolist()
    return batch.reshape(-1).tolist()


def read_epochs(dataset: ds.Dataset, kind: SourceKind, epochs: int = 2) -> List[List[List[int]]]:
    """The ids of each batch of each epoch, through one iterator as training does."""
    iterator = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
    return [[_ids(batch[0], kind) for batch in iterator] for _ in range(epochs)]


def read_rank(store: Store, kind: SourceKind, count: int, info: RankInfo, batch_size: int,
              epochs: int = 2, **options: Any) -> List[List[List[int]]]:
    dataset = sharded_dataset(store.source(kind, count), info, batch_size,
                              columns=_columns(kind), **options)
    return read_epochs(dataset, kind, epochs)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return Store(tmp_path_factory.mktemp("data with 'quotes' and spaces"))


def expected_per_rank(count: int, shards: int, batch_size: int, policy: ShardPolicy) -> int:
    if policy is ShardPolicy.PAD:
        return math.ceil(count / shards)
    return count // shards // batch_size * batch_size


@pytest.mark.parametrize("kind", KINDS, ids=[kind.value for kind in KINDS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts(full_batch=st.just(False)), count=st.integers(16, 60),
       batch_size=st.integers(1, 4))
def test_one_epoch_of_a_dp_group_is_disjoint_complete_and_equally_long(store, kind, layout, count,
                                                                      batch_size):
    world, config = layout.world, layout.config
    infos = [RankInfo.in_layout(rank, world, config) for rank in range(world)]
    reads = {info.rank: read_rank(store, kind, count, info, batch_size) for info in infos}
    shards = infos[0].config.dp
    per_rank = expected_per_rank(count, shards, batch_size, config.shard_policy)
    for epoch in range(2):
        batches = {rank: read[epoch] for rank, read in reads.items()}
        assert len({len(b) for b in batches.values()}) == 1, "batch counts differ between ranks"
        for info in infos:
            assert sum(map(len, batches[info.rank])) == per_rank
            for peer in info.groups.mp + info.groups.pp:
                assert batches[peer] == batches[info.rank], "mp/pp peers must read the same data"
            group_ids = [i for rank in info.groups.dp for batch in batches[rank] for i in batch]
            _check_group_epoch(group_ids, count, shards, per_rank, config.shard_policy)


def _check_group_epoch(ids: List[int], count: int, shards: int, per_rank: int,
                       policy: ShardPolicy) -> None:
    assert set(ids) <= set(range(count))
    assert len(ids) == shards * per_rank
    if policy is ShardPolicy.PAD:
        assert set(ids) == set(range(count)), "pad must cover every sample"
        repeats = sum(n - 1 for n in collections.Counter(ids).values())
        assert repeats == shards * per_rank - count
    else:
        assert len(set(ids)) == len(ids), "drop must never read a sample twice"


@pytest.mark.parametrize("kind", KINDS, ids=[kind.value for kind in KINDS])
def test_batch_size_one_under_drop_skips_fewer_samples_than_shards(store, kind):
    config = ParallelConfig(seed=5)
    reads = [read_rank(store, kind, 23, RankInfo.in_layout(r, 4, config), 1, epochs=1)[0]
             for r in range(4)]
    ids = [i for read in reads for batch in read for i in batch]
    assert len(ids) == len(set(ids)) == 20


@pytest.mark.parametrize("kind", KINDS, ids=[kind.value for kind in KINDS])
def test_each_epoch_is_reshuffled_identically_in_every_build(store, kind):
    info = RankInfo.in_layout(1, 2, ParallelConfig(seed=3))
    first = read_rank(store, kind, 40, info, 4)
    again = read_rank(store, kind, 40, info, 4)
    assert first == again
    assert first[0] != first[1]
    other_seed = RankInfo.in_layout(1, 2, ParallelConfig(seed=4))
    assert read_rank(store, kind, 40, other_seed, 4) != first


@pytest.mark.parametrize("kind", KINDS, ids=[kind.value for kind in KINDS])
def test_starting_at_epoch_one_reads_what_epoch_one_read(store, kind):
    info = RankInfo.in_layout(0, 3, ParallelConfig(seed=11))
    from_start = read_rank(store, kind, 30, info, 2, epochs=3)
    resumed = read_rank(store, kind, 30, info, 2, epochs=2, epoch=1)
    assert resumed == from_start[1:]


def test_the_global_dataset_seed_is_restored_and_does_not_change_the_shards(store):
    ds.config.set_seed(1234)
    info = RankInfo.in_layout(0, 2, ParallelConfig(seed=9))
    dataset = sharded_dataset(store.source(SourceKind.MINDRECORD, 20), info, 2, columns=["id"])
    assert ds.config.get_seed() == 1234
    ds.config.set_seed(777)
    before = read_epochs(dataset, SourceKind.MINDRECORD)
    ds.config.set_seed(4321)
    rebuilt = sharded_dataset(store.source(SourceKind.MINDRECORD, 20), info, 2, columns=["id"])
    assert read_epochs(rebuilt, SourceKind.MINDRECORD) == before


@pytest.mark.parametrize("kind", [SourceKind.MINDRECORD, SourceKind.NUMPY], ids=["mindrecord", "numpy"])
def test_without_shuffle_shard_i_reads_every_nth_sample(store, kind):
    info = RankInfo.in_layout(2, 3, ParallelConfig())
    read = read_rank(store, kind, 20, info, 3, shuffle=False, epochs=1)[0]
    assert read == [[2, 5, 8], [11, 14, 17]]


def test_full_batch_gives_every_rank_all_samples(store):
    config = ParallelConfig(mode="semi", mp=2, full_batch=True)
    reads = [read_rank(store, SourceKind.NUMPY, 18, RankInfo.in_layout(r, 4, config), 3, epochs=1)
             for r in range(4)]
    assert all(read == reads[0] for read in reads)
    assert sorted(i for batch in reads[0][0] for i in batch) == list(range(18))


def test_pad_keeps_the_short_last_batch_on_every_rank(store):
    config = ParallelConfig(shard_policy="pad")
    reads = [read_rank(store, SourceKind.NUMPY, 17, RankInfo.in_layout(r, 2, config), 4, epochs=1)[0]
             for r in range(2)]
    assert [list(map(len, read)) for read in reads] == [[4, 4, 1], [4, 4, 1]]


def test_two_workers_and_transforms_read_the_same_samples(store):
    info = RankInfo.in_layout(1, 2, ParallelConfig(seed=2))
    source = store.source(SourceKind.MINDRECORD, 40)
    one = sharded_dataset(source, info, 4, columns=["id", "x"])
    two = sharded_dataset(source, info, 4, columns=["id", "x"], num_workers=2,
                          transforms={"x": [transforms.TypeCast(ms.float16)]})
    rows = list(two.create_tuple_iterator(num_epochs=1, output_numpy=True))
    assert rows[0][1].dtype == np.float16
    assert read_epochs(one, SourceKind.MINDRECORD, 1) == [[row[0].tolist() for row in rows]]


def test_sources_are_classified_by_what_they_are(store, tmp_path):
    assert source_kind(store.source(SourceKind.MINDRECORD, 20)) is SourceKind.MINDRECORD
    assert source_kind([tmp_path / "a.mindrecord0", "b.mindrecord1"]) is SourceKind.MINDRECORD
    assert source_kind(tmp_path) is SourceKind.IMAGE_FOLDER
    assert source_kind(np.zeros(3)) is SourceKind.NUMPY
    assert source_kind((np.zeros(3), np.ones(3))) is SourceKind.NUMPY
    assert source_kind([(1,), (2,)]) is SourceKind.RANDOM_ACCESS
    with pytest.raises(TypeError, match="cannot read int"):
        source_kind(3)


def test_bad_requests_say_what_is_wrong(store):
    info = RankInfo.in_layout(0, 16, ParallelConfig())
    with pytest.raises(ValueError, match="10 samples cannot give each of 16 shards one sample"):
        sharded_dataset(np.arange(10), info, 1)
    with pytest.raises(ValueError, match="needs columns"):
        sharded_dataset(Samples(20), RankInfo.in_layout(0, 1, ParallelConfig()), 1)


@st.composite
def plannable(draw: Any) -> Tuple[int, int, ShardPolicy]:
    """``(count, shards, policy)`` a shard plan can serve: drop needs a sample per shard."""
    shards, policy = draw(st.integers(1, 16)), draw(st.sampled_from(ShardPolicy))
    return draw(st.integers(shards if policy is ShardPolicy.DROP else 1, 200)), shards, policy


@settings(max_examples=200, deadline=None)
@given(case=plannable(), seed=st.integers(0, 2**32 - 1), epoch=st.integers(0, 50),
       shuffle=st.booleans())
def test_shard_plans_partition_each_epoch(case, seed, epoch, shuffle):
    count, shards, policy = case
    plans = [ShardPlan(shards, i, seed, shuffle=shuffle, policy=policy) for i in range(shards)]
    orders = [plan.order(count, epoch) for plan in plans]
    assert len({len(order) for order in orders}) == 1
    ids = [i for order in orders for i in order]
    _check_group_epoch(ids, count, shards, len(orders[0]), policy)


@pytest.mark.parametrize("count, shards", [(1, 2), (15, 16)])
def test_drop_with_fewer_samples_than_shards_is_refused(count, shards):
    with pytest.raises(ValueError, match=f"{count} samples cannot give each of {shards} shards"):
        ShardPlan(shards, 0, 1, policy=ShardPolicy.DROP).order(count, 0)


def test_mindrecord_writer_widens_narrow_types_and_keeps_values(tmp_path):
    arrays = {"pixels": np.arange(12, dtype=np.uint8).reshape(3, 2, 2),
              "half": np.array([0.5, 1.5, 2.5], np.float16), "name": np.array(["a", "bb", "c"])}
    files = write_mindrecord(arrays, tmp_path / "w.mindrecord", num_files=2)
    assert [f.name for f in files] == ["w.mindrecord0", "w.mindrecord1"]
    rows = list(ds.MindDataset([str(f) for f in files], shuffle=False).create_dict_iterator(
        num_epochs=1, output_numpy=True))
    by_name = sorted(rows, key=lambda row: str(row["name"]))
    assert by_name[0]["pixels"].dtype == np.int32 and by_name[0]["half"].dtype == np.float32
    assert [r["pixels"].tolist() for r in by_name] == arrays["pixels"].astype(int).tolist()
    assert [float(r["half"]) for r in by_name] == [0.5, 1.5, 2.5]


def test_mindrecord_writer_refuses_what_it_cannot_store(tmp_path):
    with pytest.raises(ValueError, match="one length"):
        write_mindrecord({"a": np.zeros(3), "b": np.zeros(4)}, tmp_path / "x.mindrecord")
    with pytest.raises(ValueError, match="complex128 cannot be stored"):
        write_mindrecord({"a": np.zeros(3, complex)}, tmp_path / "y.mindrecord")
    with pytest.raises(ValueError, match="num_files must be between 1 and the 3 samples"):
        write_mindrecord({"a": np.zeros(3)}, tmp_path / "z.mindrecord", num_files=4)


def test_an_image_folder_written_to_mindrecord_keeps_images_and_labels(store, tmp_path):
    import mindspore.dataset.vision as vision

    folder = store.source(SourceKind.IMAGE_FOLDER, 16)
    files = write_mindrecord_from_folder(folder, tmp_path / "images.mindrecord", num_files=2)
    info = RankInfo.in_layout(0, 1, ParallelConfig())
    from_record = sharded_dataset(files, info, 16, shuffle=False, columns=["image", "label"],
                                  transforms={"image": [vision.Decode()]})
    from_folder = sharded_dataset(folder, info, 16, shuffle=False, columns=["image", "label"])
    pairs = [sorted(zip(_ids(image, SourceKind.IMAGE_FOLDER), label.tolist()))
             for image, label in (next(d.create_tuple_iterator(num_epochs=1, output_numpy=True))
                                  for d in (from_record, from_folder))]
    assert pairs[0] == pairs[1] == [(i, i % 3) for i in range(16)]


def test_prepare_data_writes_an_npz_and_refuses_to_overwrite(tmp_path):
    import subprocess
    import sys

    script = REPO / "scripts" / "prepare_data.py"
    np.savez(tmp_path / "arrays.npz", id=np.arange(12), x=np.ones((12, 3), np.float32))
    out = tmp_path / "out set.mindrecord"
    command = [sys.executable, str(script), "npz", str(tmp_path / "arrays.npz"), str(out), "--files", "3"]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split("\n")[:3] == [f"{out}{i}" for i in range(3)]
    info = RankInfo.in_layout(0, 1, ParallelConfig())
    [[batch]] = read_epochs(sharded_dataset(f"{out}1", info, 12, columns=["id"]), SourceKind.NUMPY, 1)
    assert sorted(batch) == list(range(12))
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines()[-1] == f"Error: {out}0 already exists (overwrite replaces it)"


@pytest.mark.parametrize("kind", KINDS, ids=[kind.value for kind in KINDS])
def test_fewer_ranks_than_planned_keep_the_global_batch_and_its_samples(store, kind, monkeypatch):
    """``--min-nodes`` left a host out: 2 ranks of a job planned for 4 read, in each global
    batch, exactly the samples the 4 read (``contract.PLANNED_WORLD``)."""
    config = ParallelConfig(seed=3)

    def global_batches(world: int) -> List[List[int]]:
        monkeypatch.setenv(contract.RANK_SIZE, str(world))
        reads = [read_rank(store, kind, 45, RankInfo.in_layout(r, world, config), 3, epochs=2)
                 for r in range(world)]
        return [sorted(i for read in reads for i in read[epoch][t])
                for epoch in range(2) for t in range(len(reads[0][epoch]))]

    planned = global_batches(4)
    monkeypatch.setenv(contract.PLANNED_WORLD, "4")
    assert global_batches(2) == planned
    assert len(planned) == 2 * (45 // 12) and all(len(b) == 12 for b in planned)
    assert kept_global_batch(3, 2, exact=True) == 6
    monkeypatch.setenv(contract.RANK_SIZE, "3")
    assert kept_global_batch(4, 3, exact=False) == 6, "16 over 3, rounded up"
    with pytest.raises(BadInput, match="the global batch of 16 .4 on each of 4 planned shards. "
                       "does not split over 3 shards now that 1 rank.s. were left out"):
        kept_global_batch(4, 3, exact=True)
    monkeypatch.delenv(contract.PLANNED_WORLD)
    assert kept_global_batch(4, 3, exact=True) == 4, "as planned: the script's batch"
