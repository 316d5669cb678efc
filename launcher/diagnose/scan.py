"""One pass over a log file: the known faults on its lines, in bounded memory.

The file is read in blocks of ``BLOCK`` bytes; the knowledge base's one expression searches
each block's whole lines at once, and only the lines it hits are told apart per fault. A line
longer than ``MAX_LINE`` is searched in pieces of that size (a hit across two pieces is lost:
the cost of a bounded read), so a 100 MB line costs no more memory than a short one.
"""
from __future__ import annotations

import dataclasses
import os
from typing import BinaryIO, Optional

from launcher.diagnose.knowledge import Fault, Knowledge

BLOCK = 4 << 20
MAX_LINE = 1 << 20
SNIFF = 8192
SHOWN_CHARS = 300
CONTEXT = 4096


class Unreadable(Exception):
    """A file the diagnosis skips, with the one line that says why."""


@dataclasses.dataclass(frozen=True)
class Hit:
    """The first line of a file where one fault showed, and how often it showed there."""

    fault: Fault
    path: str
    line: int
    text: str
    count: int = 1

    @property
    def evidence(self) -> str:
        return f"{os.path.basename(self.path)}:{self.line}"


def scan_file(path: str, knowledge: Knowledge, start: int = 0) -> list[Hit]:
    """The faults in ``path`` from byte ``start`` on, one ``Hit`` per fault (its first line),
    in the order they first appear. Raises ``Unreadable`` for a file that is not text."""
    try:
        with open(path, "rb") as f:
            _sniff(f, path)
            f.seek(start)
            return _scan(f, path, knowledge, _line_number_at(f, start) if start else 1)
    except OSError as e:
        raise Unreadable(f"{path}: {e.strerror or e}") from None


def sniff(path: str) -> None:
    """Raise ``Unreadable`` for a file that cannot be opened or is not UTF-8 text."""
    try:
        with open(path, "rb") as f:
            _sniff(f, path)
    except OSError as e:
        raise Unreadable(f"{path}: {e.strerror or e}") from None


def _sniff(f: BinaryIO, path: str) -> None:
    head = f.read(SNIFF)
    if b"\0" in head:
        raise Unreadable(f"{path}: binary file, skipped")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # a character cut by the sniff's end is not an error
            raise Unreadable(f"{path}: not UTF-8 text (byte {e.start}), skipped") from None
    f.seek(0)


def _line_number_at(f: BinaryIO, offset: int) -> int:
    """The line number at ``offset``, counted without holding more than a block."""
    f.seek(0)
    count, left = 1, offset
    while left > 0:
        block = f.read(min(BLOCK, left))
        if not block:
            break
        count += block.count(b"\n")
        left -= len(block)
    return count


def _scan(f: BinaryIO, path: str, knowledge: Knowledge, line_no: int) -> list[Hit]:
    hits: dict[str, Hit] = {}
    carry = b""
    while True:
        block = f.read(BLOCK)
        data = carry + block
        if not block:
            _search(data, line_no, path, knowledge, hits)
            return list(hits.values())
        cut = data.rfind(b"\n")
        if cut < 0 and len(data) < MAX_LINE:
            carry = data
            continue
        if cut < 0:  # one very long line: search it in pieces, count it once
            _search(data, line_no, path, knowledge, hits)
            carry = b""
            continue
        _search(data[:cut], line_no, path, knowledge, hits)
        line_no += data.count(b"\n", 0, cut + 1)
        carry = data[cut + 1:]


def _search(data: bytes, first_line: int, path: str, knowledge: Knowledge,
            hits: dict[str, Hit]) -> None:
    """Every hit of the knowledge base in ``data`` (whole lines, the first numbered
    ``first_line``), added to ``hits``: each key found with ``bytes.find`` (C speed; ``re``'s
    alternation tries every branch at every byte), each line holding one told apart once."""
    begins = set()
    for key in knowledge.byte_keys:
        at = data.find(key)
        while at >= 0:
            begin = data.rfind(b"\n", 0, at) + 1
            begins.add((begin, at))
            end = data.find(b"\n", at)
            at = -1 if end < 0 else data.find(key, end + 1)
    line_no, counted, last = first_line, 0, -1
    for begin, at in sorted(begins):
        if begin == last:
            continue
        last = begin
        line_no += data.count(b"\n", counted, begin)
        counted = begin
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end
        # Around the hit only: a line of 100 MB is not copied whole.
        line = data[max(begin, at - CONTEXT):min(end, at + CONTEXT)]
        fault = knowledge.classify(line)
        if fault is not None:
            add_hit(hits, fault, path, line_no, line)


def add_hit(hits: dict[str, Hit], fault: Fault, path: str, line_no: int, line: bytes) -> None:
    seen: Optional[Hit] = hits.get(fault.id)
    if seen is None:
        text = line.decode("utf-8", "replace").strip()
        hits[fault.id] = Hit(fault, path, line_no, text[:SHOWN_CHARS])
    elif seen.line != line_no:
        hits[fault.id] = dataclasses.replace(seen, count=seen.count + 1)
