"""Small file helpers the launcher's modules share, each written once: a text or JSON file read
or written where a missing or unwritable file is no error (stack files, error reports, the hang
limits, an earlier summary), written only when it changed, and removed when it is there. Files
that must never be seen half written go through the one atomic writer,
``parallel.checkpoints.manifest.atomic_write_bytes`` (``atomic_save``)."""
from __future__ import annotations

import json
import os
from typing import Any, Optional


def read_text(path: str, limit: Optional[int] = None) -> str:
    """``path``'s text (its first ``limit`` characters), undecodable bytes replaced; "" when it
    cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return f.read() if limit is None else f.read(limit)
    except OSError:
        return ""


def read_json(path: str) -> Any:
    """The JSON document in ``path``; None when it cannot be read or is not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_text(path: str, text: str) -> bool:
    """Write ``text`` to ``path``, its folder made if needed; False when that failed."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        return False
    return True


def write_if_changed(path: str, text: str) -> bool:
    """``write_text``, unless ``path`` already holds ``text`` (True then)."""
    if read_text(path, len(text) + 1) == text:
        return True
    return write_text(path, text)


def remove(path: str) -> None:
    """Remove ``path`` if it is there (gone or never made is what was wanted)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
