"""Node 0's checkpoint ledger and the placing of files for a resume, on real files.

The multi-node tests (tests/multinode/test_resume_private.py, test_collect_private.py) run both
for real between hosts with private disks; these pin the rules: complete means every rank
reported, a resume finds or fetches each rank's file, a file that cannot be had is one line
naming rank, step and host, and node 0's collected copies stand in for a sliced rank's own file
only when they are that file, and only for the newest complete step that has them all.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import threading
from pathlib import Path

import pytest

from launcher.checkpoints import ledger as ledger_module
from launcher.checkpoints.ledger import CheckpointLedger
from launcher.checkpoints.resume import MissingCheckpoint, place_for_resume
from launcher.checkpoints.uploads import Upload
from parallel.checkpoints.manifest import MANIFEST, Manifest
from parallel.contract import Event


@pytest.fixture(autouse=True)
def _short_wait(monkeypatch) -> None:
    """An upload node 0 does not want yet waits at most this long for its event, not 5 s."""
    monkeypatch.setattr(ledger_module, "TOLD_WAIT", 0.2)


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


# Node 0's collected copies (launcher.cluster.collect sends them; launcher.cluster.payload receives them) ------

def _collect(ledger: CheckpointLedger, rank: int, step: int, data: bytes) -> Path:
    """What the payload server does with a checked upload: stage it, hand it to the ledger."""
    upload = Upload(rank, step, f"rank_{rank}.ckpt", len(data), hashlib.sha256(data).hexdigest())
    assert ledger.accepts(upload)
    staged = Path(ledger.staging) / f"upload-{rank}-{step}"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(data)
    assert ledger.received(upload, str(staged), 0.5)
    return Path(ledger.staging).parent / f"step_{step}" / f"rank_{rank}" / f"rank_{rank}.ckpt"


def _sliced(tmp_path: Path, collected: list) -> CheckpointLedger:
    """Node 0's ledger of a 2-rank model-parallel job: rank 0 on node 0, rank 1 elsewhere."""
    return CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=False,
                            collect=(1,), on_collected=lambda size, s: collected.append(size),
                            agents=True)


def _both(ledger: CheckpointLedger, tmp_path: Path, step: int,
          seen: tuple[int, ...] = (0,)) -> tuple[Path, Path]:
    """Both ranks report ``step``; the files of ranks not ``seen`` are on a host whose disk is
    not node 0's (here: gone by the time node 0 looks)."""
    paths = (tmp_path / "a" / f"step_{step}" / "rank_0.ckpt",
             tmp_path / "b" / f"step_{step}" / "rank_1.ckpt")
    for rank, path in enumerate(paths):
        event = _event(rank, "ab"[rank], path, f"slice {rank} of {step}".encode(), step)
        if rank not in seen:
            path.unlink()
        ledger.record(event)
    return paths


def test_a_sliced_step_resumes_a_wiped_host_from_node_0s_collected_slice(tmp_path: Path) -> None:
    collected: list = []
    ledger = _sliced(tmp_path, collected)
    _, on_b = _both(ledger, tmp_path, 10)
    point = ledger.resume_point()
    assert point is not None and point.replicas == {}  # nothing collected yet: no copy to give
    copy = _collect(ledger, 1, 10, b"slice 1 of 10")
    assert copy.read_bytes() == b"slice 1 of 10" and collected == [13]
    point = ledger.resume_point()
    assert point is not None and point.replicas == {1: str(copy)}  # rank 0's file is on node 0

    assert not on_b.exists()  # host b was wiped
    notes = place_for_resume(point, [1], "b",
                             lambda rank, path: shutil.copyfile(point.replicas[rank], path),
                             exact=True)
    assert notes == ["rank 1: 13 bytes of step 10 from node 0"]
    assert on_b.read_bytes() == b"slice 1 of 10"
    written = Manifest.from_json((on_b.parent / MANIFEST).read_text())
    assert written.file_for(1).sha256 == hashlib.sha256(b"slice 1 of 10").hexdigest()


