"""The rank side of the script's own checkpoints, in this process with a stand-in for
MindSpore's ``save_checkpoint`` (same signature, writes the file): a ``saved`` event once the
file is complete (after the call, or after its ``async_save`` thread), with where it stands
when the name says; none for the shared trainer's files."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from parallel import contract
from parallel.hook import script_saves


def _fake_save(save_obj: Any, ckpt_file_name: str, integrated_save: bool = True,
               async_save: Any = False, append_dict: Any = None, format: str = "ckpt") -> None:
    path = ckpt_file_name if ckpt_file_name.endswith(format) else f"{ckpt_file_name}.{format}"

    def write() -> None:
        time.sleep(0.2 if async_save else 0)
        Path(path).write_bytes(b"x" * 7)
    if async_save:  # MindSpore's thread, or (here) a stand-in for its process
        name = script_saves.ASYNC_THREAD if async_save is True else "a process"
        threading.Thread(target=write, name=name).start()
    else:
        write()


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def events_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv(contract.EVENTS_FILE, str(path))
    monkeypatch.delenv(contract.RANK_PID, raising=False)
    return path


def test_a_file_is_told_once_complete_with_its_place(tmp_path: Path, events_file: Path) -> None:
    save = script_saves.reporting_save(_fake_save)
    save(None, str(tmp_path / "net-3_3"))
    save(None, str(tmp_path / "plain.ckpt"))
    save(None, str(tmp_path / "t.ckpt"), True, False, {"npu_launch.epoch": 1})  # the trainer's
    told = _events(events_file)
    assert [(e["event"], e["path"], e["size"]) for e in told] == [
        ("saved", str(tmp_path / "net-3_3.ckpt"), 7), ("saved", str(tmp_path / "plain.ckpt"), 7)]
    assert (told[0]["epoch"], told[0]["epoch_step"]) == (3, 3) and "epoch" not in told[1]


def test_an_async_save_is_told_when_its_thread_ends(tmp_path: Path, events_file: Path) -> None:
    save = script_saves.reporting_save(_fake_save)
    save(None, str(tmp_path / "net-1_5.ckpt"), True, True)
    assert _events(events_file) == [], "the file is still being written"
    deadline = time.monotonic() + 5
    while not _events(events_file) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [e["size"] for e in _events(events_file)] == [7]
    save(None, str(tmp_path / "net-1_6.ckpt"), True, "process")
    time.sleep(0.3)
    assert len(_events(events_file)) == 1, "an async process save is not told"


def test_inside_a_fit_the_fits_place_is_told(tmp_path: Path, events_file: Path) -> None:
    class Params:
        cur_epoch_num, cur_step_num, batch_num = 3, 83, 40
    script_saves.fit_began(Params())
    try:
        script_saves.reporting_save(_fake_save)(None, str(tmp_path / "whatever.ckpt"))
    finally:
        script_saves.fit_ended()
    told = _events(events_file)[0]
    assert (told["epoch"], told["epoch_step"], told["epoch_steps"], told["step"]) == (3, 3, 40, 83)
