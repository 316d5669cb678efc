"""Node 0's record of the checkpoint files the script saved itself (``saved`` events: its
``save_checkpoint`` calls and ``ModelCheckpoint``s, ``parallel.hook.script_saves``), for the
``{checkpoint}`` argument and ``NPU_LAUNCH_CHECKPOINT`` of the next attempt or launch.

Per rank, the newest few completed files, kept in the log directory
(``checkpoint_ledger/saved.json``, written atomically after each one), so the same command run
again into the same ``--log-dir`` finds them as a restart does. What each rank resumes from
(``newest``):

* ranks that save resume from the newest place (epoch and step, as ``ModelCheckpoint`` names
  files; else the file's name) that every one of them completed (in a
  data-parallel script whose every rank saves, one rank may have died before its save of a
  step its peers completed: resuming from different steps would leave them waiting on each
  other); when they have no name in common, each from its own newest;
* of several files a rank saved at one place, the one whose name says that place
  (``PREFIX-EPOCH_STEP``): mindcv saves ``optim_<model>.ckpt`` beside ``<model>-E_S.ckpt`` at
  each epoch's end, both asynchronously, and the model's file is the one its ``--ckpt_path``
  takes, whichever thread ended last; among files alike, the last completed;
* ranks that never saved (a script that saves on rank 0 alone) get the lowest saving rank's.

The file read back is untrusted: what does not read as a save is dropped.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from typing import Any, Mapping, Optional

from launcher.limits import whole_number
from parallel.checkpoints.manifest import atomic_write_bytes
from parallel.contract import Event, JsonObject

SAVED_FILE = os.path.join("checkpoint_ledger", "saved.json")
KEPT = 8
"""Files remembered per rank."""
_LIMIT = 1 << 20
"""Bytes of ``saved.json`` read at most."""


@dataclasses.dataclass(frozen=True)
class Saved:
    """One checkpoint file a rank's script completed."""

    path: str
    size: int
    host: str = "?"
    step: Optional[int] = None
    epoch: Optional[int] = None
    epoch_step: Optional[int] = None
    epoch_steps: Optional[int] = None

    @classmethod
    def of(cls, event: Event) -> "Optional[Saved]":
        size = event.whole("size")
        if event.path is None or not os.path.isabs(event.path) or size is None:
            return None
        return cls(event.path, size, event.host, event.step, event.epoch,
                   _count(event.whole("epoch_step")), _count(event.whole("epoch_steps")))

    @classmethod
    def read(cls, data: Any) -> "Optional[Saved]":
        """One entry of ``saved.json``; None when it does not read as a save."""
        saved = JsonObject.of(data)
        path, size = (saved.text("path"), saved.whole("size")) if saved else (None, None)
        if saved is None or path is None or not os.path.isabs(path) or size is None:
            return None
        host = saved.text("host")
        return cls(path, size, "?" if host is None else host,
                   *(_count(saved.whole(k)) for k in ("step", "epoch", "epoch_step", "epoch_steps")))


def _count(value: Optional[int]) -> Optional[int]:
    return value if value is not None and value >= 0 else None


class ScriptSaves:
    """Every rank's newest completed files, as the ranks told them, across attempts and
    launches into one log directory. The watch loop feeds it; a lock guards the file."""

    def __init__(self, log_dir: str) -> None:
        self._path = os.path.join(log_dir, SAVED_FILE)
        self._ranks: dict[int, list[Saved]] = _load(self._path)
        self._lock = threading.Lock()

    def record(self, event: Event) -> None:
        """Take one ``saved`` event."""
        saved = Saved.of(event)
        if saved is None or event.rank < 0:
            return
        with self._lock:
            kept = [s for s in self._ranks.get(event.rank, []) if s.path != saved.path]
            self._ranks[event.rank] = [*kept, saved][-KEPT:]
            self._write()

    def newest(self, world: int) -> dict[int, Saved]:
        """The file each rank of ``world`` resumes from (see the module); empty before any."""
        with self._lock:
            ranks = {r: saves for r, saves in self._ranks.items() if 0 <= r < world and saves}
        if not ranks:
            return {}
        chosen = _common(ranks) or {r: _by_place(saves)[_place(saves[-1])] for r, saves in ranks.items()}
        lowest = chosen[min(chosen)]
        return {r: chosen.get(r, lowest) for r in range(world)}

    def _write(self) -> None:
        data = {str(r): [dataclasses.asdict(s) for s in saves] for r, saves in sorted(self._ranks.items())}
        try:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            atomic_write_bytes(self._path, json.dumps({"ranks": data}, indent=1).encode())
        except OSError:
            pass  # a full or read-only disk: this launch still knows them


def _common(ranks: Mapping[int, list[Saved]]) -> Optional[dict[int, Saved]]:
    """Each rank's file of the newest place (epoch and step, else file name) that every rank
    saved, or None when there is none."""
    places = [_by_place(saves) for saves in ranks.values()]
    for saved in reversed(ranks[min(ranks)]):
        if all(_place(saved) in p for p in places):
            return {r: by_place[_place(saved)] for r, by_place in zip(ranks, places)}
    return None


def _by_place(saves: list[Saved]) -> dict[object, Saved]:
    """Each place's file (see the module): the last completed, unless it does not name its place
    and an earlier one there does."""
    found: dict[object, Saved] = {}
    for saved in saves:
        held = found.get(_place(saved))
        if held is None or _names_its_place(saved) or not _names_its_place(held):
            found[_place(saved)] = saved
    return found


def _names_its_place(saved: Saved) -> bool:
    name = os.path.basename(saved.path)
    return re.search(rf"-{saved.epoch}_{saved.epoch_step}\.(?:ckpt|safetensors)$", name) is not None


def _place(saved: Saved) -> object:
    if saved.epoch is not None and saved.epoch_step is not None:
        return (saved.epoch, saved.epoch_step)
    return os.path.basename(saved.path)


def _load(path: str) -> dict[int, list[Saved]]:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(_LIMIT))
    except (OSError, ValueError, RecursionError):
        return {}
    doc = JsonObject.of(data)
    ranks = doc.object("ranks") if doc is not None else None
    if ranks is None:
        return {}
    found: dict[int, list[Saved]] = {}
    for name, saves in ranks.record.items():
        if (rank := whole_number(name)) is not None and isinstance(saves, list):
            found[rank] = [s for s in map(Saved.read, saves[-KEPT:]) if s is not None]
    return found
