"""Node 0's ledger of the job's checkpoints: which steps are complete, and how to resume one.

Every rank reports each checkpoint file it writes in a ``checkpoint`` event (step, its file's
name, size, sha256 and data position, the host it is on). The ledger, fed every rank's events
on node 0 whatever host wrote them, calls a step complete once every rank of the world has
reported it, and writes that step's job-wide manifest under the log directory
(``checkpoint_ledger/step_<N>/manifest.json``, the trainer's own format, plus ``files.json``: where
each rank's file is). That, not what one host's directory holds, is what "complete" means for
resuming and for ``summary.json``: on hosts that share no storage, rank 0 never sees the
others' files, and no host alone could say.

Without shared storage the ledger also keeps node 0's copies of the files a restart would need
(``launcher.cluster.collect`` says which ranks' files the agents send, in the background of their
ranks): every slice of a sliced (model- or pipeline-parallel) step that is not on node 0's
disk, or one replica of a data-parallel step when node 0 runs no rank; and the one file of a
step's last words, kept while that step is the newest complete one. The payload server
receives each upload (``launcher.cluster.payload``); the ledger says whether it is wanted
(``accepts``: a rank it collects, a step not yet pruned, a size the disk can hold) and moves
the checked file into place (``received``): ``checkpoint_ledger/step_<N>/rank_<R>/<name>``.
Only the newest complete step whose files all arrived keeps its copies: older ones are deleted
as soon as a newer step is complete and collected.

A restart resumes from the newest complete step (``resume_point``; when node 0 collects, the
newest it holds every collected file of), as ``launcher.checkpoints.resume`` places it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from typing import Callable, Collection, Mapping, Optional

from launcher.checkpoints.resume import ResumePoint, intact
from launcher.checkpoints.uploads import Upload
from launcher.files import remove
from parallel.checkpoints.manifest import MANIFEST, Manifest, RankFile, atomic_write_bytes, complete_files, fsync_dir
from parallel.contract import Event

LEDGER_DIR = "checkpoint_ledger"
FILES = "files.json"
STAGING = ".incoming"
"""Under the ledger's folder: uploads still arriving."""
TOLD_WAIT = 5.0
"""Seconds an upload of last words waits for node 0 to record their checkpoint event: the
agent sends the event down its stdout and the file to the payload server at once, and node 0
reads the agents' lines on its own tick, later on a loaded host."""


@dataclasses.dataclass(frozen=True)
class Reported:
    """One rank's file of one step, as its checkpoint event said: where it is, and what."""

    host: str
    path: str
    file: RankFile


@dataclasses.dataclass(frozen=True)
class Collected:
    """Node 0's copy of one rank's file of one step, as its upload was checked."""

    path: str
    size: int
    sha256: str

    def stands_for(self, file: RankFile) -> bool:
        return (self.size, self.sha256) == (file.size, file.sha256)


