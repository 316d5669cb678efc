"""Node 0's checkpoint ledger and the placing of files for a resume, on real files.

The multi-node test (tests/multinode/test_resume_private.py) runs both for real between hosts
with private disks; these pin the rules: complete means every rank reported, a resume finds or
fetches each rank's file, and a file that cannot be had is one line naming rank, step and host.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from launcher.checkpoints import CheckpointLedger, MissingCheckpoint, place_for_resume
from parallel.contract import Event
from parallel.manifest import MANIFEST, Manifest


def _write(path: Path, data: bytes) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"name": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _event(rank: int, host: str, path: Path, data: bytes, step: int = 10) -> Event:
    record = {"event": "checkpoint", "rank": rank, "host": host, "time": 5.0, "step": step,
              "path": str(path), "position": {"epoch": 1, "batch_in_epoch": 0, "global_step": step},
              "world_size": 2, **_write(path, data)}
    event = Event.parse(record)
    assert event is not None
    return event


def test_a_step_is_complete_when_every_rank_reported_it_from_any_host(tmp_path: Path) -> None:
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=True)
    assert ledger.record(_event(0, "a", tmp_path / "a" / "step_10" / "rank_0.ckpt", b"zero")) is None
    assert ledger.resume_point() is None
    done = ledger.record(_event(1, "b", tmp_path / "b" / "step_10" / "rank_1.ckpt", b"one"))
    assert isinstance(done, Manifest) and done.step == 10 and done.epoch == 1
    assert ledger.complete_steps == [10]
    folder = tmp_path / "logs" / "checkpoint_ledger" / "step_10"
    assert Manifest.from_json((folder / MANIFEST).read_text()) == done
    assert json.loads((folder / "files.json").read_text()) == {
        "0": {"host": "a", "path": str(tmp_path / "a" / "step_10" / "rank_0.ckpt")},
        "1": {"host": "b", "path": str(tmp_path / "b" / "step_10" / "rank_1.ckpt")}}
    point = ledger.resume_point()
    assert point is not None and point.step == 10
    # Both files are on this (node 0's) disk here: the first intact one stands in for every rank.
    assert point.replicas == {0: str(tmp_path / "a" / "step_10" / "rank_0.ckpt"),
                              1: str(tmp_path / "a" / "step_10" / "rank_0.ckpt")}


def test_events_that_do_not_describe_a_file_are_not_counted(tmp_path: Path) -> None:
    ledger = CheckpointLedger(str(tmp_path), world_size=1, data_parallel=True)
    bare = Event.parse({"event": "checkpoint", "rank": 0, "step": 3, "path": "/x/rank_0.ckpt"})
    relative = Event.parse({"event": "checkpoint", "rank": 0, "step": 3, "path": "rank_0.ckpt",
                            "name": "rank_0.ckpt", "size": 1, "sha256": "0",
                            "position": {"epoch": 0, "batch_in_epoch": 3, "global_step": 3}})
    assert bare is not None and relative is not None
    assert ledger.record(bare) is None and ledger.record(relative) is None
    assert ledger.complete_steps == []
    stranger = _event(5, "z", tmp_path / "z" / "rank_5.ckpt", b"five", step=3)
    assert ledger.record(stranger) is None  # rank 5 of a 1-rank job: not counted
    assert ledger.record(_event(0, "a", tmp_path / "a" / "rank_0.ckpt", b"zero", step=3)) is not None


def _point(tmp_path: Path, data_parallel: bool = True):
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=data_parallel)
    ledger.record(_event(0, "a", tmp_path / "a" / "step_10" / "rank_0.ckpt", b"replica"))
    ledger.record(_event(1, "b", tmp_path / "b" / "step_10" / "rank_1.ckpt", b"replica"))
    point = ledger.resume_point()
    assert point is not None
    return point


def test_a_resume_writes_the_manifest_beside_files_that_are_there(tmp_path: Path) -> None:
    point = _point(tmp_path)
    assert place_for_resume(point, [1], "b", fetch=None) == []
    written = Manifest.from_json((tmp_path / "b" / "step_10" / MANIFEST).read_text())
    assert written.step == 10 and written.file_for(1).size == len(b"replica")


def test_a_missing_file_is_fetched_and_the_manifest_says_what_is_there(tmp_path: Path) -> None:
    point = _point(tmp_path)
    (tmp_path / "b" / "step_10" / "rank_1.ckpt").unlink()
    asked = []

    def fetch(rank: int, path: str) -> None:
        asked.append(rank)
        Path(path).write_bytes(b"stand-in bytes")

    notes = place_for_resume(point, [1], "b", fetch)
    assert asked == [1] and notes == ["rank 1: 14 bytes of step 10 from node 0"]
    written = Manifest.from_json((tmp_path / "b" / "step_10" / MANIFEST).read_text())
    assert written.file_for(1).sha256 == hashlib.sha256(b"stand-in bytes").hexdigest()


def test_without_a_replica_a_missing_file_is_one_line_naming_rank_step_and_host(
        tmp_path: Path) -> None:
    point = _point(tmp_path, data_parallel=False)
    (tmp_path / "b" / "step_10" / "rank_1.ckpt").write_bytes(b"damaged")
    with pytest.raises(MissingCheckpoint) as caught:
        place_for_resume(point, [1], "b", fetch=lambda rank, path: None)
    assert str(caught.value) == (
        f"rank 1's checkpoint of step 10 is not on b ({tmp_path / 'b' / 'step_10' / 'rank_1.ckpt'}) "
        "and node 0 has no copy to stand in for it")
