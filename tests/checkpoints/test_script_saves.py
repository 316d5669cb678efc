"""Node 0's record of the files the script saved itself (``saved`` events), which each rank's
``{checkpoint}`` and ``NPU_LAUNCH_CHECKPOINT`` come from: the newest per rank, kept in the log
directory for the same command run again; ranks that save resume from a place they all
completed; ranks that never saved get the lowest saving rank's file."""
from __future__ import annotations

import json
from pathlib import Path

from launcher.checkpoints.script_saves import KEPT, SAVED_FILE, Saved, ScriptSaves
from parallel.contract import Event


def _saved(rank: int, path: str, epoch: int, epoch_step: int, **more) -> Event:
    event = Event.parse({"event": "saved", "rank": rank, "host": "h", "path": path, "size": 10,
                         "epoch": epoch, "epoch_step": epoch_step, **more})
    assert event is not None
    return event


def test_rank_0_saving_alone_gives_every_rank_its_newest_and_the_next_launch_too(
        weird_tmp: Path) -> None:
    saves = ScriptSaves(str(weird_tmp))
    assert saves.newest(2) == {}
    for epoch in (1, 2):
        saves.record(_saved(0, f"/ck/net-{epoch}_40.ckpt", epoch, 40, epoch_steps=40))
    saves.record(_saved(0, "/ck/net-3_3.ckpt", 3, 3, epoch_steps=40, step=83))
    assert {r: s.path for r, s in saves.newest(2).items()} == {0: "/ck/net-3_3.ckpt",
                                                               1: "/ck/net-3_3.ckpt"}
    again = ScriptSaves(str(weird_tmp))  # the same command into the same --log-dir
    newest = again.newest(2)[1]
    assert (newest.path, newest.step, newest.epoch, newest.epoch_step) == ("/ck/net-3_3.ckpt", 83, 3, 3)


def test_ranks_that_save_resume_from_a_place_every_one_of_them_completed(tmp_path: Path) -> None:
    """Rank 1 died before its save of epoch 2 completed: both resume from epoch 1, each from
    its own file; with no place in common, each from its own newest."""
    saves = ScriptSaves(str(tmp_path))
    for rank in (0, 1):
        saves.record(_saved(rank, f"/ck/r{rank}/net-1_5.ckpt", 1, 5))
    saves.record(_saved(0, "/ck/r0/net-2_5.ckpt", 2, 5))
    assert {r: s.path for r, s in saves.newest(3).items()} == {
        0: "/ck/r0/net-1_5.ckpt", 1: "/ck/r1/net-1_5.ckpt", 2: "/ck/r0/net-1_5.ckpt"}
    lone = ScriptSaves(str(tmp_path / "other"))
    lone.record(_saved(0, "/a/x.ckpt", 1, 1))
    lone.record(_saved(1, "/b/y.ckpt", 2, 2))
    assert {r: s.path for r, s in lone.newest(2).items()} == {0: "/a/x.ckpt", 1: "/b/y.ckpt"}


def test_what_does_not_read_as_a_save_is_dropped(tmp_path: Path) -> None:
    saves = ScriptSaves(str(tmp_path))
    saves.record(_saved(0, "relative.ckpt", 1, 1))
    bad = Event.parse({"event": "saved", "rank": 0, "path": "/x.ckpt", "size": "10"})
    assert bad is not None
    saves.record(bad)
    assert saves.newest(1) == {}
    for i in range(KEPT + 3):
        saves.record(_saved(0, f"/ck/n-{i + 1}_1.ckpt", i + 1, 1))
    data = json.loads((tmp_path / SAVED_FILE).read_text())
    assert len(data["ranks"]["0"]) == KEPT
    (tmp_path / SAVED_FILE).write_text('{"ranks": {"0": [{"path": 3}, {"path": "/ok.ckpt", "size": 1}], "x": 1}}')
    assert [s.path for s in ScriptSaves(str(tmp_path)).newest(1).values()] == ["/ok.ckpt"]
    (tmp_path / SAVED_FILE).write_text("[not json")
    assert ScriptSaves(str(tmp_path)).newest(1) == {}
    (tmp_path / SAVED_FILE).write_text('{"ranks": {"%s": [], "0": [{"path": "/ok.ckpt", "size": 1, '
                                       '"host": null, "step": -1, "epoch": "2"}]}}' % ("9" * 5000))
    assert list(ScriptSaves(str(tmp_path)).newest(1).values()) == [Saved("/ok.ckpt", 1)], \
        "a rank of 5000 digits is none; a null host, a negative step, an epoch in text are left out"


def test_of_two_files_at_one_place_the_one_named_for_it_is_resumed_from(tmp_path: Path) -> None:
    """mindcv's ``StateMonitor`` saves ``optim_<model>.ckpt`` and ``<model>-E_S.ckpt`` at each
    epoch's end, both with ``async_save``: whichever thread ends last, ``--ckpt_path`` gets the
    model's file (``optim_...``'s name has no epoch in it: mindcv's parse of it would fail)."""
    saves = ScriptSaves(str(tmp_path))
    for epoch, optim_last in ((1, True), (2, False), (3, True)):
        files = [f"/ck/net-{epoch}_4.ckpt", "/ck/optim_net.ckpt"]
        for path in files if optim_last else files[::-1]:
            saves.record(_saved(0, path, epoch, 4, epoch_steps=4))
        assert {r: s.path for r, s in saves.newest(2).items()} == {0: f"/ck/net-{epoch}_4.ckpt",
                                                                   1: f"/ck/net-{epoch}_4.ckpt"}
    alike = ScriptSaves(str(tmp_path / "alike"))  # no file named for its place: the last one
    for path in ("/ck/a.ckpt", "/ck/b.ckpt"):
        alike.record(_saved(0, path, 1, 4))
    assert alike.newest(1)[0].path == "/ck/b.ckpt"