class CheckpointLedger:
    """Every checkpoint the job's ranks reported, across attempts and hosts, and node 0's
    collected copies of the files of ``collect``'s ranks (``launcher.cluster.collect``). The payload
    server's threads hand it uploads (it is its ``UploadReceiver``) while the watch loop feeds
    it events: one lock guards it."""

    def __init__(self, log_dir: str, world_size: int, data_parallel: bool,
                 collect: Collection[int] = (),
                 on_collected: Callable[[int, float], None] = lambda size, seconds: None,
                 agents: bool = False) -> None:
        self._dir = os.path.join(log_dir, LEDGER_DIR)
        self._log_dir = log_dir
        self._world = world_size
        self._data_parallel = data_parallel
        self._collect = frozenset(collect)
        self._on_collected = on_collected
        self._steps: dict[int, dict[int, Reported]] = {}
        self._complete: dict[int, Manifest] = {}
        self._collected: dict[int, dict[int, Collected]] = {}
        self._on_node0: dict[int, frozenset[int]] = {}
        """Per complete step, the ranks whose file node 0 found at its own path."""
        self._pruned_below = 0
        """Copies of steps before this one are deleted, and no longer taken."""
        self._seen_on_node0: Optional[bool] = None
        self._standing: dict[int, int] = {}
        """Per last-words step, the rank whose one file stands for every rank's: node 0 takes
        its upload whatever it collects (a restart's other hosts need it)."""
        self._agents = agents
        """Node agents run the ranks: their files may be on disks node 0 does not see."""
        self.earlier_step = newest_written(self._dir)
        """The newest step an earlier launch into this log directory left complete (the same
        command run again), as its manifest here says; None when there is none."""
        self._lock = threading.Lock()
        self._told = threading.Condition(self._lock)
        """Notified as each checkpoint event is recorded (an upload may wait for its own)."""

    def record(self, event: Event) -> Optional[Manifest]:
        """Take one ``checkpoint`` event; the step's manifest when this one completed it. A
        complete step a rank saves again (a restart that went back before it) gets its
        manifest rewritten with the file as it now is."""
        told = reported(event)
        if told is None or told.file.position.global_step != event.step:
            return None
        step = told.file.position.global_step
        if not 0 <= event.rank < self._world:
            return None  # not a rank of this job
        with self._lock:
            ranks = self._steps.setdefault(step, {})
            if event.flag("last_words"):
                self._standing[step] = event.rank
                self._told.notify_all()
            for rank, file in files_standing(event, told.file, self._world).items():
                ranks[rank] = dataclasses.replace(told, file=file)
            files = complete_files({r: rep.file for r, rep in ranks.items()}, self._world)
            if files is None:
                return None
            before = self._complete.get(step)
            if before is not None and before.files == files:
                return None
            manifest = Manifest(step, self._world, files[0].position, files, event.time or 0.0)
            self._complete[step] = manifest
            self._write(manifest, ranks)
            self._on_node0[step] = frozenset(r for r, rep in ranks.items()
                                             if _size_is(rep.path, rep.file.size))
            self._note_storage(step, ranks)
            self._prune()
        return manifest if before is None else None

    @property
    def complete_steps(self) -> list[int]:
        with self._lock:
            return sorted(self._complete)

    def reshape(self, world: int, collect: Collection[int], resumed: Optional[int]) -> None:
        """The job goes on with ``world`` ranks from step ``resumed``: what the ranks report
        after that step is of the attempts being redone, and is forgotten; so are the
        reports of ranks that no longer exist from steps not complete."""
        with self._lock:
            self._world = world
            self._collect = frozenset(collect)
            for step in list(self._steps):
                if resumed is None or step > resumed:
                    self._steps.pop(step)
                    self._complete.pop(step, None)
                elif step not in self._complete:
                    self._steps[step] = {r: rep for r, rep in self._steps[step].items()
                                         if r < world}

    @property
    def storage(self) -> Optional[str]:
        """``shared`` when node 0 found every rank's file of every complete step at its own
        path, ``private`` when it did not; None before a step completed, and for a job
        without node agents (every file is on this host)."""
        with self._lock:
            if self._seen_on_node0 is None:
                return None
            return "shared" if self._seen_on_node0 else "private"

    def collected_steps(self) -> list[int]:
        """Steps of which node 0 holds collected copies."""
        with self._lock:
            return sorted(step for step, ranks in self._collected.items() if ranks)

    def resume_point(self) -> Optional[ResumePoint]:
        """The newest complete step, as a restart resumes from it; when node 0 collects, the
        newest of those it holds every collected rank's file of (the newest may have been
        written just before a host was lost, and its file never came). A step's last words,
        one rank's file that stands for every rank, count in a job of agents only once node 0
        holds that file (it saw it, or its agent sent it): the other hosts get it from there."""
        with self._lock:
            for step in self._newest_first():
                replicas = self._replicas(step) if self._data_parallel else self._slices(step)
                if step in self._standing and self._agents and not replicas:
                    continue
                return ResumePoint(step, self._complete[step].to_json(),
                                   {r: rep.path for r, rep in self._steps[step].items()}, replicas)
            return None

    def last_words_passed_over(self, resume: Optional[ResumePoint]) -> Optional[int]:
        """The newest complete step when ``resume`` (what ``resume_point`` gave) is not it:
        last words ``resume_point`` passed over, their file not on node 0 (its upload did not
        end within ``--kill-timeout``, or failed). Nothing is read again: the only steps it
        passes over are those."""
        with self._lock:
            order = self._newest_first()
        chosen = resume.step if resume is not None else None
        return order[0] if order and order[0] != chosen else None

    def _newest_first(self) -> list[int]:
        """Complete steps, newest first; when node 0 collects, the ones it holds every collected
        file of before the others."""
        return sorted(self._complete, reverse=True,
                      key=lambda s: (bool(self._collect) and self._fully_collected(s), s))

    # Uploads (``payload.UploadReceiver``) ---------------------------------------------------

    @property
    def staging(self) -> str:
        return os.path.join(self._dir, STAGING)

    def accepts(self, upload: Upload) -> bool:
        """A rank whose files node 0 collects, or the file of a step's last words; a step not
        pruned yet; a size node 0's disk can hold. Last words may come before node 0 has
        recorded their event (``TOLD_WAIT``)."""
        with self._told:
            self._told.wait_for(lambda: not self._on_its_way(upload), TOLD_WAIT)
            wanted = self._wanted(upload)
        return wanted and upload.size <= _free_bytes(self._log_dir)

    def _wanted(self, upload: Upload) -> bool:
        return upload.step >= self._pruned_below and (
            upload.rank in self._collect or self._standing.get(upload.step) == upload.rank)

    def _on_its_way(self, upload: Upload) -> bool:
        """Not wanted yet, but it may be last words whose event is still on its way: from a
        rank of a replicated job (only those save last words), of a step not pruned, none older
        than any node 0 has heard of, and no saver known for it."""
        return self._data_parallel and 0 <= upload.rank < self._world \
            and not self._wanted(upload) and upload.step >= self._pruned_below \
            and upload.step not in self._standing and upload.step >= max(self._steps, default=-1)

    def received(self, upload: Upload, path: str, seconds: float) -> bool:
        """Move the checked file at ``path`` to its place; False when its step was pruned
        while it came."""
        with self._lock:
            if not self._wanted(upload):
                return False
            folder = os.path.join(self._dir, f"step_{upload.step}", f"rank_{upload.rank}")
            os.makedirs(folder, exist_ok=True)
            target = os.path.join(folder, upload.name)
            os.replace(path, target)
            fsync_dir(folder)
            before = self._collected.setdefault(upload.step, {}).get(upload.rank)
            if before is not None and before.path != target:
                _remove(before.path)
            self._collected[upload.step][upload.rank] = Collected(target, upload.size,
                                                                  upload.sha256)
            self._prune()
        self._on_collected(upload.size, seconds)
        return True

    # ------------------------------------------------------------------------------------------

    def _replicas(self, step: int) -> dict[int, str]:
        """Files of ``step`` that are on this host, intact: in data parallelism any one of them
        can stand in for every rank's; a collected copy when node 0 runs no rank."""
        ranks = self._steps[step]
        for reported in ranks.values():
            if intact(reported.path, reported.file):
                return {r: reported.path for r in range(self._world)}
        for rank, copy in sorted(self._copies(step).items()):
            if rank in ranks and intact(copy.path, ranks[rank].file):
                return {r: copy.path for r in range(self._world)}
        return {}

    def _copies(self, step: int) -> dict[int, Collected]:
        """Node 0's collected copies of ``step``'s files, by rank (none yet: empty)."""
        return self._collected.get(step, {})

    def _slices(self, step: int) -> dict[int, str]:
        """Node 0's collected copy of each rank's own file of ``step`` (the agent that fetches
        one checks it against the manifest, ``place_for_resume``). A file that is on node 0's
        disk at its own path is its rank's already, on node 0 or on storage it shares: a copy
        of it would be no other file."""
        copies = self._copies(step)
        return {rank: copies[rank].path for rank, told in self._steps[step].items()
                if rank in copies and copies[rank].stands_for(told.file)}

    def _fully_collected(self, step: int) -> bool:
        """Node 0 has every collected rank's file of the complete ``step``: a checked copy, or
        the file itself at its own path (a host that shares node 0's storage sends none)."""
        copies = self._copies(step)
        ranks, seen = self._steps[step], self._on_node0.get(step, frozenset())
        return all(r in seen or (r in copies and copies[r].stands_for(ranks[r].file))
                   for r in self._collect)

    def _prune(self) -> None:
        """Keep copies only from the newest complete step whose files all arrived on; a last
        words copy only while its step is the newest complete one."""
        newest = max(self._complete, default=-1)
        for step, rank in self._standing.items():
            copies = self._copies(step)
            if step < newest and rank not in self._collect and rank in copies:
                _remove(copies.pop(rank).path)
        done = [s for s in self._complete if s > self._pruned_below and self._collect
                and self._fully_collected(s)]
        if not done:
            return
        self._pruned_below = max(done)
        for step in [s for s in self._collected if s < self._pruned_below]:
            for copy in self._collected.pop(step).values():
                _remove(copy.path)
            _remove_empty(os.path.join(self._dir, f"step_{step}"))

    def _note_storage(self, step: int, ranks: Mapping[int, Reported]) -> None:
        """Whether node 0 sees every rank's file of a step where it is."""
        if not self._agents:
            return
        seen = len(self._on_node0[step]) == len(ranks)
        self._seen_on_node0 = seen if self._seen_on_node0 is None else self._seen_on_node0 and seen

    def _write(self, manifest: Manifest, ranks: Mapping[int, Reported]) -> None:
        folder = os.path.join(self._dir, f"step_{manifest.step}")
        os.makedirs(folder, exist_ok=True)
        atomic_write_bytes(os.path.join(folder, MANIFEST), manifest.to_json().encode())
        where = {str(r): {"host": rep.host, "path": rep.path} for r, rep in sorted(ranks.items())}
        atomic_write_bytes(os.path.join(folder, FILES), json.dumps(where, indent=1).encode())


