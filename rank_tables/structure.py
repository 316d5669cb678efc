"""Structure checks compiled from the JSON Schemas in ``rank_tables/schemas/``.

Why not ``jsonschema`` at run time: it needs 0.6-0.9 s to check one 1024-server x 16-device
table on this machine, longer than everything else ``validate`` does together. This module
compiles the small subset of JSON Schema that our schema files use into plain Python checks
(about 20x faster) and refuses any other keyword at compile time, so a schema edit can never be
half-honoured. ``tests/rank_tables/test_rank_tables_validate.py`` checks that it finds the same faults, at
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

from parallel.contract import MAX_SHOWN

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
_BY_TYPE = {
    "string": frozenset({"pattern", "minLength", "maxLength"}),
    "object": frozenset({"required", "properties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
}
_KEYWORDS = frozenset({"type", "const", "$ref"}).union(*_BY_TYPE.values())
_TYPE_NAMES = {"object": "an object", "array": "a list", "string": "a string"}
_HINT_BITS = 64


class SchemaCompileError(ValueError):
    """The schema uses something this compiler does not implement."""


def compile_schema(schema: Mapping[str, Any]) -> Check:
    """Turn a JSON Schema (our subset) into a ``Check``."""
    return _Compiler(schema).compile(schema)


class _Compiler:
    """Compiles each schema into one closure per part (``$ref``, ``const``, the typed keywords);
    a typed schema checks its type once and then all of its keywords, which keeps a rank's
    check to a handful of calls."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.title = str(root.get("title", "this format"))
        self.refs: dict[str, Check] = {}

    def compile(self, schema: Union[Mapping[str, Any], bool]) -> Check:
        if schema is True:
            return _nothing
        if schema is False:
            return _forbidden(self.title)
        _check_supported(schema)
        checks = []
        if "$ref" in schema:
            checks.append(self.ref(schema["$ref"]))
        if "const" in schema:
            checks.append(_const(schema["const"]))
        if "type" in schema:
            checks.append(_TYPED[schema["type"]](self, schema))
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


def _check_supported(schema: Mapping[str, Any]) -> None:
    unknown = set(schema) - _ANNOTATIONS - _KEYWORDS
    if unknown:
        raise SchemaCompileError(f"unsupported JSON Schema keywords: {sorted(unknown)}")
    kind = schema.get("type")
    if kind is not None and kind not in _BY_TYPE:
        raise SchemaCompileError(f"unsupported type {kind!r}")
    for name, keywords in _BY_TYPE.items():
        if keywords & schema.keys() and kind != name:
            raise SchemaCompileError(f"{sorted(keywords & schema.keys())} need \"type\": \"{name}\" beside them")


def _nothing(value: Any, path: JsonPath, faults: list) -> None:
    return None


def _forbidden(title: str) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        faults.append(Fault(path, "false", f"not part of the {title} format"))
    return check


def _all_of(checks: list[Check]) -> Check:
    if not checks:
        return _nothing
    if len(checks) == 1:
        return checks[0]

    def check(value: Any, path: JsonPath, faults: list) -> None:
        for one in checks:
            one(value, path, faults)
    return check


def _const(expected: Any) -> Check:
    def check(value: Any, path: JsonPath, faults: list) -> None:
        if type(value) is not type(expected) or value != expected:
            faults.append(Fault(path, "const", f"must be {json.dumps(expected)}, got {describe(value)}"))
    return check


def _type_fault(name: str, value: Any, path: JsonPath) -> Fault:
    hint = ""
    # Only a whole number has an obvious string form: "1.5" or "NaN" would fail the pattern next.
    if name == "string" and type(value) is int and value.bit_length() <= _HINT_BITS:
        hint = f" ({json.dumps(str(value))})"
    return Fault(path, "type", f"must be {_TYPE_NAMES[name]}{hint}, got {describe(value)}")


def _string(compiler: _Compiler, schema: Mapping[str, Any]) -> Check:
    pattern = schema.get("pattern")
    regex = None if pattern is None else re.compile(_ecma_end(pattern))
    wanted = schema.get("description") or f"text matching {pattern}"
    shortest, longest = schema.get("minLength"), schema.get("maxLength")

    def check(value: Any, path: JsonPath, faults: list) -> None:
        if not isinstance(value, str):
            faults.append(_type_fault("string", value, path))
            return
        if regex is not None and regex.search(value) is None:
            faults.append(Fault(path, "pattern", f"must be {wanted}, got {describe(value)}"))
        if shortest is not None and len(value) < shortest:
            message = "must not be empty" if shortest == 1 else f"must be at least {shortest} characters"
            faults.append(Fault(path, "minLength", message))
        if longest is not None and len(value) > longest:
            faults.append(Fault(path, "maxLength", f"must be at most {longest} characters, got {len(value)}"))
    return check


def _ecma_end(pattern: str) -> str:
    """A final ``$`` as ECMA-262 means it: end of text, no trailing newline allowed."""
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern


def _object(compiler: _Compiler, schema: Mapping[str, Any]) -> Check:
    required = tuple(schema.get("required", ()))
    properties = {name: compiler.compile(sub) for name, sub in schema.get("properties", {}).items()}

    def check(value: Any, path: JsonPath, faults: list) -> None:
        if not isinstance(value, dict):
            faults.append(_type_fault("object", value, path))
            return
        for name in required:
            if name not in value:
                faults.append(Fault(path + (name,), "required", "required field is missing"))
        for name, item in value.items():
            sub = properties.get(name)
            if sub is not None:
                sub(item, path + (name,), faults)
    return check


def _array(compiler: _Compiler, schema: Mapping[str, Any]) -> Check:
    item_check = compiler.compile(schema.get("items", True))
    fewest, most = schema.get("minItems"), schema.get("maxItems")

    def check(value: Any, path: JsonPath, faults: list) -> None:
        if not isinstance(value, list):
            faults.append(_type_fault("array", value, path))
            return
        if fewest is not None and len(value) < fewest:
            message = "must not be empty" if fewest == 1 else f"must list at least {fewest} items"
            faults.append(Fault(path, "minItems", message))
        if most is not None and len(value) > most:
            faults.append(Fault(path, "maxItems", f"lists {len(value)} items, at most {most} are allowed"))
        for index, item in enumerate(value):
            item_check(item, path + (index,), faults)
    return check


_TYPED: dict[str, Callable[[_Compiler, Mapping[str, Any]], Check]] = {
    "string": _string, "object": _object, "array": _array}


def describe(value: Any) -> str:
    """A short, JSON-flavoured description of ``value`` for messages."""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"the number {_shortened(json.dumps(value))}" if _printable(value) else "a huge number"
    if value is None:
        return "null"
    if isinstance(value, str):
        return _shortened(json.dumps(value[:MAX_SHOWN + 1]), len(value))
    if isinstance(value, dict):
        return "an object"
    return "a list" if isinstance(value, list) else type(value).__name__


def _printable(number: Any) -> bool:
    # str() of an int past 4300 digits raises; a float always prints.
    return not isinstance(number, int) or number.bit_length() < 4300 * 3


def _shortened(text: str, length: int = 0) -> str:
    """``text`` cut to ``MAX_SHOWN`` characters, saying how long the value was."""
    if len(text) <= MAX_SHOWN + 2:
        return text
    return f"{text[:MAX_SHOWN]}...({length or len(text)} chars)"


def format_path(path: JsonPath) -> str:
    """``("server_list", 1, "device", 3, "rank_id")`` -> ``server_list[1].device[3].rank_id``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text or "$"
