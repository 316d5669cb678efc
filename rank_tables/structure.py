"""Structure checks compiled from the JSON Schemas in ``rank_tables/schemas/``.

Why not ``jsonschema`` at run time: it needs 0.6-0.9 s to check one 1024-server x 16-device
table on this machine, longer than everything else ``validate`` does together. This module
compiles the small subset of JSON Schema that our schema files use into plain Python checks
(about 20x faster) and refuses any other keyword at compile time, so a schema edit can never be
half-honoured. ``tests/test_rank_tables_validate.py`` checks that it finds the same faults, at
the same places, as ``jsonschema`` (the reference implementation) on every example and many
broken variants.

One deliberate difference: a pattern's final ``$`` means end of text (as in JSON Schema's
ECMA-262 regexes), where Python's ``re`` used by ``jsonschema`` also accepts a trailing newline.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Mapping, Union

PathPart = Union[str, int]
JsonPath = tuple[PathPart, ...]


@dataclasses.dataclass(frozen=True)
class Fault:
    """One structural fault: where (``path``), which schema keyword failed, and why."""

    path: JsonPath
    keyword: str
    message: str


Check = Callable[[Any, JsonPath, list], None]
"""``check(value, path, faults)`` appends a ``Fault`` to ``faults`` for each problem found."""

_ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "$defs"})
_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,)}
_TYPE_NAMES = {"object": "an object", "array": "a list", "string": "a string"}


class SchemaCompileError(ValueError):
    """The schema uses something this compiler does not implement."""


def compile_schema(schema: Mapping[str, Any]) -> Check:
    """Turn a JSON Schema (our subset) into a ``Check``."""
    return _Compiler(schema).compile(schema)


class _Compiler:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.title = str(root.get("title", "this format"))
        self.refs: dict[str, Check] = {}

    def compile(self, schema: Union[Mapping[str, Any], bool]) -> Check:
        if schema is True:
            return _nothing
        if schema is False:
            return _forbidden(self.title)
        unknown = set(schema) - _ANNOTATIONS - set(_KEYWORDS)
        if unknown:
            raise SchemaCompileError(f"unsupported JSON Schema keywords: {sorted(unknown)}")
        checks = [_KEYWORDS[key](self, schema[key], schema) for key in _KEYWORDS if key in schema]
        return _all_of(checks)

    def ref(self, target: str) -> Check:
        if not target.startswith("#/$defs/"):
            raise SchemaCompileError(f"only local '#/$defs/...' references are supported, not {target!r}")
        name = target[len("#/$defs/"):]
        if name not in self.refs:
            self.refs[name] = self._late(name)  # stands in while a recursive definition compiles
            self.refs[name] = self.compile(self.root["$defs"][name])
        return self.refs[name]

    def _late(self, name: str) -> Check:
        return lambda value, path, faults: self.refs[name](value, path, faults)


def _nothing(value: Any, path: JsonPath, faults: list) -> None:
    return None


def _forbidden(title: str) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        faults.append(Fault(path, "false", f"not part of the {title} format"))
    return check


def _all_of(checks: list[Check]) -> Check:
    if len(checks) == 1:
        return checks[0]

    def check(value: Any, path: JsonPath, faults: list) -> None:
        for one in checks:
            one(value, path, faults)
    return check


def _type(compiler: _Compiler, name: str, schema: Mapping[str, Any]) -> Check:
    if name not in _TYPES:
        raise SchemaCompileError(f"unsupported type {name!r}")
    accepted = _TYPES[name]

    def check(value: Any, path: JsonPath, faults: list) -> None:
        if not isinstance(value, accepted):
            faults.append(Fault(path, "type", f"must be {_TYPE_NAMES[name]}{_hint(name, value)}, got {describe(value)}"))
    return check


def _hint(name: str, value: Any) -> str:
    if name == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f" ({json.dumps(str(value))})"
    return ""


def _required(compiler: _Compiler, names: list[str], schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, dict):
            for name in names:
                if name not in value:
                    faults.append(Fault(path + (name,), "required", "required field is missing"))
    return check


def _properties(compiler: _Compiler, props: Mapping[str, Any], schema: Mapping[str, Any]) -> Check:
    compiled = {name: compiler.compile(sub) for name, sub in props.items()}

    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                sub = compiled.get(name)
                if sub is not None:
                    sub(item, path + (name,), faults)
    return check


def _items(compiler: _Compiler, item_schema: Any, schema: Mapping[str, Any]) -> Check:
    sub = compiler.compile(item_schema)

    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, list):
            for index, item in enumerate(value):
                sub(item, path + (index,), faults)
    return check


def _const(compiler: _Compiler, expected: Any, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        if type(value) is not type(expected) or value != expected:
            faults.append(Fault(path, "const", f"must be {json.dumps(expected)}, got {describe(value)}"))
    return check


def _pattern(compiler: _Compiler, pattern: str, schema: Mapping[str, Any]) -> Check:
    regex = re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern)
    wanted = schema.get("description") or f"text matching {pattern}"

    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, str) and regex.search(value) is None:
            faults.append(Fault(path, "pattern", f"must be {wanted}, got {describe(value)}"))
    return check


def _min_length(compiler: _Compiler, limit: int, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, str) and len(value) < limit:
            faults.append(Fault(path, "minLength", "must not be empty" if limit == 1 else f"must be at least {limit} characters"))
    return check


def _max_length(compiler: _Compiler, limit: int, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, str) and len(value) > limit:
            faults.append(Fault(path, "maxLength", f"must be at most {limit} characters, got {len(value)}"))
    return check


def _min_items(compiler: _Compiler, limit: int, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, list) and len(value) < limit:
            faults.append(Fault(path, "minItems", "must not be empty" if limit == 1 else f"must list at least {limit} items"))
    return check


def _max_items(compiler: _Compiler, limit: int, schema: Mapping[str, Any]) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        if isinstance(value, list) and len(value) > limit:
            faults.append(Fault(path, "maxItems", f"lists {len(value)} items, at most {limit} are allowed"))
    return check


def _dollar_ref(compiler: _Compiler, target: str, schema: Mapping[str, Any]) -> Check:
    return compiler.ref(target)


_KEYWORDS: dict[str, Callable[[_Compiler, Any, Mapping[str, Any]], Check]] = {
    "type": _type,
    "const": _const,
    "required": _required,
    "properties": _properties,
    "items": _items,
    "pattern": _pattern,
    "minLength": _min_length,
    "maxLength": _max_length,
    "minItems": _min_items,
    "maxItems": _max_items,
    "$ref": _dollar_ref,
}


def describe(value: Any) -> str:
    """A short, JSON-flavoured description of ``value`` for messages."""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"the number {json.dumps(value)}"
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value[:80] + ("..." if len(value) > 80 else ""))
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def format_path(path: JsonPath) -> str:
    """``("server_list", 1, "device", 3, "rank_id")`` -> ``server_list[1].device[3].rank_id``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "$"