def newest_written(folder: str) -> Optional[int]:
    """The newest step whose manifest is in the ledger's ``folder`` and reads as one."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    steps = sorted((int(n[5:]) for n in names if n.startswith("step_") and n[5:].isdigit()),
                   reverse=True)
    for step in steps:
        try:
            with open(os.path.join(folder, f"step_{step}", MANIFEST), "rb") as f:
                if Manifest.from_json(f.read(_MANIFEST_LIMIT).decode()).step == step:
                    return step
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue
    return None


_MANIFEST_LIMIT = 64 << 20
"""Bytes of a manifest read at most (one entry per rank: a few hundred bytes each)."""


def files_standing(event: Event, file: RankFile, world: int) -> dict[int, RankFile]:
    """The ranks a checkpoint event's ``file`` stands for: its own rank, or, for last words
    (``parallel.checkpoints.last_words``: a data-parallel replica's state saved as a peer failed), every
    rank of the world, each entry naming that one file."""
    if not event.flag("last_words"):
        return {event.rank: file}
    return {rank: dataclasses.replace(file, rank=rank) for rank in range(world)}


def reported(event: Event) -> Optional[Reported]:
    """The file a checkpoint event describes; None when the event lacks what it takes."""
    file = RankFile.reported(event.rank, event.record)
    if file is None or event.path is None or not os.path.isabs(event.path):
        return None
    return Reported(event.host, event.path, file)


def _size_is(path: str, size: int) -> bool:
    try:
        return os.path.getsize(path) == size
    except OSError:
        return False


def _free_bytes(path: str) -> int:
    """Free space on the file system of ``path``, or of the folder it will be made in."""
    while True:
        try:
            return shutil.disk_usage(path).free
        except FileNotFoundError:
            if os.path.dirname(path) == path:
                return 0
            path = os.path.dirname(path)
        except OSError:
            return 0


def _remove(path: str) -> None:
    """Delete a collected copy, and its rank's folder once empty."""
    remove(path)
    _remove_empty(os.path.dirname(path))


def _remove_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:
        pass  # not empty (a complete step's manifest stays), or gone