def test_a_copy_that_is_not_the_ranks_own_file_never_stands_in(tmp_path: Path) -> None:
    ledger = _sliced(tmp_path, [])
    _, on_b = _both(ledger, tmp_path, 10)
    _collect(ledger, 1, 10, b"what rank 1 wrote later")  # checked as sent, but not the step's
    point = ledger.resume_point()
    assert point is not None and point.replicas == {}
    with pytest.raises(MissingCheckpoint, match="node 0 has no copy to stand in"):
        place_for_resume(point, [1], "b", fetch=None, exact=True)
    # And an agent given bytes that are not the slice keeps none of them.
    forged = dataclasses.replace(point, replicas={1: "node 0's"})
    with pytest.raises(MissingCheckpoint, match=r"node 0's copy is not its file \(another sha256\)"):
        place_for_resume(forged, [1], "b", lambda rank, path: Path(path).write_bytes(b"x" * 13),
                         exact=True)
    assert not on_b.exists()


def test_only_the_newest_complete_collected_step_keeps_its_copies(tmp_path: Path) -> None:
    ledger = _sliced(tmp_path, [])
    steps = tmp_path / "logs" / "checkpoint_ledger"
    _both(ledger, tmp_path, 10)
    ten = _collect(ledger, 1, 10, b"slice 1 of 10")
    fifteen = _collect(ledger, 1, 15, b"slice 1 of 15")  # rank 0 never saved step 15
    _both(ledger, tmp_path, 20)
    # Step 20 is complete but its slice has not come: step 10's copy is still what a resume needs.
    assert ledger.collected_steps() == [10, 15] and ten.exists()
    _collect(ledger, 1, 20, b"slice 1 of 20")
    assert ledger.collected_steps() == [20]
    assert not ten.exists() and not fifteen.exists()
    assert sorted(p.name for p in (steps / "step_10").iterdir()) == ["files.json", MANIFEST]
    assert not (steps / "step_15").exists()
    point = ledger.resume_point()
    assert point is not None and point.step == 20
    assert point.replicas == {1: str(steps / "step_20" / "rank_1" / "rank_1.ckpt")}
    # Pruned steps are not taken again; newer ones, and ranks node 0 collects, only.
    assert not ledger.accepts(Upload(1, 15, "r", 1, "0" * 64))
    assert ledger.accepts(Upload(1, 25, "r", 1, "0" * 64))
    assert not ledger.accepts(Upload(0, 25, "r", 1, "0" * 64))


def test_without_collection_nothing_is_taken_or_kept(tmp_path: Path) -> None:
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=False)
    _both(ledger, tmp_path, 10)
    assert not ledger.accepts(Upload(1, 10, "rank_1.ckpt", 13, "0" * 64))
    point = ledger.resume_point()
    assert point is not None and point.replicas == {}


def test_a_data_parallel_job_whose_node_0_runs_no_rank_resumes_from_the_collected_replica(
        tmp_path: Path) -> None:
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=True,
                              collect=(0,))
    _both(ledger, tmp_path, 10, seen=())  # both on hosts node 0 cannot see
    point = ledger.resume_point()
    assert point is not None and point.replicas == {}
    copy = _collect(ledger, 0, 10, b"slice 0 of 10")
    point = ledger.resume_point()
    assert point is not None and point.replicas == {0: str(copy), 1: str(copy)}


def _last_words(rank: int, host: str, path: Path, data: bytes, step: int) -> Event:
    event = _event(rank, host, path, data, step)
    return dataclasses.replace(event, record={**event.record, "last_words": True})


def test_last_words_saved_on_another_host_are_taken_and_kept_while_they_are_newest(
        tmp_path: Path) -> None:
    """Node 0 runs rank 0, which failed; rank 1 (another host, node 0 collects nothing) saved
    its last words, and its agent sends them: the restart's host 0 needs that file."""
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=True)
    remote = tmp_path / "b" / "step_12" / "rank_1.ckpt"
    assert ledger.record(_last_words(1, "b", remote, b"rank 1 after 12", 12)) is not None
    remote.unlink()  # not on node 0's disk
    assert not ledger.accepts(Upload(0, 12, "rank_0.ckpt", 1, "0" * 64)), "only the saver's"
    assert not ledger.accepts(Upload(1, 11, "rank_1.ckpt", 1, "0" * 64)), "only its step"
    copy = _collect(ledger, 1, 12, b"rank 1 after 12")
    point = ledger.resume_point()
    assert point is not None and point.step == 12 and point.replicas == {0: str(copy), 1: str(copy)}

    _both(ledger, tmp_path, 20)  # a newer complete step: the copy is not needed any more
    assert not copy.exists()
    point = ledger.resume_point()
    assert point is not None and point.step == 20


