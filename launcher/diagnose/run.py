"""A diagnosis of files: scan each once, group by rank, decide."""
from __future__ import annotations

import time
from typing import Optional, Sequence

from launcher.diagnose.knowledge import Knowledge, load
from launcher.diagnose.scan import Hit, Unreadable, scan_file
from launcher.diagnose.sources import LogFile, collect
from launcher.diagnose.verdict import Diagnosis, decide


def diagnose_paths(paths: Sequence[str], knowledge: Optional[Knowledge] = None) -> Diagnosis:
    """``npu-launch diagnose``: every file under ``paths``; what could not be read is noted."""
    notes: list[str] = []
    files = collect(paths, notes)
    if not files and not notes:
        notes.append(f"no log files under {', '.join(paths)}")
    diagnosis = diagnose_files(files, knowledge, notes=notes)
    return diagnosis


def diagnose_files(files: Sequence[LogFile], knowledge: Optional[Knowledge] = None,
                   blamed: Optional[int] = None, deadline: Optional[float] = None,
                   notes: Optional[list[str]] = None) -> Diagnosis:
    """The diagnosis of ``files``; with a ``deadline`` (``time.monotonic()``), the files not
    reached by then are left out (a job's end must not wait on its logs)."""
    kb = knowledge or load()
    notes = [] if notes is None else notes
    found: dict[Optional[int], tuple[Optional[str], list[Hit]]] = {}
    read = 0
    for i, log in enumerate(files):
        if deadline is not None and time.monotonic() > deadline:
            notes.append(f"{len(files) - i} log file(s) not read in time")
            break
        try:
            hits = scan_file(log.path, kb, log.start)
        except Unreadable as e:
            notes.append(str(e))
            continue
        read += 1
        key = log.rank if log.rank is not None else None
        _, seen = found.setdefault(key, (log.host, []))
        seen.extend(hits)
    for _, hits in found.values():
        hits.sort(key=lambda h: kb.faults.index(h.fault))
    diagnosis = decide(found, blamed)
    return Diagnosis(diagnosis.findings, tuple(notes), read)
