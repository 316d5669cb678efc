"""The literal each pattern cannot match without: what the fast pass looks for.

A pattern's key is its longest run of plain characters outside any group, class or
quantified character (``Out of Memory!* ?Request`` gives ``Request memory size``). Every line
a pattern matches holds its key, so a line holding no key needs no regular expression.
"""
from __future__ import annotations

from typing import Iterable

_ENDS_RUN = set("+.^$|")


def key_of(pattern: str) -> str:
    """The longest literal run of ``pattern`` ("" when it has none)."""
    return max(_runs(pattern), key=len, default="")


def _runs(pattern: str) -> list[str]:
    runs, current, depth, i = [], "", 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            if depth == 0 and not escaped.isalnum():
                current += escaped
            else:
                runs.append(current)
                current = ""
            i += 2
        elif c == "[":
            runs.append(current)
            current = ""
            i = _class_end(pattern, i)
        elif c == "(":
            runs.append(current)
            current, depth, i = "", depth + 1, i + 1
        elif c == ")":
            depth, i = depth - 1, i + 1
        elif c in "?*{":  # the character before is optional or repeated: not part of the key
            runs.append(current[:-1])
            current = ""
            i = pattern.index("}", i) + 1 if c == "{" else i + 1
        elif c in _ENDS_RUN:
            runs.append(current)
            current, i = "", i + 1
        else:
            current += c if depth == 0 else ""
            i += 1
    runs.append(current)
    return [run for run in runs if run.strip()]


def _class_end(pattern: str, i: int) -> int:
    i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def fewest(keys: Iterable[str]) -> list[str]:
    """``keys`` without those that hold a shorter one (its hits are found already)."""
    kept: list[str] = []
    for key in sorted(set(keys), key=len):
        if not any(shorter in key for shorter in kept):
            kept.append(key)
    return kept