def test_last_words_whose_file_never_reached_node_0_are_passed_over(tmp_path: Path) -> None:
    """A job of agents: the file of step 12's last words is on another host and its upload did
    not arrive (too large for the teardown's time): the restart resumes from step 10, which
    every host holds its own file of, instead of failing on a host that lacks step 12's."""
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=True,
                              agents=True)
    _both(ledger, tmp_path, 10, seen=(0, 1))
    remote = tmp_path / "b" / "step_12" / "rank_1.ckpt"
    assert ledger.record(_last_words(1, "b", remote, b"rank 1 after 12", 12)) is not None
    remote.unlink()
    point = ledger.resume_point()
    assert point is not None and point.step == 10
    assert ledger.last_words_passed_over(point) == 12, "the restart says so in one line"
    _collect(ledger, 1, 12, b"rank 1 after 12")
    point = ledger.resume_point()
    assert point is not None and point.step == 12 and ledger.last_words_passed_over(point) is None


def test_the_ledger_says_whether_node_0_saw_every_hosts_files(tmp_path: Path) -> None:
    ledger = _sliced(tmp_path, [])
    assert ledger.storage is None
    _both(ledger, tmp_path, 10, seen=(0, 1))
    assert ledger.storage == "shared"  # both files are on this disk at their own paths
    _both(ledger, tmp_path, 20, seen=(0, 1))
    assert ledger.storage == "shared"
    _both(ledger, tmp_path, 30)  # rank 1's file is on b, which node 0 does not see
    assert ledger.storage == "private"
    here = CheckpointLedger(str(tmp_path / "here"), world_size=2, data_parallel=False)
    _both(here, tmp_path, 10)
    assert here.storage is None  # no node agents: every rank runs on node 0


def test_a_restart_resumes_from_the_newest_step_node_0_holds_every_file_of(
        tmp_path: Path) -> None:
    ledger = _sliced(tmp_path, [])
    _both(ledger, tmp_path, 10)
    _collect(ledger, 1, 10, b"slice 1 of 10")
    _both(ledger, tmp_path, 20)  # complete, but host b was lost before its slice came
    point = ledger.resume_point()
    assert point is not None and point.step == 10 and set(point.replicas) == {1}
    _collect(ledger, 1, 20, b"slice 1 of 20")
    point = ledger.resume_point()
    assert point is not None and point.step == 20
    # A host that shares node 0's storage sends nothing: its file where it is will do.
    _both(ledger, tmp_path, 30, seen=(0, 1))
    point = ledger.resume_point()
    assert point is not None and point.step == 30 and point.replicas == {}
    assert ledger.collected_steps() == []  # step 20's copy is not needed any more
    # Without collection, the newest complete step, whatever node 0 holds.
    plain = CheckpointLedger(str(tmp_path / "plain"), world_size=2, data_parallel=False)
    _both(plain, tmp_path, 40)
    point = plain.resume_point()
    assert point is not None and point.step == 40


def test_a_complete_step_saved_again_gets_the_manifest_of_its_files_as_they_now_are(
        tmp_path: Path) -> None:
    """A restart that went back before a complete step (its slice never reached node 0) saves
    it again: the step's manifest, and what a copy must match, are the new files'."""
    ledger = _sliced(tmp_path, [])
    _both(ledger, tmp_path, 10)
    first = Manifest.from_json((tmp_path / "logs" / "checkpoint_ledger" / "step_10" / MANIFEST
                                ).read_text())
    again = _event(1, "b", tmp_path / "b" / "step_10" / "rank_1.ckpt", b"saved again", 10)
    assert ledger.record(again) is None  # not newly complete
    assert ledger.record(again) is None
    now = Manifest.from_json((tmp_path / "logs" / "checkpoint_ledger" / "step_10" / MANIFEST
                              ).read_text())
    assert now.file_for(0) == first.file_for(0)
    assert now.file_for(1).sha256 == hashlib.sha256(b"saved again").hexdigest() != \
        first.file_for(1).sha256
    copy = _collect(ledger, 1, 10, b"saved again")
    point = ledger.resume_point()
    assert point is not None and point.replicas == {1: str(copy)}
    assert Manifest.from_json(point.manifest).file_for(1) == now.file_for(1)


