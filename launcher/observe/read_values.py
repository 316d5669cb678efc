"""Typed values read from a file a job left, which may hold anything.

A log directory may hold a value of the wrong type, NaN where a time belongs, text that would
drive a terminal. Each reader here takes one JSON value and returns it typed, or raises
``Unreadable`` saying what was expected; ``Fields`` reads an object's fields with them and
notes each one that is there but unreadable in ``Notes``, which names what was skipped.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Mapping, Optional

from launcher.limits import MAX_NODES, MAX_RANKS_PER_NODE, MAX_SHOWN, whole_number
from rank_tables.bounded import LongNumber

MAX_RANK = MAX_NODES * MAX_RANKS_PER_NODE
"""Ranks are numbered below this: no job has more."""
LATEST_TIME = 253402300799.0
"""The last second ``datetime`` can show (9999-12-31); a time is within 0 .. this."""
_LARGEST_WHOLE = 2 ** 53
_NOTES_PER_FILE = 10
_TEXT_CHARS = 200


# What could not be read ------------------------------------------------------------------------

class Notes:
    """What could not be read, per file: the first ``_NOTES_PER_FILE`` named, the rest counted."""

    def __init__(self) -> None:
        self._named: dict[str, list[str]] = {}
        self._more: dict[str, int] = {}

    def add(self, file: str, where: str, problem: str) -> None:
        """``where`` is a line number or JSON path inside ``file`` ("" for the whole file)."""
        named = self._named.setdefault(file, [])
        if len(named) < _NOTES_PER_FILE:
            named.append(f"skipped {file}{':' if where else ''}{where}: {problem}")
        else:
            self._more[file] = self._more.get(file, 0) + 1

    def lines(self) -> list[str]:
        """Every note, each file's named ones and then how many more were skipped there."""
        out = []
        for file, named in self._named.items():
            out += named
            if self._more.get(file):
                out.append(f"skipped {self._more[file]} more in {file}")
        return out

    def count(self, file: str) -> int:
        """How many problems were noted in ``file``."""
        return len(self._named.get(file, ())) + self._more.get(file, 0)

    def first(self, file: str) -> Optional[str]:
        """The first problem noted in ``file``, without its ``skipped`` prefix."""
        named = self._named.get(file)
        return named[0][len("skipped "):] if named else None


class Unreadable(ValueError):
    """A value of the wrong type or out of range; the message says what was expected."""


def shown_value(value: Any) -> str:
    """A JSON value, short, for a note."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    if type(value) is LongNumber:
        return f"a number of {value.digits} digits"
    return clean_text(json.dumps(value[:MAX_SHOWN + 1] if isinstance(value, str) else value,
                                 ensure_ascii=False), MAX_SHOWN)


def as_whole(value: Any) -> int:
    """An int (not a bool) within 2^53 either side, an integral float, or digits in a string."""
    number: Optional[int] = None
    if type(value) is int:
        number = value
    elif type(value) is float and value.is_integer():
        number = int(value)
    elif type(value) is str:
        negative = value.startswith("-")
        digits = whole_number(value[1:] if negative else value)
        number = None if digits is None else (-digits if negative else digits)
    if number is None or abs(number) > _LARGEST_WHOLE:
        raise Unreadable("not a whole number")
    return number


def as_rank(value: Any) -> int:
    """A rank: a whole number from 0 to below ``MAX_RANK``."""
    number = as_whole(value)
    if not 0 <= number < MAX_RANK:
        raise Unreadable(f"not a rank (0 to {MAX_RANK - 1})")
    return number


def as_real(value: Any) -> float:
    """A number, NaN and infinities included (a diverged loss), or one written in a string (the
    rank side writes a value JSON cannot hold, such as a float32, with ``str``)."""
    if type(value) in (int, float):
        return float(value)
    if type(value) is str and value.isascii() and len(value) <= 32:
        try:
            return float(value)
        except ValueError:
            pass
    raise Unreadable("not a number")


def as_moment(value: Any) -> float:
    """Seconds since the epoch, within what a clock can show."""
    seconds = as_real(value)
    if not 0 <= seconds <= LATEST_TIME:  # False for NaN too
        raise Unreadable(f"not a time (seconds from 0 to {LATEST_TIME:.0f})")
    return seconds


def as_text(value: Any) -> str:
    """A string, with control characters escaped (a hostile file must not drive the terminal)
    and cut to ``_TEXT_CHARS``."""
    if type(value) is not str:
        raise Unreadable("not text")
    return clean_text(value)


_MESSAGE_LINES = 30


def as_message(value: Any) -> str:
    """The job's closing block (several lines): each line cleaned, at most ``_MESSAGE_LINES``
    of them and 2000 characters in all."""
    lines = _text_of(value).splitlines()
    kept = [clean_text(line, 2000) for line in lines[:_MESSAGE_LINES]]
    if len(lines) > _MESSAGE_LINES:
        kept.append(f"...({len(lines) - _MESSAGE_LINES} more lines)")
    text = "\n".join(kept)
    return text if len(text) <= 2000 else f"{text[:2000]}...({len(text)} chars)"


def _text_of(value: Any) -> str:
    if type(value) is not str:
        raise Unreadable("not text")
    return value


def clean_text(value: str, limit: int = _TEXT_CHARS) -> str:
    """``value`` with control characters escaped and cut to ``limit`` characters, saying so."""
    if len(value) <= limit and value.isprintable():
        return value
    cut = value[:limit]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut if len(value) <= limit else f"{cut}...({len(value)} chars)"


Reader = Callable[[Any], Any]


@dataclasses.dataclass
class Fields:
    """Reads typed fields of one JSON object, noting each one that is there but unreadable."""

    doc: Mapping[str, Any]
    file: str
    where: str
    notes: Notes
    read: int = 0

    def value(self, key: str, reader: Reader, default: Any = None) -> Any:
        """Field ``key`` read by ``reader``; ``default`` when it is absent, null or unreadable."""
        value = self.doc.get(key)
        if value is None:
            return default
        try:
            typed = reader(value)
        except Unreadable as e:
            self.notes.add(self.file, f"{self.where}{key}", f"{e}, got {shown_value(value)}")
            return default
        self.read += 1
        return typed

    def objects(self, key: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The objects of list ``key`` with their JSON paths; other items are noted."""
        value = self.doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.notes.add(self.file, f"{self.where}{key}", f"not a list, got {shown_value(value)}")
            return []
        self.read += 1
        found: list[tuple[str, Mapping[str, Any]]] = []
        for index, item in enumerate(value):
            where = f"{self.where}{key}[{index}]"
            if isinstance(item, dict):
                found.append((where, item))
            else:
                self.notes.add(self.file, where, f"not an object, got {shown_value(item)}")
        return found

    def object(self, key: str) -> Optional[Mapping[str, Any]]:
        """The object at ``key``; None when absent, or (noted) not an object."""
        value = self.doc.get(key)
        if value is None or isinstance(value, dict):
            return value
        self.notes.add(self.file, f"{self.where}{key}", f"not an object, got {shown_value(value)}")
        return None

    def nested(self, doc: Mapping[str, Any], where: str) -> "Fields":
        """The fields of ``doc``, an object found at JSON path ``where`` in the same file."""
        return Fields(doc, self.file, where + ".", self.notes)
