"""Per-rank atomic checkpoints, manifests, retention (real MindSpore, marked per test) and the
replica check (pure Python). The module imports MindSpore only inside the tests that need it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from parallel.checkpoints import checkpoint
from parallel.checkpoints.checkpoint import DataPosition
from parallel.checkpoints.manifest import RankFile


@pytest.fixture
def ckpt_dir(tmp_path: Path) -> Path:
    """A checkpoint directory whose path has a space and a quote in it."""
    path = tmp_path / "run 'one'" / "ckpt"
    path.mkdir(parents=True)
    return path


def params(value: float) -> list:
    import mindspore as ms

    return [ms.Parameter(ms.Tensor(np.full((3, 2), value, np.float32)), name="w"),
            ms.Parameter(ms.Tensor(np.arange(4, dtype=np.float32) + value), name="moments.w")]


def save(ckpt_dir: Path, step: int, rank: int, value: float = 1.0) -> checkpoint.RankFile:
    position = DataPosition(0, step % 7, step)
    return checkpoint.save_rank(ckpt_dir, step, rank, params(value), position, {"loss_scale": 8.0})


def complete(ckpt_dir: Path, step: int, world: int = 1, value: float = 1.0) -> checkpoint.Manifest:
    for rank in range(world):
        save(ckpt_dir, step, rank, value)
    manifest = checkpoint.mark_complete(ckpt_dir, step, world)
    assert manifest is not None
    return manifest


def loaded_w(ckpt_dir: Path, manifest: checkpoint.Manifest, rank: int = 0) -> np.ndarray:
    return checkpoint.load_rank(ckpt_dir, manifest, rank).params["w"].asnumpy()


# Saving and loading ------------------------------------------------------------------------------

@pytest.mark.mindspore
def test_rank_file_round_trips_params_extras_and_position(ckpt_dir: Path) -> None:
    manifest = complete(ckpt_dir, 14, value=2.5)
    loaded = checkpoint.load_rank(ckpt_dir, manifest, 0)
    assert set(loaded.params) == {"w", "moments.w"}
    np.testing.assert_array_equal(loaded.params["moments.w"].asnumpy(), np.arange(4) + 2.5)
    assert loaded.extras["loss_scale"] == 8.0
    assert loaded.position == DataPosition(0, 0, 14)
    assert checkpoint.rank_checkpoint_path(ckpt_dir, 14, 0).is_file()


@pytest.mark.mindspore
def test_load_detects_a_corrupted_rank_file(ckpt_dir: Path) -> None:
    manifest = complete(ckpt_dir, 3)
    path = checkpoint.rank_checkpoint_path(ckpt_dir, 3, 0)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="do not match the manifest"):
        checkpoint.load_rank(ckpt_dir, manifest, 0)


# Atomicity ---------------------------------------------------------------------------------------

CRASHING_SAVE = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import mindspore as ms
    from parallel.checkpoints import checkpoint

    def die_before_publishing(src, dst):
        if str(dst).endswith(".ckpt"):
            os.kill(os.getpid(), signal.SIGKILL)  # the rank dies with the temp file fully written
        return real_replace(src, dst)

    real_replace, os.replace = os.replace, die_before_publishing
    step, value = int(sys.argv[2]), float(sys.argv[3])
    params = [ms.Parameter(ms.Tensor(np.full((3, 2), value, np.float32)), name="w"),
              ms.Parameter(ms.Tensor(np.arange(4, dtype=np.float32) + value), name="moments.w")]
    checkpoint.save_rank(sys.argv[1], step, 0, params, checkpoint.DataPosition(0, 0, step))
""")