def test_a_new_launch_knows_the_newest_step_an_earlier_one_left_complete(tmp_path: Path) -> None:
    """The same command run again into the log directory: the ledger it starts with says the
    newest step the earlier launch made complete (what a rank that resumes on its own loads),
    passing over a manifest that does not read; it forgets nothing of this launch's own."""
    logs = str(tmp_path / "logs")
    assert CheckpointLedger(logs, world_size=2, data_parallel=True).earlier_step is None
    earlier = CheckpointLedger(logs, world_size=2, data_parallel=True)
    for step in (10, 20):
        for rank in (0, 1):
            earlier.record(_event(rank, "a", tmp_path / f"step_{step}" / f"rank_{rank}.ckpt",
                                  b"x", step))
    damaged = tmp_path / "logs" / "checkpoint_ledger" / "step_30"
    damaged.mkdir()
    (damaged / MANIFEST).write_text('{"step": 30')
    (tmp_path / "logs" / "checkpoint_ledger" / "step_40").mkdir()  # never completed
    again = CheckpointLedger(logs, world_size=2, data_parallel=True)
    assert again.earlier_step == 20
    assert again.complete_steps == [] and again.resume_point() is None, \
        "a restart of this launch is told only of steps this launch saw complete"


def test_last_words_that_come_before_their_event_wait_for_it(tmp_path: Path, monkeypatch) -> None:
    """The agent of rank 1's host sends the last words' event down its stdout and the file to
    the payload server at once; node 0 may read the event after the file's first bytes come
    (on a loaded host, seconds later). The upload waits for the event, not refused for good."""
    monkeypatch.setattr(ledger_module, "TOLD_WAIT", 60.0)
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=True)
    _both(ledger, tmp_path, 10)
    upload = Upload(1, 12, "rank_1.ckpt", 15, "0" * 64)
    answers: list[bool] = []
    asking = threading.Thread(target=lambda: answers.append(ledger.accepts(upload)),
                              daemon=True)  # a failed check leaves nothing waiting 60 s
    asking.start()
    asking.join(0.3)
    assert asking.is_alive() and not answers, "it waits for the event"
    assert ledger.record(_last_words(1, "b", tmp_path / "b" / "r1.ckpt", b"rank 1 after 12", 12))
    asking.join(10)
    assert answers == [True]
    assert not ledger.accepts(Upload(0, 12, "rank_0.ckpt", 1, "0" * 64)), \
        "another rank's file of a step whose saver is known: at once"


@pytest.mark.parametrize("replicated, rank", [(True, 5), (False, 1)],
                         ids=["no-such-rank", "sliced-job"])
def test_an_upload_that_cannot_be_last_words_is_refused_at_once(
        tmp_path: Path, monkeypatch, replicated: bool, rank: int) -> None:
    """Only the ranks of a replicated job save last words: any other upload node 0 does not
    want is refused without waiting for an event that cannot come (it waited ``TOLD_WAIT``)."""
    monkeypatch.setattr(ledger_module, "TOLD_WAIT", 3600.0)
    ledger = CheckpointLedger(str(tmp_path / "logs"), world_size=2, data_parallel=replicated)
    upload = Upload(rank, 12, f"rank_{rank}.ckpt", 15, "0" * 64)
    answers: list[bool] = []
    asking = threading.Thread(target=lambda: answers.append(ledger.accepts(upload)), daemon=True)
    asking.start()
    asking.join(30)  # a guard against the hour's wait, not a speed check
    assert answers == [False]
