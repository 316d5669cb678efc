"""Reading a file, and JSON text, within bounds: the bounds the rank-table library needs, and
the bounded reader the whole host side uses (``launcher.limits`` re-exports them).

A rank table (or a job's ``summary.json``) may be ``/dev/zero``, a directory, a 5 MB line, bytes
that are not UTF-8, or JSON nested 100,000 deep; each of these must become one line that names
the file and the place, not a hang, a traceback or an allocation without end. ``read_text``
reads at most ``max_bytes + 1`` bytes, so ``/dev/zero`` costs one bounded read. ``parse_json``
refuses, naming the place, what Python's ``json`` handles badly: nesting deeper than
``MAX_JSON_DEPTH`` (``json`` raises ``RecursionError`` at about 1000 levels, and no real document
nests past 6), numbers of thousands of digits (``int`` refuses past 4300 and is quadratic before)
and, where they are not wanted, ``NaN`` and ``Infinity``, which ``json`` accepts although JSON
has neither; and a key given twice in one object, of which ``json`` keeps the last. Errors
are ``UnreadableFile``, whose message is one line starting with the file's name and, where
there is one, ``line:column`` or the JSON path.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import select
import stat
from pathlib import Path
from typing import Any, Optional, Union

from parallel.contract import MAX_SHOWN
from rank_tables.structure import JsonPath, format_path

MAX_DEVICE_ID = 15
"""Physical card ids: ``/dev/davinci0`` .. ``/dev/davinci15``."""
MAX_FILE_BYTES = 1 << 20
"""A hostfile, job config or env file: a page of text."""
MAX_RANK_TABLE_BYTES = 16 << 20
"""An HCCL rank table: about 150 bytes per device, so room for tens of thousands of cards."""
MAX_JSON_DEPTH = 32
"""Nesting of a rank table or summary; the real formats need 6."""
_WHOLE = re.compile(r"[0-9]{1,12}")

MAX_NUMBER_CHARS = 32
"""Characters of one JSON number: ``json.dumps`` writes any float in 24."""

_TOKEN = re.compile(r'(?P<open>[\[{])|(?P<close>[\]}])|(?P<quote>")')
# The rest of a string after its opening quote, unrolled so that it runs in linear time.
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


class UnreadableFile(ValueError):
    """A file or JSON text that cannot be read within the bounds; ``message`` is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def display_name(path: Union[str, Path]) -> str:
    """``path`` as messages start with it; a name of thousands of characters is cut."""
    text = str(path)
    return text if len(text) <= 4 * MAX_SHOWN else f"{text[:MAX_SHOWN]}...({len(text)} chars)"


def read_text(path: Union[str, Path], max_bytes: int, what: str, name: Optional[str] = None) -> str:
    """The UTF-8 text of ``path``, at most ``max_bytes`` bytes of it; ``what`` says what the file
    is ("rank table"), ``name`` starts messages [default: the path]."""
    name = name or display_name(path)
    data = _read_bytes(path, max_bytes, what, name)
    try:
        return utf8_text(data)
    except NotUtf8 as exc:
        raise UnreadableFile(f"{name}:{exc.line}:{exc.column}: {exc}; a {what} must be UTF-8") from None


class NotUtf8(ValueError):
    """Bytes that are not UTF-8: where the first bad byte is (1-based line and column)."""

    def __init__(self, data: bytes, index: int) -> None:
        self.line, self.column = place_in(data, index)
        self.byte = data[index]
        super().__init__(f"not UTF-8 text (byte 0x{self.byte:02x})")


def utf8_text(data: bytes) -> str:
    """``data`` decoded, or ``NotUtf8`` naming the place: every reader of input decodes here."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(data, exc.start) from None


def _read_bytes(path: Union[str, Path], max_bytes: int, what: str, name: str) -> bytes:
    try:
        data = read_at_most(str(path), max_bytes + 1)
    except OSError as exc:
        raise UnreadableFile(f"{name}: cannot read the {what}: {exc.strerror or exc}") from None
    except ValueError as exc:  # an embedded NUL in the name
        raise UnreadableFile(f"{name}: cannot read the {what}: {exc}") from None
    if len(data) > max_bytes:
        size = os.stat(path).st_size  # 0 for /dev/zero and pipes
        found = f"{size / (1 << 20):.1f} MiB" if size > max_bytes else "more than that"
        raise UnreadableFile(f"{name}: a {what} may be at most {_size(max_bytes)}; this one is "
                             f"{found}")
    return data


def _size(max_bytes: int) -> str:
    return f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 else f"{max_bytes} bytes"


def parse_json(text: str, name: str, allow_constants: bool = False) -> Any:
    """The JSON document in ``text``; ``name`` starts every message. ``allow_constants`` lets
    ``NaN`` and ``Infinity`` through (``json.dump`` writes them for a diverged loss)."""
    try:
        doc = _CHECKED_DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise UnreadableFile(f"{name}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise UnreadableFile(_too_deep(text, name)) from None
    problem = find_problem(doc, allow_constants)
    if problem is None:
        return doc
    path, message = problem
    if message is _TOO_DEEP:
        raise UnreadableFile(_too_deep(text, name))
    raise UnreadableFile(f"{name}: {format_path(path)}: {message}")


class LongNumber(int):
    """Stands in for a JSON number of more than ``MAX_NUMBER_CHARS`` digits, which ``int`` would
    refuse past 4300 digits (and spend quadratic time on before)."""

    digits: int = 0


def bounded_int(literal: str) -> int:
    """``parse_int`` for ``json``: the int, or a ``LongNumber`` past ``MAX_NUMBER_CHARS``."""
    if len(literal) <= MAX_NUMBER_CHARS:
        return int(literal)
    number = LongNumber(0)
    number.digits = len(literal)
    return number


JSON_DECODER = json.JSONDecoder(parse_int=bounded_int)
"""``json.loads`` with ``bounded_int``; one instance, since building a decoder costs a parse."""


class KeyGivenTwice(dict[str, Any]):
    """Stands in for a JSON object with a key given twice (``json`` keeps the last one without
    a word), so that ``find_problem`` can name its path; ``twice`` is the key."""

    twice: str = ""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json``: the object, or a ``KeyGivenTwice``."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    marked = KeyGivenTwice(obj)
    for key, _ in pairs:
        if key in seen:
            marked.twice = key
            break
        seen.add(key)
    return marked


_CHECKED_DECODER = json.JSONDecoder(parse_int=bounded_int, object_pairs_hook=unique_keys)
"""``parse_json``'s decoder: ``JSON_DECODER`` that also marks keys given twice."""

