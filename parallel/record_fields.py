"""A record's fields read by type, as ``parallel.contract`` re-exports them: for the seam's
``Event`` and for the launcher's readers of JSON that another process wrote (a host's probe
answer, a ledger file, a plan sent to an agent). Only the standard library.

``TypedFields`` reads ``record`` strictly: each accessor returns the field when it holds the type
asked for and None otherwise (absent, null, another type; a bool is never a number), so a
hostile record is skipped field by field, never a traceback. ``JsonObject`` is any JSON object
read that way. The lenient readers (``whole_of``...) are how ``Event`` types its own fields: a
rank may write a step as ``"12"`` or ``12.0``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional


class TypedFields:
    """Typed reads of the fields of ``record`` (``Event`` and ``JsonObject`` each hold one)."""

    record: Mapping[str, Any]

    def given(self, key: str) -> bool:
        """The field is there and not null, of whatever type (a reader may refuse the record
        for a field given in another type, and take one not given as its default)."""
        return self.record.get(key) is not None

    def flag(self, key: str) -> Optional[bool]:
        """``true`` or ``false``; None for anything else."""
        return flag_of(self.record.get(key))

    def whole(self, key: str) -> Optional[int]:
        """An int, not a bool."""
        value = self.record.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def number(self, key: str) -> Optional[float]:
        """An int or a float, not a bool, as a float (None for an int too large for one)."""
        value = self.record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        try:
            return float(value)
        except OverflowError:
            return None

    def text(self, key: str) -> Optional[str]:
        """A string."""
        return text_of(self.record.get(key))

    def items(self, key: str) -> Optional[list[Any]]:
        """A list, its items as they came."""
        value = self.record.get(key)
        return value if isinstance(value, list) else None

    def object(self, key: str) -> "Optional[JsonObject]":
        """An object, to be read by type in turn."""
        return JsonObject.of(self.record.get(key))


@dataclasses.dataclass(frozen=True)
class JsonObject(TypedFields):
    """One JSON object that another process wrote, read by type (``TypedFields``)."""

    record: Mapping[str, Any]

    @classmethod
    def of(cls, value: Any) -> "Optional[JsonObject]":
        """``value`` when it is an object (or one already read as such); None for any other
        JSON value."""
        if isinstance(value, JsonObject):
            return value
        return cls(value) if isinstance(value, dict) else None


def whole_of(value: object) -> Optional[int]:
    """A whole number from an int, a float (cut) or digits in a string; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):
        return None


def real_of(value: object) -> Optional[float]:
    """A number from an int, a float or a string that reads as one; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def text_of(value: object) -> Optional[str]:
    """A string; None for anything else."""
    return value if isinstance(value, str) else None


def flag_of(value: object) -> Optional[bool]:
    """``True`` or ``False``; None for anything else."""
    return value if isinstance(value, bool) else None
