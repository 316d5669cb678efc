"""A diagnosis of files: scan each once, group by rank, decide."""
from __future__ import annotations

from typing import Optional, Sequence

from launcher.diagnose.fast import scan_all
from launcher.diagnose.knowledge import Knowledge, load
from launcher.diagnose.scan import Hit, Unreadable
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
    found: dict[object, tuple[Optional[int], Optional[str], list[Hit]]] = {}
    read = 0
    results = scan_all([(log.path, log.start) for log in files], kb, deadline)
    if len(results) < len(files):
        notes.append(f"{len(files) - len(results)} log file(s) not read in time")
    for log in files:
        result = results.get(log.path)
        if isinstance(result, Unreadable):
            notes.append(str(result))
            continue
        if result is None:
            continue
        read += 1
        key = log.rank if log.rank is not None else log.path  # a file of no rank stands alone
        _, _, seen = found.setdefault(key, (log.rank, log.host, []))
        seen.extend(result)
    for _, _, hits in found.values():
        hits.sort(key=lambda h: kb.faults.index(h.fault))
    diagnosis = decide(list(found.values()), blamed)
    return Diagnosis(diagnosis.findings, tuple(notes), read)