_TOO_DEEP = f"nested deeper than the {MAX_JSON_DEPTH} levels accepted"
_GIVEN_TWICE = "given twice in one object (the last would win without a word)"


def find_problem(doc: Any, allow_constants: bool = False) -> Optional[tuple[JsonPath, str]]:
    """The first place in a parsed document, in document order, that nests deeper than
    ``MAX_JSON_DEPTH``, gives a key twice (a ``KeyGivenTwice``), holds a ``LongNumber`` or,
    unless allowed, a number that is not finite."""
    # A walk without paths first: it costs a tenth of one that builds them, and is all a good
    # document ever needs.
    if not _has_problem(doc, allow_constants):
        return None
    stack: list[tuple[Any, JsonPath]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, (dict, list)):
            if len(path) >= MAX_JSON_DEPTH:
                return path, _TOO_DEEP
            if type(value) is KeyGivenTwice:
                return path + (value.twice,), _GIVEN_TWICE
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(reversed([(v, path + (k,)) for k, v in items]))
        elif _bad_number(value, allow_constants):
            return path, _number_problem(value)
    return None


def _has_problem(doc: Any, allow_constants: bool) -> bool:
    if type(doc) is KeyGivenTwice:
        return True
    stack = [(doc, 1)] if isinstance(doc, (dict, list)) else []
    while stack:
        value, depth = stack.pop()
        for item in value.values() if type(value) is dict else value:
            kind = type(item)
            if kind is str:
                continue
            if kind is KeyGivenTwice:
                return True
            if kind is dict or kind is list:
                if depth >= MAX_JSON_DEPTH:
                    return True
                stack.append((item, depth + 1))
            elif _bad_number(item, allow_constants):
                return True
    return _bad_number(doc, allow_constants)


def _bad_number(value: Any, allow_constants: bool) -> bool:
    kind = type(value)
    return kind is LongNumber or (kind is float and not allow_constants and not math.isfinite(value))


def _number_problem(value: Any) -> str:
    if type(value) is LongNumber:
        return f"a number of {value.digits} digits; at most {MAX_NUMBER_CHARS} are accepted"
    return "not a finite number (NaN, Infinity or past 1.8e308), which JSON has no place for"


def _too_deep(text: str, name: str) -> str:
    position = deep_position(text)
    where = "" if position is None else ":{}:{}".format(*place_in(text, position))
    return f"{name}{where}: {_TOO_DEEP}"


def deep_position(text: str) -> Optional[int]:
    """Where ``text`` first opens a bracket deeper than ``MAX_JSON_DEPTH``, counting only
    brackets outside strings; None if nowhere.

    One regex search per string or bracket, so it is linear, but a Python loop: it runs only
    once a document is known to be too deep, to say where.
    """
    depth, position = 0, 0
    search, string_rest = _TOKEN.search, _STRING_REST.match
    while True:
        token = search(text, position)
        if token is None:
            return None
        position = token.end()
        if token.lastgroup == "quote":
            rest = string_rest(text, position)
            if rest is None:
                return None
            position = rest.end()
        elif token.lastgroup == "open":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return token.start()
        else:
            depth -= 1


def place_in(text: Union[str, bytes], index: int) -> tuple[int, int]:
    """1-based ``(line, column)`` of ``text[index]``."""
    if isinstance(text, str):
        newlines, last = text.count("\n", 0, index), text.rfind("\n", 0, index)
    else:
        newlines, last = text.count(b"\n", 0, index), text.rfind(b"\n", 0, index)
    return newlines + 1, index - last


def whole_number(text: str) -> Optional[int]:
    """``text`` as a non-negative integer written in ASCII digits, else None.

    ``str.isdigit`` accepts ``'²'`` and ``int`` accepts ``'١٢'`` and 4,300 digits; neither is
    a number a user means here.
    """
    return int(text) if _WHOLE.fullmatch(text) else None


PIPE_WAIT = 30.0
"""Seconds a pipe (``--rank-table <(...)``) may stay silent before its read is given up."""


def read_at_most(path: str, size: int) -> bytes:
    """Up to ``size`` bytes of ``path``, never waiting without end: a FIFO nobody writes to
    reads as empty, and one whose writer goes silent for ``PIPE_WAIT`` seconds is an error; so
    is a terminal or a device nobody types into (``/dev/pts/N``, ``/proc/kmsg``): the file is
    read without blocking, whatever it is (a disk file's reads never block anyway)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        return _read_fd(fd, size)
    finally:
        os.close(fd)


def _read_fd(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        try:
            chunk = os.read(fd, min(left, 1 << 16))
        except BlockingIOError:  # a pipe with a writer and nothing written yet
            if not select.select([fd], [], [], PIPE_WAIT)[0]:
                raise OSError(errno.ETIMEDOUT, f"nothing to read for {PIPE_WAIT:g} s (a pipe or a "
                              "terminal nobody writes to)") from None
            continue
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
