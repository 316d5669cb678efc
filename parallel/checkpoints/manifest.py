"""What a complete checkpoint is, as plain data: the manifest and its entries, and the atomic
writes every file of a checkpoint goes through.

Both sides read these: the trainer writes and loads manifests (``parallel.checkpoints.checkpoint``), and
node 0's launcher builds the job-wide one from the ranks' checkpoint events
(``launcher.checkpoints.ledger``). Standard library only.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class DataPosition:
    """Where training stands: the epoch, batches of it consumed, optimizer steps taken."""

    epoch: int = 0
    batch_in_epoch: int = 0
    global_step: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DataPosition":
        """Read the three integer fields from a JSON object."""
        return cls(int(data["epoch"]), int(data["batch_in_epoch"]), int(data["global_step"]))


@dataclasses.dataclass(frozen=True)
class RankFile:
    """One rank's checkpoint file as the manifest records it (``name`` relative to the step dir)."""

    rank: int
    name: str
    size: int
    sha256: str
    position: DataPosition

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)

    @classmethod
    def reported(cls, rank: int, record: Mapping[str, Any]) -> "Optional[RankFile]":
        """The file a rank's ``checkpoint`` event record describes (``name``, ``size``,
        ``sha256``, ``position``); None when the record lacks any of them."""
        try:
            return cls(rank, str(record["name"]), int(record["size"]), str(record["sha256"]),
                       DataPosition.from_dict(record["position"]))
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RankFile":
        """Inverse of :meth:`to_dict`."""
        return cls(int(data["rank"]), str(data["name"]), int(data["size"]), str(data["sha256"]),
                   DataPosition.from_dict(data["position"]))


def complete_files(files: Mapping[int, RankFile], world_size: int
                   ) -> "Optional[tuple[RankFile, ...]]":
    """The one rule for a complete step: a file from every rank ``0 .. world_size - 1``, all at
    the same data position (ranks that disagree where training stands give no step to resume
    from). The files in rank order, or None. Node 0's ledger writes a manifest for exactly these
    steps, and summary.json calls exactly these complete."""
    if world_size <= 0 or any(r not in files for r in range(world_size)):
        return None
    ordered = tuple(files[r] for r in range(world_size))
    return ordered if len({f.position for f in ordered}) == 1 else None


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A complete checkpoint: every rank's file for ``step``, with checksums."""

    step: int
    world_size: int
    position: DataPosition
    files: tuple[RankFile, ...]
    created: float

    @property
    def epoch(self) -> int:
        """The epoch the data position is in."""
        return self.position.epoch

    def file_for(self, rank: int) -> RankFile:
        """The entry of ``rank``."""
        return self.files[rank]

    def to_json(self) -> str:
        """The manifest file's content."""
        return json.dumps({"step": self.step, "epoch": self.epoch, "world_size": self.world_size,
                           "position": dataclasses.asdict(self.position),
                           "files": [f.to_dict() for f in self.files], "created": self.created},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """Parse a manifest file; raises ``KeyError``/``ValueError`` on a malformed one."""
        data = json.loads(text)
        files = tuple(RankFile.from_dict(f) for f in data["files"])
        if [f.rank for f in files] != list(range(int(data["world_size"]))):
            raise ValueError("manifest files do not list ranks 0..world_size-1 in order")
        return cls(int(data["step"]), int(data["world_size"]),
                   DataPosition.from_dict(data["position"]), files, float(data["created"]))


def sha256_file(path: PathLike) -> str:
    """Hex sha256 of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# Atomic files ------------------------------------------------------------------------------------

def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old content or all of the new."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_save(path: PathLike, write: Callable[[Path], None]) -> None:
    """Have ``write(tmp)`` create a temporary file, then move it atomically to ``path``."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        write(tmp)
        _fsync_file(tmp)
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _temp_name(path: Path) -> Path:
    # Keeps the real suffix last: MindSpore appends ".ckpt" to names that do not end in it.
    return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


def _publish(tmp: Path, path: Path) -> None:
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: "str | os.PathLike[str]") -> None:
    """Make a rename or a new file in ``path`` durable: sync the directory itself."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
