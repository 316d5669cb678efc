"""Control lines: how a node agent tells node 0 about events and its result.

They travel in the agent's stdout among its ranks' ``[host:rank]`` lines, marked by a record
separator byte no program prints by accident, one JSON object per line, so ssh, srun and mpirun
can carry them unchanged.
"""
from __future__ import annotations

import json
from typing import Any, Optional

MARK = b"\x1eNPL "
EVENT = "event"
RESULT = "result"
FINISH = b"finish\n"
"""Node 0 -> agents, on stdin: every node's ranks are done."""


def encode(kind: str, payload: dict[str, Any]) -> bytes:
    """One control line (without the newline)."""
    return MARK + json.dumps({"type": kind, **payload}, default=str).encode()


def decode(line: bytes) -> Optional[dict[str, Any]]:
    """The control record in ``line``, or None when it is an ordinary output line."""
    start = line.find(MARK)
    if start < 0:
        return None
    try:
        record = json.loads(line[start + len(MARK):])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
