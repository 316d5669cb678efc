"""The launcher's small file helpers (``launcher.files``), in this process, on real files."""
from __future__ import annotations

import os
from pathlib import Path

from launcher.files import read_json, read_text, remove, write_if_changed, write_text


def test_a_missing_or_unreadable_file_is_no_error(weird_tmp: Path) -> None:
    missing = str(weird_tmp / "no such" / "file")
    assert read_text(missing) == "" and read_json(missing) is None
    remove(missing)
    (weird_tmp / "bad.json").write_text('{"attempts": [')
    assert read_json(str(weird_tmp / "bad.json")) is None
    blocked = weird_tmp / "a file"
    blocked.write_text("x")
    assert write_text(str(blocked / "below"), "text") is False, "a file is not a folder"


def test_written_once_and_only_when_changed(weird_tmp: Path) -> None:
    path = weird_tmp / "stacks" / "rank 0.txt"
    assert write_if_changed(str(path), "frames\n") and path.read_text() == "frames\n"
    os.utime(path, (1, 1))
    assert write_if_changed(str(path), "frames\n") and path.stat().st_mtime == 1, "unchanged"
    assert write_if_changed(str(path), "frames") and path.read_text() == "frames"
    assert read_text(str(path), limit=3) == "fra"
    remove(str(path))
    assert not path.exists()
