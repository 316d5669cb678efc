"""Per-rank checkpoints written atomically, and the manifest that marks a step complete.

Layout::

    <ckpt_dir>/step_<N>/rank_<r>.ckpt    MindSpore checkpoint of rank r (network, optimizer, extras)
    <ckpt_dir>/step_<N>/rank_<r>.json    its size, sha256 and data position, written after it
    <ckpt_dir>/step_<N>/manifest.json    written by rank 0 once every rank's pair exists

Every file is written under a temporary name in the same directory, fsynced, then
``os.replace``-d into place and the directory fsynced, so a crash at any moment leaves either the
old file or the new one. A step without a manifest is not a checkpoint: resuming only ever
considers complete steps.

The manifest's types live in ``parallel.checkpoints.manifest`` (no MindSpore: the launcher reads and writes
them too); saving and loading import MindSpore when they run.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from parallel.checkpoints.manifest import (  # noqa: F401
    MANIFEST,
    DataPosition,
    Manifest,
    PathLike,
    RankFile,
    atomic_save,  # (re-exported)
    atomic_write_bytes,
    sha256_file,
)

EXTRA_PREFIX = "npu_launch."
"""Names of the non-parameter entries in a rank file (loss scale, data position)."""
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, inconsistent or corrupt."""


class ReplicaMismatchError(RuntimeError):
    """Data-parallel replicas whose trainable parameters differ."""


# Paths -------------------------------------------------------------------------------------------

def step_dir(ckpt_dir: PathLike, step: int) -> Path:
    """``<ckpt_dir>/step_<step>``."""
    return Path(ckpt_dir) / f"step_{step}"


def rank_checkpoint_path(ckpt_dir: PathLike, step: int, rank: int) -> Path:
    """``<ckpt_dir>/step_<step>/rank_<rank>.ckpt``."""
    return step_dir(ckpt_dir, step) / f"rank_{rank}.ckpt"


def _sidecar_path(ckpt_path: Path) -> Path:
    return ckpt_path.with_suffix(".json")


