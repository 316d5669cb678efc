"""The values msrun 2.10 accepts for ``--bind_core`` and ``--bind_numa``, checked as msrun checks
them (``_parse_and_validate_bind_*`` in ``mindspore/parallel/cluster/run.py``), so a command line
msrun refuses is refused here too, naming the option."""
from __future__ import annotations

import json
import os
import re
from typing import Any, Union

from launcher.errors import ConfigError
from launcher.limits import read_bounded_text, shown

BindValue = Union[bool, dict[str, Any]]

_DEVICE_KEY = re.compile(r"device\d+|scheduler")
_CPU_LIST = re.compile(r"(\d+-\d+|\d+(?:,\d+)*)")
_BIND_FILE_KEYS = ("bind_config", "bind_cpu", "bind_memory")


def bind_value(option: str, text: str) -> BindValue:
    """``True``/``False`` (any case), or a JSON object ``{"device0": ["0-7"], ...}`` (keys
    ``deviceN`` or ``scheduler``, each a list of core ranges), or a new-style binding object."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"{option} {shown(text)}: expected True, False or a JSON object like "
                          '{"device0": ["0-7"]}')
    if not any(k in value for k in _BIND_FILE_KEYS):
        _check_affinities(option, value)
    return value


def _check_affinities(option: str, value: dict[str, Any]) -> None:
    for key, ranges in value.items():
        if not _DEVICE_KEY.fullmatch(key):
            raise ConfigError(f"{option}: key {shown(key)}: expected 'scheduler' or 'deviceN'")
        if not isinstance(ranges, list) or not all(
                isinstance(r, str) and _CPU_LIST.fullmatch(re.sub(r"\s+", "", r)) for r in ranges):
            raise ConfigError(f"{option}: {key}: expected a list of ranges like \"0-7\" or "
                              f"\"0,1,2\", got {shown(json.dumps(ranges))}")


def bind_numa_value(option: str, text: str) -> BindValue:
    """As ``--bind_core``, or the path of a JSON binding file (``.json``: it must exist)."""
    if text.lower() in ("true", "false"):
        return bind_value(option, text)
    if text.lower().endswith(".json") and not os.path.isfile(text):
        raise ConfigError(f"{option} {shown(text)}: no such file")
    if os.path.isfile(text):
        return _bind_file(option, text)
    return bind_value(option, text)


def _bind_file(option: str, path: str) -> BindValue:
    try:
        value = json.loads(read_bounded_text(path, option))
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict) or ("bind_config" in value
                                       and not isinstance(value["bind_config"], dict)):
        raise ConfigError(f"{option} {shown(path)}: expected a JSON object (with a "
                          "'bind_config' object)")
    return value
