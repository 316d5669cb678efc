"""Node 0's ledger of the job's checkpoints: which steps are complete, and how to resume one.

Every rank reports each checkpoint file it writes in a ``checkpoint`` event (step, its file's
name, size, sha256 and data position, the host it is on). The ledger, fed every rank's events
on node 0 whatever host wrote them, calls a step complete once every rank of the world has
reported it, and writes that step's job-wide manifest under the log directory
(``checkpoint_ledger/step_<N>/manifest.json``, the trainer's own format, plus ``files.json``: where
each rank's file is). That, not what one host's directory holds, is what "complete" means for
resuming and for ``summary.json``: on hosts that share no storage, rank 0 never sees the
others' files, and no host alone could say.

A restart resumes from the newest complete step (``ResumePoint``, carried in the plan): every
node writes the manifest beside its ranks' files before they start, and a rank whose file is
missing on its host (a wiped or replaced host) gets a data-parallel replica from node 0
(``replica_for``); if there is none, the job stops with one line naming the rank, the step and
the host.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping, Optional, Sequence

from parallel.manifest import (MANIFEST, DataPosition, Manifest, RankFile, atomic_write_bytes,
                               sha256_file)
from parallel.contract import Event

LEDGER_DIR = "checkpoint_ledger"
FILES = "files.json"


@dataclasses.dataclass(frozen=True)
class Reported:
    """One rank's file of one step, as its checkpoint event said: where it is, and what."""

    host: str
    path: str
    file: RankFile


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """What a restart resumes from: a complete step's manifest and where each rank's file was."""

    step: int
    manifest: str
    """The manifest's JSON (``parallel.checkpoint.Manifest``)."""
    paths: Mapping[int, str]
    """Rank -> its file's absolute path on its host."""
    replicas: Mapping[int, str]
    """Rank -> a file on node 0 that can stand in for it (a data-parallel replica)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ResumePoint":
        return cls(int(data["step"]), str(data["manifest"]),
                   {int(r): str(p) for r, p in data["paths"].items()},
                   {int(r): str(p) for r, p in data["replicas"].items()})


class CheckpointLedger:
    """Every checkpoint the job's ranks reported, across attempts and hosts."""

    def __init__(self, log_dir: str, world_size: int, data_parallel: bool) -> None:
        self._dir = os.path.join(log_dir, LEDGER_DIR)
        self._world = world_size
        self._data_parallel = data_parallel
        self._steps: dict[int, dict[int, Reported]] = {}
        self._complete: dict[int, Manifest] = {}

    def record(self, event: Event) -> Optional[Manifest]:
        """Take one ``checkpoint`` event; the step's manifest when this one completed it."""
        reported = _reported(event)
        if reported is None or reported.file.position.global_step != event.step:
            return None
        step = reported.file.position.global_step
        if not 0 <= event.rank < self._world:
            return None  # not a rank of this job
        ranks = self._steps.setdefault(step, {})
        ranks[event.rank] = reported
        if step in self._complete or len(ranks) < self._world:
            return None
        files = tuple(ranks[r].file for r in range(self._world))
        if len({f.position for f in files}) != 1:
            return None  # ranks disagree where training stands: not a step to resume from
        manifest = Manifest(step, self._world, files[0].position, files, event.time or 0.0)
        self._complete[step] = manifest
        self._write(manifest, ranks)
        return manifest

    @property
    def complete_steps(self) -> list[int]:
        return sorted(self._complete)

    def resume_point(self) -> Optional[ResumePoint]:
        """The newest complete step, as a restart resumes from it."""
        if not self._complete:
            return None
        step = max(self._complete)
        ranks = self._steps[step]
        return ResumePoint(step, self._complete[step].to_json(),
                           {r: rep.path for r, rep in ranks.items()},
                           self._replicas(step) if self._data_parallel else {})

    def _replicas(self, step: int) -> dict[int, str]:
        """Files of ``step`` that are on this host, intact: in data parallelism any one of them
        can stand in for every rank's."""
        for reported in self._steps[step].values():
            if _intact(reported.path, reported.file):
                return {r: reported.path for r in range(self._world)}
        return {}

    def _write(self, manifest: Manifest, ranks: Mapping[int, Reported]) -> None:
        folder = os.path.join(self._dir, f"step_{manifest.step}")
        os.makedirs(folder, exist_ok=True)
        atomic_write_bytes(os.path.join(folder, MANIFEST), manifest.to_json().encode())
        where = {str(r): {"host": rep.host, "path": rep.path} for r, rep in sorted(ranks.items())}
        atomic_write_bytes(os.path.join(folder, FILES), json.dumps(where, indent=1).encode())


class MissingCheckpoint(Exception):
    """A rank's file of the resume step is not on its host, and node 0 has nothing to stand in."""

    def __init__(self, rank: int, step: int, host: str, path: str) -> None:
        super().__init__(f"rank {rank}'s checkpoint of step {step} is not on {host} ({path}) "
                         "and node 0 has no copy to stand in for it")
        self.rank = rank


def place_for_resume(point: ResumePoint, ranks: Sequence[int], host: str,
                     fetch: Optional[Callable[[int, str], None]]) -> list[str]:
    """Before this node's ``ranks`` start again: each rank's file of ``point.step`` is checked
    (size and sha256), one that is missing or damaged is replaced by node 0's replica
    (``fetch(rank, path)`` writes it), and the manifest, with the files as they now are, is
    written beside them. Returns what was fetched, for the log; ``MissingCheckpoint`` when a
    file cannot be had."""
    manifest = Manifest.from_json(point.manifest)
    fetched: list[str] = []
    by_folder: dict[str, dict[int, RankFile]] = {}
    for rank in ranks:
        path, entry = point.paths[rank], manifest.file_for(rank)
        if not _intact(path, entry):
            if rank not in point.replicas or fetch is None:
                raise MissingCheckpoint(rank, point.step, host, path)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fetch(rank, path)
            entry = RankFile(rank, entry.name, os.path.getsize(path), sha256_file(path),
                             entry.position)
            fetched.append(f"rank {rank}: {entry.size} bytes of step {point.step} from node 0")
        by_folder.setdefault(os.path.dirname(path), {})[rank] = entry
    for folder, entries in by_folder.items():
        files = tuple(entries.get(f.rank, f) for f in manifest.files)
        atomic_write_bytes(os.path.join(folder, MANIFEST),
                           dataclasses.replace(manifest, files=files).to_json().encode())
    return fetched


def _reported(event: Event) -> Optional[Reported]:
    """The file a checkpoint event describes; None when the event lacks what it takes."""
    record = event.record
    try:
        position = DataPosition.from_dict(record["position"])
        file = RankFile(event.rank, str(record["name"]), int(record["size"]),
                        str(record["sha256"]), position)
    except (KeyError, TypeError, ValueError):
        return None
    if event.path is None or not os.path.isabs(event.path):
        return None
    return Reported(event.host, event.path, file)


def _intact(path: str, file: RankFile) -> bool:
    try:
        return os.path.getsize(path) == file.size and sha256_file(path) == file.sha256
    except OSError:
        return False