def list_steps(ckpt_dir: PathLike) -> list[int]:
    """Steps that have a ``step_<N>`` directory, complete or not, oldest first."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        return []
    found = (_STEP_DIR.match(entry.name) for entry in root.iterdir() if entry.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def _remove_stale_temps(directory: Path, stem: str) -> None:
    # Left by a rank killed between writing and renaming; never read, so safe to drop.
    for stale in directory.glob(f".{stem}.tmp*"):
        stale.unlink(missing_ok=True)


# Saving and loading one rank ---------------------------------------------------------------------

def save_rank(ckpt_dir: PathLike, step: int, rank: int, params: Sequence[Any],
              position: DataPosition, extras: Optional[Mapping[str, Union[int, float]]] = None,
              values: Optional[Mapping[str, Any]] = None) -> RankFile:
    """Write rank ``rank``'s checkpoint of ``step`` atomically, then its sidecar; return its entry.

    ``params`` are MindSpore ``Parameter`` objects (network and optimizer state); ``values``
    (name -> tensor) replace some of them by values copied earlier; ``extras`` are scalars
    stored beside them under ``npu_launch.<name>`` (with the data position).
    """
    import mindspore as ms

    path = rank_checkpoint_path(ckpt_dir, step, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path.parent, path.stem)
    values = values or {}
    entries = [{"name": p.name, "data": values.get(p.name, p)} for p in params]
    append = _extras_dict(position, extras or {})
    atomic_save(path, lambda tmp: ms.save_checkpoint(entries, str(tmp), append_dict=append))
    entry = RankFile(rank, path.name, path.stat().st_size, sha256_file(path), position)
    atomic_write_bytes(_sidecar_path(path), json.dumps(entry.to_dict()).encode())
    return entry


def read_rank_entry(ckpt_dir: PathLike, step: int, rank: int) -> Optional[RankFile]:
    """Rank ``rank``'s entry of ``step`` as its sidecar says; None when it is not there."""
    sidecar = _sidecar_path(rank_checkpoint_path(ckpt_dir, step, rank))
    try:
        return RankFile.from_dict(json.loads(sidecar.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_rank(ckpt_dir: PathLike, step: int, rank: int) -> None:
    """Delete rank ``rank``'s file of ``step`` and its sidecar (the sidecar first), and the step
    directory once empty."""
    ckpt = rank_checkpoint_path(ckpt_dir, step, rank)
    _sidecar_path(ckpt).unlink(missing_ok=True)
    ckpt.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        ckpt.parent.rmdir()


def _extras_dict(position: DataPosition, extras: Mapping[str, Union[int, float]]) -> dict:
    values = {**dataclasses.asdict(position), **extras}
    return {EXTRA_PREFIX + name: value for name, value in values.items()}


@dataclasses.dataclass(frozen=True)
class LoadedRank:
    """A rank file read back: parameter values by name and the extras saved beside them."""

    params: dict[str, Any]
    extras: dict[str, float]
    position: DataPosition


def load_rank(ckpt_dir: PathLike, manifest: Manifest, rank: int, verify: bool = True) -> LoadedRank:
    """Read rank ``rank``'s file of ``manifest``, checking its size and sha256 when ``verify``."""
    import mindspore as ms

    entry = manifest.file_for(rank)
    path = step_dir(ckpt_dir, manifest.step) / entry.name
    if verify:
        _verify(path, entry)
    loaded = ms.load_checkpoint(str(path))
    extras = {name[len(EXTRA_PREFIX):]: float(value.asnumpy())
              for name, value in loaded.items() if name.startswith(EXTRA_PREFIX)}
    params = {name: value for name, value in loaded.items() if not name.startswith(EXTRA_PREFIX)}
    return LoadedRank(params, extras, entry.position)


def _verify(path: Path, entry: RankFile) -> None:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing, but the manifest lists it")
    size, digest = path.stat().st_size, sha256_file(path)
    if (size, digest) != (entry.size, entry.sha256):
        raise CheckpointError(f"{path}: size/sha256 {size}/{digest[:12]} do not match the "
                              f"manifest's {entry.size}/{entry.sha256[:12]}")


# Completing steps (rank 0) -----------------------------------------------------------------------

def mark_complete(ckpt_dir: PathLike, step: int, world_size: int,
                  keep_last: Optional[int] = None) -> Optional[Manifest]:
    """Write ``step``'s manifest if every rank's file is there; return it, else ``None``.

    Reads each rank's sidecar (its size, sha256 and data position, written after the rank's file
    was in place) rather than hashing every rank's file again. With ``keep_last``, then deletes all
    but the newest ``keep_last`` complete steps (see :func:`prune`).
    """
    files = _rank_files(step_dir(ckpt_dir, step), world_size)
    if files is None:
        return None
    positions = {f.position for f in files}
    if len(positions) != 1:
        raise CheckpointError(f"step {step}: ranks saved different data positions: "
                              f"{sorted(map(dataclasses.astuple, positions))}")
    manifest = Manifest(step, world_size, files[0].position, tuple(files), time.time())
    atomic_write_bytes(step_dir(ckpt_dir, step) / MANIFEST, manifest.to_json().encode())
    if keep_last is not None:
        prune(ckpt_dir, keep_last)
    return manifest


def _rank_files(directory: Path, world_size: int) -> Optional[list[RankFile]]:
    files = []
    for rank in range(world_size):
        ckpt = directory / f"rank_{rank}.ckpt"
        sidecar = _sidecar_path(ckpt)
        if not (ckpt.is_file() and sidecar.is_file()):
            return None
        entry = RankFile.from_dict(json.loads(sidecar.read_text()))
        if entry.size != ckpt.stat().st_size:
            raise CheckpointError(f"{ckpt}: {ckpt.stat().st_size} bytes, its sidecar says "
                                  f"{entry.size}")
        files.append(entry)
    return files


def read_manifest(ckpt_dir: PathLike, step: int) -> Optional[Manifest]:
    """``step``'s manifest; ``None`` when the step is incomplete or its manifest unreadable."""
    path = step_dir(ckpt_dir, step) / MANIFEST
    try:
        return Manifest.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def complete_steps(ckpt_dir: PathLike) -> list[Manifest]:
    """Every complete step's manifest, oldest first."""
    found = (read_manifest(ckpt_dir, step) for step in list_steps(ckpt_dir))
    return [manifest for manifest in found if manifest is not None]


def latest_complete(ckpt_dir: PathLike) -> Optional[Manifest]:
    """The newest complete step's manifest, or ``None``."""
    for step in reversed(list_steps(ckpt_dir)):
        manifest = read_manifest(ckpt_dir, step)
        if manifest is not None:
            return manifest
    return None


def prune(ckpt_dir: PathLike, keep_last: int) -> list[int]:
    """Delete every step directory older than the ``keep_last``-th newest complete one.

    Incomplete steps newer than that are left alone: other ranks may still be writing them.
    Returns the deleted steps.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    complete = [m.step for m in complete_steps(ckpt_dir)]
    if len(complete) <= keep_last:
        return []
    oldest_kept = complete[-keep_last]
    doomed = [step for step in list_steps(ckpt_dir) if step < oldest_kept]
    for step in doomed:
        _remove_step(step_dir(ckpt_dir, step))
    return doomed


def prune_rank(ckpt_dir: PathLike, rank: int, oldest_kept: int) -> list[int]:
    """Delete ``rank``'s own files of every step older than ``oldest_kept`` (a step every rank
    is known to have saved), for a rank whose host holds only its own files, and the file the
    step's manifest names for ``rank`` when that is another rank's (a replica fetched for a
    resume, such as a peer's last words). A step's manifest goes first, then the files and
    sidecars, then the step directory once it is empty. Returns the steps it touched."""
    touched = []
    for step in list_steps(ckpt_dir):
        if step >= oldest_kept:
            continue
        directory = step_dir(ckpt_dir, step)
        ckpt = rank_checkpoint_path(ckpt_dir, step, rank)
        if not ckpt.exists() and not (directory / MANIFEST).exists():
            continue
        manifest = read_manifest(ckpt_dir, step)
        standing = {directory / f.name for f in (manifest.files if manifest else ())
                    if f.rank == rank and _RANK_FILE.fullmatch(f.name)}
        (directory / MANIFEST).unlink(missing_ok=True)
        for path in {ckpt} | standing:
            path.unlink(missing_ok=True)
            _sidecar_path(path).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            directory.rmdir()  # other ranks' files on a shared disk keep it
        touched.append(step)
    return touched


_RANK_FILE = re.compile(r"rank_\d{1,9}\.ckpt")
"""A file name a manifest may give for a rank: nothing outside its step directory is deleted."""


def _remove_step(directory: Path) -> None:
    # The manifest goes first: a crash half-way then leaves an incomplete step, never a manifest
    # that names deleted files.
    (directory / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


# Data-parallel replica check ---------------------------------------------------------------------

def parameters_digest(params: Iterable[Any]) -> bytes:
    """sha256 over the names, shapes, dtypes and bytes of ``params`` (MindSpore Parameters)."""
    digest = hashlib.sha256()
    for param in sorted(params, key=lambda p: p.name):
        value = param.asnumpy()
        digest.update(f"{param.name}|{value.shape}|{value.dtype}|".encode())
        digest.update(value.tobytes())
    return digest.digest()


def divergent_ranks(digests: Sequence[bytes]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(agreeing, odd)`` ranks: the largest group with one digest, and everyone else.

    With a tie for the largest group, the tied group holding the lowest rank is the reference.
    """
    groups: dict[bytes, list[int]] = collections.defaultdict(list)
    for rank, digest in enumerate(digests):
        groups[digest].append(rank)
    biggest = max(len(ranks) for ranks in groups.values())
    # Groups are in order of first appearance, so the first of the largest holds the lowest rank.
    reference = next(digest for digest, ranks in groups.items() if len(ranks) == biggest)
    agreeing = tuple(groups[reference])
    return agreeing, tuple(r for r in range(len(digests)) if r not in agreeing)


def check_replicas(digests: Sequence[bytes], step: int) -> None:
    """Raise :class:`ReplicaMismatchError` naming the odd ranks unless all ``digests`` agree."""
    agreeing, odd = divergent_ranks(digests)
    if not odd:
        return
    majority = len(agreeing) > len(digests) / 2
    reference = "the majority" if majority else "the largest group (no majority)"
    raise ReplicaMismatchError(
        f"data-parallel replicas differ at step {step}: the trainable parameters of rank(s) "
        f"{_ranks(odd)} disagree with {reference}, rank(s) {_ranks(agreeing)}; "
        "were the ranks started with one seed?")


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))
