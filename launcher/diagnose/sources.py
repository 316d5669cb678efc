"""Which files a diagnosis reads, and whose they are.

``npu-launch diagnose`` takes any log directory or file: npu-launch's own (``rank_N.log``,
``ascend/rank_N/``), msrun's (``worker_N.log``, ``scheduler.log``), torchrun's
(``attempt_K/N/stderr.log``), Slurm's output files, CANN's plog folders. A file's rank is read
from its path; a file of no known rank is diagnosed on its own. In npu-launch's own log
directory each rank's host is read from the plan it keeps there (``plan.json``), so that
``npu-launch diagnose`` names ranks as the job's failure block did (``rank 3 on node2``).
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
from typing import Iterator, Optional, Sequence

from launcher.limits import MAX_RANK_TABLE_BYTES
from launcher.plan.launch_plan import PLAN_FILE
from parallel.record_fields import JsonObject
from rank_tables.bounded import parse_json, read_text

MAX_FILES = 100_000
_SKIPPED_NAMES = re.compile(r"\.(json|jsonl|png|jpg|gz|tar|zip|ckpt|safetensors|npy|pb|om|so)$")
_RANK_IN_PATH = (re.compile(r"(?:^|[/_.-])(?:rank|worker)[_-]?(\d+)(?=[/_.-]|$)"),
                 re.compile(r"attempt_\d+/(\d+)/std(?:out|err)\.log$"))


@dataclasses.dataclass(frozen=True)
class LogFile:
    """A file to read: its path, whose it is (None: no known rank), from which byte."""

    path: str
    rank: Optional[int] = None
    host: Optional[str] = None
    start: int = 0


def rank_of(path: str) -> Optional[int]:
    """The rank a log's path names (the last mention wins: ``hosts/x/rank_3.log``)."""
    found = None
    for pattern in _RANK_IN_PATH:
        for match in pattern.finditer(path.replace(os.sep, "/")):
            found = int(match.group(1))
    return found


def collect(paths: Sequence[str], notes: list[str]) -> list[LogFile]:
    """The files under ``paths``, each once (symbolic links followed, loops cut), and a note
    for each path that cannot be read."""
    seen: set[tuple[int, int]] = set()
    files: list[LogFile] = []
    for path in paths:
        hosts = plan_hosts(path) if os.path.isdir(path) else {}
        for found in _walk(path, seen, notes):
            if len(files) >= MAX_FILES:
                notes.append(f"more than {MAX_FILES} files: the rest skipped")
                return files
            rank = rank_of(os.path.relpath(found, path) if os.path.isdir(path) else found)
            files.append(LogFile(found, rank, hosts.get(rank) if rank is not None else None))
    return files


def plan_hosts(folder: str) -> dict[int, str]:
    """Each rank's host, as the ``plan.json`` of an npu-launch log directory names it; none when
    there is none, or it cannot be read (the folder may hold anything)."""
    try:
        plan = JsonObject.of(parse_json(read_text(os.path.join(folder, PLAN_FILE),
                                                  MAX_RANK_TABLE_BYTES, "plan"), PLAN_FILE))
    except (OSError, ValueError):  # UnreadableFile, NotUtf8 among them
        return {}
    hosts = {}
    for spec in (plan.items("ranks") or ()) if plan else ():
        entry = JsonObject.of(spec)
        rank, host = (entry.whole("rank"), entry.text("host")) if entry else (None, None)
        if rank is not None and host:
            hosts[rank] = host
    return hosts


def _walk(path: str, seen: set[tuple[int, int]], notes: list[str]) -> Iterator[str]:
    try:
        info = os.stat(path)
    except OSError as e:
        notes.append(f"{path}: {e.strerror or e}")
        return
    key = (info.st_dev, info.st_ino)
    if key in seen:
        return  # a link back to a folder already read: a loop, or the same file twice
    seen.add(key)
    if stat.S_ISREG(info.st_mode):
        if not _SKIPPED_NAMES.search(path):
            yield path
        return
    if not stat.S_ISDIR(info.st_mode):
        notes.append(f"{path}: not a file or folder, skipped")
        return
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        notes.append(f"{path}: {e.strerror or e}")
        return
    for name in names:
        yield from _walk(os.path.join(path, name), seen, notes)
