"""What a restart resumes from, and how each node puts it in place before its ranks start.

``ResumePoint`` (node 0's ledger, ``launcher.checkpoints.ledger``, says which; the plan carries
it to every node) is a complete step's manifest and where each rank's file was. Every node
writes the manifest beside its ranks' files before they start, and a rank whose file is missing
on its host (a wiped or replaced host) gets node 0's copy: a data-parallel replica (any rank's
file on node 0's disk, a collected one, or the one file of a step's last words), or its own
slice as node 0 collected it, which must then match the manifest's sha256. If there is none,
the job stops with one line naming the rank, the step and the host.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping, Optional, Sequence

from parallel.checkpoints.manifest import MANIFEST, Manifest, RankFile, atomic_write_bytes, sha256_file


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """What a restart resumes from: a complete step's manifest and where each rank's file was."""

    step: int
    manifest: str
    """The manifest's JSON (``parallel.checkpoints.manifest.Manifest``)."""
    paths: Mapping[int, str]
    """Rank -> its file's absolute path on its host."""
    replicas: Mapping[int, str]
    """Rank -> a file on node 0 that can stand in for it (a data-parallel replica)."""

    def for_world(self, world: int) -> "ResumePoint":
        """This data-parallel step as ``world`` ranks (fewer: ``--min-nodes`` left a host out)
        resume it: ranks ``0..world-1`` keep their entries and paths (a rank now on a host that
        has another rank's file gets node 0's replica), the others' go."""
        manifest = Manifest.from_json(self.manifest)
        files = tuple(f for f in manifest.files if f.rank < world)
        smaller = dataclasses.replace(manifest, world_size=world, files=files)
        return ResumePoint(self.step, smaller.to_json(),
                           {r: p for r, p in self.paths.items() if r < world},
                           {r: p for r, p in self.replicas.items() if r < world})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ResumePoint":
        return cls(int(data["step"]), str(data["manifest"]),
                   {int(r): str(p) for r, p in data["paths"].items()},
                   {int(r): str(p) for r, p in data["replicas"].items()})


class MissingCheckpoint(Exception):
    """A rank's file of the resume step is not on its host, and node 0 has nothing to stand in."""

    def __init__(self, rank: int, step: int, host: str, path: str,
                 why: str = "node 0 has no copy to stand in for it") -> None:
        super().__init__(f"rank {rank}'s checkpoint of step {step} is not on {host} ({path}) "
                         f"and {why}")
        self.rank = rank


def place_for_resume(point: ResumePoint, ranks: Sequence[int], host: str,
                     fetch: Optional[Callable[[int, str], None]], exact: bool = False) -> list[str]:
    """Before this node's ``ranks`` start again: each rank's file of ``point.step`` is checked
    (size and sha256), one that is missing or damaged is replaced by node 0's copy
    (``fetch(rank, path)`` writes it; with ``exact``, a sliced layout's, it must be the rank's
    own file, by its sha256), and the manifest, with the files as they now are, is written
    beside them. Returns what was fetched, for the log; ``MissingCheckpoint`` when a file
    cannot be had."""
    manifest = Manifest.from_json(point.manifest)
    fetched: list[str] = []
    by_folder: dict[str, dict[int, RankFile]] = {}
    for rank in ranks:
        path, entry = point.paths[rank], manifest.file_for(rank)
        if not intact(path, entry):
            if rank not in point.replicas or fetch is None:
                raise MissingCheckpoint(rank, point.step, host, path)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fetch(rank, path)
            if not exact:  # a replica stands in: the manifest says what it is
                entry = RankFile(rank, entry.name, os.path.getsize(path), sha256_file(path),
                                 entry.position)
            elif not intact(path, entry):
                os.remove(path)
                raise MissingCheckpoint(rank, point.step, host, path,
                                        "node 0's copy is not its file (another sha256)")
            fetched.append(f"rank {rank}: {entry.size} bytes of step {point.step} from node 0")
        by_folder.setdefault(os.path.dirname(path), {})[rank] = entry
    for folder, entries in by_folder.items():
        files = tuple(entries.get(f.rank, f) for f in manifest.files)
        atomic_write_bytes(os.path.join(folder, MANIFEST),
                           dataclasses.replace(manifest, files=files).to_json().encode())
    return fetched


def intact(path: str, file: RankFile) -> bool:
    """Whether the file at ``path`` is ``file``: its size and sha256."""
    try:
        return os.path.getsize(path) == file.size and sha256_file(path) == file.sha256
    except OSError:
        return False
