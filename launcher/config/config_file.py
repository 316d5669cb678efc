"""The ``--config`` YAML file read as settings: each option's value with the line it stands on.

Only what YAML's safe loader builds, with no aliases and bounded nesting; every problem is a
``ConfigError`` naming ``file:line``. Which keys are options, and their types, the command
decides (``launcher.cli.run_config``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping

import yaml

from launcher import limits
from launcher.errors import ConfigError
from launcher.limits import shown

_INT_TAG = "tag:yaml.org,2002:int"
_PLAIN_INT = re.compile(r"-?(0|[1-9][0-9]*)")
"""An integer as written by a person: YAML 1.1 also reads ``1_0``, ``010`` (octal), ``0x10``,
``0b10``, ``+1`` and ``1:30`` (base 60) as integers."""


@dataclasses.dataclass(frozen=True)
class FileSetting:
    """One key of a config file, with the line it stands on for error messages."""

    value: Any
    line: int
    key_lines: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """For a mapping value: the line of each of its keys."""

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(str(key), self.line)


def read_config_file(path: str) -> dict[str, FileSetting]:
    """Read a YAML mapping of option names (``cards``, ``kill-timeout`` ...) to values.

    Keys may use ``-`` or ``_``; they come back with ``_``. Errors name ``path:line``.
    """
    text = limits.read_bounded_text(path, "--config")
    try:
        _refuse_aliases(path, text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        raise ConfigError(f"{path}:{line}: invalid YAML: {e.problem or e.context}") from None
    if node is None:
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: expected a mapping of option: value")
    return _settings_from_mapping(path, node)


def _refuse_aliases(path: str, text: str) -> None:
    """A job config has no use for YAML aliases, and an alias bomb ("billion laughs") expands
    to gigabytes: refuse every alias, before anything is built from the document. Nesting is
    bounded too (building a node 100,000 deep overflows the stack)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"{path}:{event.start_mark.line + 1}: YAML alias *{event.anchor} "
                              "(aliases are not allowed in a job config; write the value out)")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > limits.MAX_JSON_DEPTH:
                raise ConfigError(f"{path}:{event.start_mark.line + 1}: nested deeper than "
                                  f"{limits.MAX_JSON_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _settings_from_mapping(path: str, node: yaml.MappingNode) -> dict[str, FileSetting]:
    settings: dict[str, FileSetting] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError(f"{path}:{line}: expected an option name as the key")
        key = str(key_node.value).replace("-", "_")
        if key in settings:
            raise ConfigError(f"{path}:{line}: {shown(key_node.value)} given twice")
        _refuse_hidden(path, key, value_node)
        settings[key] = FileSetting(_construct(path, key, value_node), line,
                                    _key_lines(value_node))
    return settings


def _refuse_hidden(path: str, key: str, node: yaml.Node) -> None:
    """What YAML would take without a word, refused on its line: a key given twice in a
    mapping (the last would win), an integer not written in digits 0-9 (``1_0`` is 10, ``010``
    is 8, ``0x10`` is 16), and a ``"\\ud800"`` escape, a lone surrogate, which no file name,
    argument or variable can hold (encoding it fails later, far from this file)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, yaml.ScalarNode):
            _check_scalar(path, key, item)
        elif isinstance(item, yaml.SequenceNode):
            stack.extend(reversed(item.value))
        elif isinstance(item, yaml.MappingNode):
            _check_keys(path, key, item)
            stack.extend(reversed([part for pair in item.value for part in pair]))


def _check_scalar(path: str, key: str, item: yaml.ScalarNode) -> None:
    line = item.start_mark.line + 1
    try:
        str(item.value).encode("utf-8")
    except UnicodeEncodeError as e:
        escape = ascii(e.object[e.start])[1:-1]
        raise ConfigError(f"{path}:{line}: {key}: {shown(item.value)}: the escape {escape} is a "
                          "lone surrogate, not a character") from None
    if item.tag != _INT_TAG or _PLAIN_INT.fullmatch(item.value):
        return
    reads = ""
    if len(item.value) <= limits.MAX_SHOWN:  # base 60 is quadratic, base 16 has no bound
        try:
            reads = f"YAML reads it as {yaml.SafeLoader('').construct_yaml_int(item)}; "
        except ValueError:  # ``!!int abc``: _construct says so
            return
    raise ConfigError(f"{path}:{line}: {key}: {shown(item.value)}: {reads}write a whole number in "
                      "digits 0-9, or quote it if you mean the text")


def _check_keys(path: str, key: str, item: yaml.MappingNode) -> None:
    seen: set[str] = set()
    for key_node, _ in item.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        if key_node.value in seen:
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: {key}: "
                              f"{shown(key_node.value)} given twice")
        seen.add(key_node.value)


def _construct(path: str, key: str, node: yaml.Node) -> Any:
    """The Python value of one setting: only what ``SafeLoader`` builds (no ``!!python/``)."""
    try:
        return yaml.SafeLoader("").construct_object(node, deep=True)
    except yaml.MarkedYAMLError as e:
        line = (e.problem_mark or node.start_mark).line + 1
        raise ConfigError(f"{path}:{line}: {key}: {e.problem or e.context}") from None
    except (ValueError, TypeError, OverflowError) as e:  # e.g. ``!!int abc``
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: {key}: not a valid "
                          f"{node.tag.rsplit(':', 1)[-1]} ({shown(str(e))})") from None


def _key_lines(node: yaml.Node) -> dict[str, int]:
    """The line of each key of a mapping value (``env:``, ``parallel:``), for messages."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 1 for k, _ in node.value
            if isinstance(k, yaml.ScalarNode)}


def check_known_keys(path: str, settings: Mapping[str, FileSetting],
                     known: Iterable[str]) -> None:
    """Refuse keys that are no option, naming the first by line."""
    allowed = set(known)
    for key, setting in sorted(settings.items(), key=lambda kv: kv[1].line):
        if key not in allowed:
            raise ConfigError(f"{path}:{setting.line}: unknown key '{key}'")
