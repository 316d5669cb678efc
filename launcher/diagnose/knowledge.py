"""The knowledge base: ``faults.yaml`` read once, checked against its schema, compiled.

Every entry's patterns are compiled together into one alternation of named groups, so a file
is searched once whatever the number of entries (``Knowledge.any``); a line that matched is then
told apart by each entry's own expression, in the file's order (the first entry wins).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from importlib import resources
from typing import Any, Optional, Sequence

import yaml

from launcher.diagnose.keys import fewest, key_of
from parallel.contract import BadInput

FAULTS_FILE = "faults.yaml"

SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["id", "title", "patterns", "cause", "check", "fix", "link", "consequence"],
        "properties": {
            "id": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$"},
            "code": {"type": "string", "pattern": "^[A-Z0-9]+$"},
            "title": {"type": "string", "minLength": 5},
            "patterns": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 3}},
            "cause": {"type": "string", "minLength": 10},
            "check": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "fix": {"type": "string", "minLength": 10},
            "link": {"type": "string", "pattern": "^https://"},
            "consequence": {"type": "boolean"},
            "noise": {"type": "boolean"},
        },
    },
}


@dataclasses.dataclass(frozen=True)
class Fault:
    """One known fault: how to recognise it in a log line and what to do about it."""

    id: str
    title: str
    patterns: tuple[str, ...]
    cause: str
    check: tuple[str, ...]
    fix: str
    link: str
    consequence: bool
    code: Optional[str] = None
    noise: bool = False
    """Healthy runs print it too (a worker retrying to reach the scheduler): never named alone."""
    regex: re.Pattern[bytes] = dataclasses.field(compare=False, repr=False,
                                                 default=re.compile(b"(?!)"))

    @property
    def label(self) -> str:
        """What a block calls it: its CANN code where it has one, else its id."""
        return self.code or self.id


@dataclasses.dataclass(frozen=True)
class Knowledge:
    """Every fault, in priority order, and the one expression that finds any of them."""

    faults: tuple[Fault, ...]
    any: re.Pattern[bytes]
    keys: tuple[str, ...] = ()
    """The literals every hit holds one of (``launcher.diagnose.keys``), for the fast pass."""

    @functools.cached_property
    def byte_keys(self) -> tuple[bytes, ...]:
        return tuple(key.encode() for key in self.keys)

    def by_id(self, fault_id: str) -> Fault:
        return next(f for f in self.faults if f.id == fault_id)

    def classify(self, line: bytes) -> Optional[Fault]:
        """The first fault (in the file's order) whose patterns match ``line``."""
        return next((f for f in self.faults if f.regex.search(line)), None)


def parse(text: str, source: str = FAULTS_FILE) -> Knowledge:
    """The knowledge base in ``text``; a ``BadInput`` naming what is wrong."""
    # Here, not at the top: jsonschema takes 50 ms to import, a sixth of every npu-launch
    # command's start, and only a log being diagnosed needs the file checked.
    import jsonschema
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        jsonschema.validate(data, SCHEMA)
    except (yaml.YAMLError, jsonschema.ValidationError) as e:
        raise BadInput(f"{source}: {getattr(e, 'message', e)}") from None
    faults = [_parse_fault(entry, source) for entry in data]
    ids = [f.id for f in faults]
    if len(set(ids)) != len(ids):
        raise BadInput(f"{source}: duplicate ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    keys = []
    for fault in faults:
        for pattern in fault.patterns:
            key = key_of(pattern)
            if len(key.strip()) < 2:
                raise BadInput(f"{source}: {fault.id}: pattern {pattern!r} has no literal of two "
                               "characters or more to look for")
            keys.append(key)
    return Knowledge(tuple(faults), _together(faults), tuple(fewest(keys)))


def _parse_fault(entry: dict[str, Any], source: str) -> Fault:
    patterns = tuple(entry["patterns"])
    try:
        regex = re.compile("|".join(_scoped(p) for p in patterns).encode())
    except re.error as e:
        raise BadInput(f"{source}: {entry['id']}: bad pattern: {e}") from None
    return Fault(entry["id"], entry["title"], patterns, entry["cause"], tuple(entry["check"]),
                 entry["fix"], entry["link"], entry["consequence"], entry.get("code"),
                 entry.get("noise", False), regex)


def _together(faults: Sequence[Fault]) -> re.Pattern[bytes]:
    """One alternation, a named group per fault. Inline flags such as ``(?i)`` are scoped to
    their own group (``(?i:...)``), as Python only allows global flags at the start."""
    parts = []
    for fault in faults:
        alternatives = "|".join(_scoped(p) for p in fault.patterns)
        parts.append(f"(?P<{fault.id.replace('-', '_')}>{alternatives})")
    return re.compile("|".join(parts).encode())


def _scoped(pattern: str) -> str:
    if pattern.startswith("(?i)"):
        return f"(?i:{pattern[4:]})"
    return f"(?:{pattern})"


@functools.lru_cache(maxsize=1)
def load() -> Knowledge:
    """The knowledge base shipped in the package (read and compiled once per process)."""
    text = resources.files(__package__).joinpath(FAULTS_FILE).read_text(encoding="utf-8")
    return parse(text)
