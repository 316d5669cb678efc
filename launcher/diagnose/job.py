"""The diagnosis of one failed attempt, as the launcher ends it: each rank's log (this
attempt's part only) and its CANN logs (``ascend/rank_N``, written since the attempt began),
read within a deadline so that the job's end is not held up."""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Optional

from launcher.diagnose.knowledge import load
from launcher.diagnose.run import diagnose_files
from launcher.diagnose.sources import LogFile
from launcher.diagnose.verdict import Diagnosis
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.planner import ascend_log_dir
from launcher.run.failures import JobResult
from launcher.run.output import ATTEMPT_MARK

BUDGET = 0.12
"""Seconds a failed attempt's end may spend on its diagnosis (issue 40: at most 0.2 s; grep stopped
by a timer, threads joined and the files closed take the rest)."""
_MARK_SCAN = 16 << 20
_MAX_PLOGS = 64


def warm_up() -> None:
    """Read and compile the knowledge base in a daemon thread, while the job runs."""
    threading.Thread(target=load, name="npu-launch-diagnose-warm-up", daemon=True).start()


def diagnose_attempt(plan: LaunchPlan, blamed: Optional[int], since: float,
                     budget: float = BUDGET) -> Diagnosis:
    """The diagnosis of the attempt of ``plan`` that began at ``since`` (``time.time()``);
    ``blamed``: the rank the launcher already chose as the root cause."""
    deadline = time.monotonic() + budget
    files: list[LogFile] = []
    for spec in plan.processes:
        # Another host's rank: node 0's streamed copy at the top of the log dir, if not shared.
        copy = os.path.join(plan.log_dir, os.path.basename(spec.log_path))
        path = spec.log_path if os.path.isfile(spec.log_path) else copy
        if os.path.isfile(path):
            files.append(LogFile(path, spec.rank, spec.host, _attempt_start(path)))
        if spec.rank is not None:
            files += [LogFile(path, spec.rank, spec.host)
                      for path in _plogs(ascend_log_dir(plan.log_dir, spec.rank), since)]
    try:
        return diagnose_files(files, blamed=blamed, deadline=deadline)
    except Exception:  # noqa: BLE001 - a diagnosis must never turn a failure into a crash
        return Diagnosis()


def _attempt_start(path: str) -> int:
    """The byte offset where this attempt's output begins in a rank's log (after its last
    attempt mark, looked for in the last ``_MARK_SCAN`` bytes); 0 when there is none."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            begin = max(0, size - _MARK_SCAN)
            f.seek(begin)
            data = f.read(_MARK_SCAN)
    except OSError:
        return 0
    at = data.rfind(ATTEMPT_MARK)
    if at < 0:
        return 0
    end = data.find(b"\n", at)
    return begin + (len(data) if end < 0 else end + 1)


def _plogs(folder: str, since: float) -> list[str]:
    """CANN's log files under ``folder`` written since ``since`` (newest first, a bounded few)."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            try:
                mtime = os.path.getmtime(path)
            except OSError:
                continue
            if mtime >= since - 1:
                found.append((mtime, path))
    return [path for _, path in sorted(found, reverse=True)[:_MAX_PLOGS]]


LIKELY_CAUSE = "npu-launch: likely cause:"


def diagnosed(result: JobResult, plan: LaunchPlan, started: float) -> JobResult:
    """A failed attempt's block, ended with what its logs say went wrong in Ascend's terms
    (``launcher.diagnose``); unchanged when nothing known matched."""
    if not result.failed:
        return result
    diagnosis = diagnose_attempt(plan, result.cause.rank if result.cause else None, started)
    lines = diagnosis.block()
    if not lines:
        return result
    return dataclasses.replace(result, message="\n".join([result.message, *lines]).lstrip(),
                               diagnosis=tuple(diagnosis.to_json()))


def diagnosis_last(result: JobResult) -> JobResult:
    """The block with its diagnosis moved to its end, after the notes (a person reads the
    last lines first)."""
    lines = result.message.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(LIKELY_CAUSE)), None)
    if at is None:
        return result
    end = at + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    moved = lines[:at] + lines[end:] + lines[at:end]
    return dataclasses.replace(result, message="\n".join(moved))
