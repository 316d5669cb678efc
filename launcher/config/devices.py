"""Which Ascend cards this host has, from the device nodes the driver creates."""
from __future__ import annotations

import dataclasses
import enum
import os
import re
from typing import Mapping

from launcher.errors import ConfigError
from parallel import contract

"""Where to look for ``davinciN`` nodes instead of ``/dev``: lets tests stand in for a host
with cards by creating plain files named like the driver's device nodes."""

_DEVICE_NODE = re.compile(r"davinci(\d+)")


class DeviceKind(str, enum.Enum):
    """What the ranks run on. ``auto`` resolves to ``npu`` when cards exist, else ``cpu``."""

    AUTO = "auto"
    NPU = "npu"
    CPU = "cpu"


@dataclasses.dataclass(frozen=True)
class Card:
    """One card as a process sees it: ``logical`` is what ``DEVICE_ID`` gets under
    ``ASCEND_RT_VISIBLE_DEVICES``; ``physical`` is the driver's number (rank tables use it)."""

    logical: int
    physical: int


def find_cards(environ: Mapping[str, str]) -> tuple[Card, ...]:
    """The cards a process started with ``environ`` may use, in logical order."""
    devfs = environ.get(contract.DEVFS, "/dev")
    try:
        names = os.listdir(devfs)
    except OSError:
        return ()
    present = sorted(int(m.group(1)) for m in map(_DEVICE_NODE.fullmatch, names) if m)
    visible = environ.get(contract.ASCEND_RT_VISIBLE_DEVICES, "").strip()
    if not visible:
        return tuple(Card(i, p) for i, p in enumerate(present))
    chosen = _parse_visible(visible)
    missing = [p for p in chosen if p not in present]
    if missing:
        raise ConfigError(f"{contract.ASCEND_RT_VISIBLE_DEVICES}={visible}: no device "
                          f"{', '.join(map(str, missing))} in {devfs} (found {present or 'none'})")
    return tuple(Card(i, p) for i, p in enumerate(chosen))


def _parse_visible(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"{contract.ASCEND_RT_VISIBLE_DEVICES}={text}: expected ids like "
                          "0,1,2,3") from None
    if ids != sorted(set(ids)):
        raise ConfigError(f"{contract.ASCEND_RT_VISIBLE_DEVICES}={text}: ids must be ascending "
                          "and unique")
    return ids


def resolve_kind(requested: DeviceKind, cards: tuple[Card, ...]) -> DeviceKind:
    """Turn ``auto`` into what this host has; ``npu`` without cards is an error."""
    if requested is DeviceKind.NPU and not cards:
        raise ConfigError("--device npu: no Ascend cards found (no /dev/davinciN)")
    if requested is DeviceKind.AUTO:
        return DeviceKind.NPU if cards else DeviceKind.CPU
    return requested