def crash_while_saving(ckpt_dir: Path, step: int, value: float) -> None:
    command = [sys.executable, "-c", CRASHING_SAVE, str(ckpt_dir), str(step), str(value)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


@pytest.mark.mindspore
def test_rank_killed_writing_a_new_step_leaves_the_previous_one_loadable(ckpt_dir: Path) -> None:
    complete(ckpt_dir, 10, value=1.0)
    crash_while_saving(ckpt_dir, 20, value=9.0)

    leftovers = sorted(p.name for p in checkpoint.step_dir(ckpt_dir, 20).iterdir())
    assert len(leftovers) == 1 and leftovers[0].startswith(".rank_0.tmp"), leftovers
    assert checkpoint.mark_complete(ckpt_dir, 20, 1) is None
    latest = checkpoint.latest_complete(ckpt_dir)
    assert latest is not None and latest.step == 10
    np.testing.assert_array_equal(loaded_w(ckpt_dir, latest), np.full((3, 2), 1.0))

    save(ckpt_dir, 20, 0, value=3.0)  # the next save of that step clears the dead rank's temp file
    assert sorted(p.name for p in checkpoint.step_dir(ckpt_dir, 20).iterdir()) == [
        "rank_0.ckpt", "rank_0.json"]


@pytest.mark.mindspore
def test_rank_killed_overwriting_a_file_leaves_the_old_content(ckpt_dir: Path) -> None:
    manifest = complete(ckpt_dir, 10, value=1.0)
    crash_while_saving(ckpt_dir, 10, value=9.0)
    np.testing.assert_array_equal(loaded_w(ckpt_dir, manifest), np.full((3, 2), 1.0))


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    checkpoint.atomic_write_bytes(target, b"old")

    def half_write_then_fail(tmp: Path) -> None:
        tmp.write_bytes(b"ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checkpoint.atomic_save(target, half_write_then_fail)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]


# Manifests ---------------------------------------------------------------------------------------

@pytest.mark.mindspore
def test_manifest_only_once_every_rank_file_exists(ckpt_dir: Path) -> None:
    save(ckpt_dir, 5, 0)
    save(ckpt_dir, 5, 2)
    assert checkpoint.mark_complete(ckpt_dir, 5, world_size=3) is None
    assert not (checkpoint.step_dir(ckpt_dir, 5) / checkpoint.MANIFEST).exists()
    assert checkpoint.latest_complete(ckpt_dir) is None

    save(ckpt_dir, 5, 1)
    manifest = checkpoint.mark_complete(ckpt_dir, 5, world_size=3)
    assert manifest is not None
    assert [f.rank for f in manifest.files] == [0, 1, 2]
    for entry in manifest.files:
        path = checkpoint.step_dir(ckpt_dir, 5) / entry.name
        assert entry.size == path.stat().st_size
        assert entry.sha256 == checkpoint.sha256_file(path)
    on_disk = json.loads((checkpoint.step_dir(ckpt_dir, 5) / checkpoint.MANIFEST).read_text())
    assert on_disk["step"] == 5 and on_disk["epoch"] == 0
    assert on_disk["position"] == {"epoch": 0, "batch_in_epoch": 5, "global_step": 5}
    assert checkpoint.latest_complete(ckpt_dir) == manifest


@pytest.mark.mindspore
def test_ranks_disagreeing_on_the_data_position_is_an_error(ckpt_dir: Path) -> None:
    checkpoint.save_rank(ckpt_dir, 4, 0, params(1.0), DataPosition(0, 4, 4))
    checkpoint.save_rank(ckpt_dir, 4, 1, params(1.0), DataPosition(0, 3, 4))
    with pytest.raises(checkpoint.CheckpointError, match="different data positions"):
        checkpoint.mark_complete(ckpt_dir, 4, 2)


@pytest.mark.mindspore
def test_keep_last_k_deletes_older_steps_but_not_newer_incomplete_ones(ckpt_dir: Path) -> None:
    save(ckpt_dir, 1, 0)  # never completed, older than everything kept
    for step in (2, 4, 6, 8):
        save(ckpt_dir, step, 0)
        save(ckpt_dir, step, 1)
        checkpoint.mark_complete(ckpt_dir, step, 2, keep_last=2)
    save(ckpt_dir, 10, 0)  # rank 1 still writing

    assert checkpoint.list_steps(ckpt_dir) == [6, 8, 10]
    assert [m.step for m in checkpoint.complete_steps(ckpt_dir)] == [6, 8]
    assert checkpoint.latest_complete(ckpt_dir).step == 8


def test_a_rank_prunes_only_its_own_files_and_the_manifest_first(tmp_path: Path) -> None:
    """What a data-parallel rank deletes on its own host (the trainer's keep-last-K where no
    host holds a whole step): its file and sidecar of older steps, their manifest first."""
    for step in (10, 20, 30):
        folder = checkpoint.step_dir(tmp_path, step)
        folder.mkdir(parents=True)
        for name in ("rank_1.ckpt", "rank_1.json", checkpoint.MANIFEST):
            (folder / name).write_text("x")
    (checkpoint.step_dir(tmp_path, 10) / "rank_0.ckpt").write_text("another rank's, shared disk")
    assert checkpoint.prune_rank(tmp_path, 1, oldest_kept=30) == [10, 20]
    assert sorted(p.name for p in checkpoint.step_dir(tmp_path, 10).iterdir()) == ["rank_0.ckpt"]
    assert not checkpoint.step_dir(tmp_path, 20).exists()  # emptied, so removed
    assert sorted(p.name for p in checkpoint.step_dir(tmp_path, 30).iterdir()) == [
        checkpoint.MANIFEST, "rank_1.ckpt", "rank_1.json"]
    assert checkpoint.prune_rank(tmp_path, 1, oldest_kept=30) == []


def test_a_rank_prunes_the_replica_it_resumed_from_but_nothing_outside_the_step(
        tmp_path: Path) -> None:
    """A host that resumed from a peer's last words holds that peer's file, named for this rank
    in the step's manifest; once older than the kept steps it goes too. A manifest that names a
    path outside the step deletes nothing there."""
    position = DataPosition(0, 5, 5)
    outside = tmp_path / "keep.txt"
    outside.write_text("not a checkpoint")
    for step, name in ((5, "rank_0.ckpt"), (6, "../keep.txt")):
        folder = checkpoint.step_dir(tmp_path / "ckpt", step)
        folder.mkdir(parents=True)
        (folder / "rank_0.ckpt").write_text("rank 0's last words, fetched")
        files = tuple(RankFile(r, name, 1, "ab" * 32, position) for r in (0, 1))
        (folder / checkpoint.MANIFEST).write_text(
            checkpoint.Manifest(step, 2, position, files, 0.0).to_json())
    assert checkpoint.prune_rank(tmp_path / "ckpt", 1, oldest_kept=7) == [5, 6]
    assert not checkpoint.step_dir(tmp_path / "ckpt", 5).exists()
    assert [p.name for p in checkpoint.step_dir(tmp_path / "ckpt", 6).iterdir()] == ["rank_0.ckpt"]
    assert outside.read_text() == "not a checkpoint"


@pytest.mark.mindspore
def test_latest_complete_skips_a_step_whose_manifest_is_unreadable(ckpt_dir: Path) -> None:
    complete(ckpt_dir, 3)
    complete(ckpt_dir, 6)
    (checkpoint.step_dir(ckpt_dir, 6) / checkpoint.MANIFEST).write_text("{truncated")
    assert checkpoint.latest_complete(ckpt_dir).step == 3


@pytest.mark.mindspore
def test_manifest_json_round_trip(ckpt_dir: Path) -> None:
    manifest = complete(ckpt_dir, 7, world=2)
    assert checkpoint.Manifest.from_json(manifest.to_json()) == manifest


# Replica check -----------------------------------------------------------------------------------

@pytest.mark.mindspore
def test_parameters_digest_sees_one_changed_value() -> None:
    import mindspore as ms

    first, second = params(1.0), params(1.0)
    assert checkpoint.parameters_digest(first) == checkpoint.parameters_digest(second)
    second[1].set_data(ms.Tensor(np.array([1, 2, 3, 4.5], np.float32)))
    assert checkpoint.parameters_digest(first) != checkpoint.parameters_digest(second)


def test_replica_check_names_the_odd_ranks_against_the_majority() -> None:
    digests = [b"a", b"a", b"b", b"a", b"c"]
    assert checkpoint.divergent_ranks(digests) == ((0, 1, 3), (2, 4))
    expected = r"at step 40: .* rank\(s\) 2, 4 disagree with the majority, rank\(s\) 0, 1, 3;"
    with pytest.raises(checkpoint.ReplicaMismatchError, match=expected):
        checkpoint.check_replicas(digests, step=40)
    checkpoint.check_replicas([b"a"] * 4, step=40)


def test_replica_check_without_majority_takes_the_lowest_tied_group() -> None:
    no_majority = r"rank\(s\) 1 disagree with the largest group \(no majority\), rank\(s\) 0;"
    with pytest.raises(checkpoint.ReplicaMismatchError, match=no_majority):
        checkpoint.check_replicas([b"a", b"b"], step=1)
    assert checkpoint.divergent_ranks([b"a", b"b", b"b", b"c", b"c"]) == ((1, 2), (0, 3, 4))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=9))
def test_divergent_ranks_partitions_the_ranks(digests: list) -> None:
    agreeing, odd = checkpoint.divergent_ranks(digests)
    assert sorted(agreeing + odd) == list(range(len(digests)))
    assert len({digests[r] for r in agreeing}) == 1
    assert all(digests[r] != digests[agreeing[0]] for r in odd)
    assert len(agreeing) == max(digests.count(d) for d in digests)


def test_manifests_amp_and_schedules_import_without_mindspore() -> None:
    """The launcher may read manifests and validate AMP options where MindSpore is absent."""
    probe = ("import sys, parallel.checkpoints.checkpoint, parallel.trainer.amp, "
             "parallel.trainer.schedules; "
             "print('mindspore' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
