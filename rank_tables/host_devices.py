"""One model of an Ascend host's devices, read from the driver's tools as they print.

The device is the key everywhere: its physical id (``Phy-ID``), the ``N`` of ``/dev/davinciN``,
what ``ASCEND_RT_VISIBLE_DEVICES``, a rank table's ``device_id`` and ``hccn_tool -i N`` name.
The tools name it differently by generation (captures and sources:
``tests/fixtures/ascend_tools/README.md``):

* 910A, 910B (Atlas A2): one die per NPU; ``npu-smi info`` pairs a ``| NPU  Name | Health |``
  row with a ``| Chip | Bus-Id |`` row; the NPU id is the device.
* Atlas A3 (910C, npu-smi 24.1 and later): two dies per NPU, 16 devices; the second row of each
  pair is ``| Chip  Phy-ID | Bus-Id |``, so each die has its own Health cell and Phy-ID; the
  process table names ``NPU  Chip`` (the die within its NPU), mapped here to the Phy-ID.
  310P prints ``Chip  Device`` in that place, read the same way.
* ``npu-smi info -m``: ``NPU ID | Chip ID | Chip Logic ID | [Chip Phy-ID |] Chip Name``; it maps
  NPU/Chip to the device where the table alone does not (several dies per NPU, no Phy-ID
  column), and the topology's ``NPU<n>`` (a logic id) to the device.

A layout no rule here reads (a new generation, a new npu-smi) is not guessed at:
``HostDevices.not_understood`` says what was not understood, and the checks that need it are
skipped, never failed. ``find_tool`` is the one lookup of the driver's tools.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
from typing import Mapping, Optional

TOOL_DIRS = ("/usr/local/sbin", "/usr/local/Ascend/driver/tools")
"""Where the driver installs ``npu-smi`` and ``hccn_tool``, searched after ``PATH``: a
non-interactive ssh session of a non-root user often has neither on its ``PATH``."""

_VERSION = re.compile(r"^\|?\s*(npu-smi\s+\S+)")
_HEADER_NAME = re.compile(r"^\|\s*NPU\s+Name\s*\|\s*Health\s*\|")
_HEADER_CHIP = re.compile(r"^\|\s*Chip(?:\s+(Phy-ID|Device))?\s*\|\s*Bus-Id\s*\|")
_NAME_ROW = re.compile(r"^\|\s*(\d+)\s+([^|\s][^|]*?)\s*\|\s*([A-Za-z][^|]*?)\s*\|")
_CHIP_ROW = re.compile(r"^\|\s*(\d+)(?:\s+(\d+))?\s*\|\s*([0-9A-Fa-f]{4}:[^|\s]*|NA|-)\s*\|")
_PROCESS_HEADER = re.compile(r"^\|\s*NPU\s+Chip\s*\|\s*Process id\s*\|")
_PROCESS_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s*\|\s*([^|]*?)\s*\|")
_NO_PROCESS = re.compile(r"No running processes found in NPU\s+(\d+)")
_COLUMNS = re.compile(r"\t|\s{2,}")


def tool_path(environ: Mapping[str, str]) -> str:
    """``PATH``, then the driver's folders: where ``find_tool`` looks."""
    return os.pathsep.join(p for p in (environ.get("PATH", os.defpath), *TOOL_DIRS) if p)


def find_tool(name: str, environ: Mapping[str, str]) -> Optional[str]:
    """The full path of the driver tool ``name``: on ``PATH``, then in ``TOOL_DIRS``."""
    return shutil.which(name, path=tool_path(environ))


@dataclasses.dataclass(frozen=True)
class Die:
    """One device: its NPU, the die within it (``Chip``), its logic id (None: not known)."""

    device: int
    npu: int
    chip: int
    logic: Optional[int] = None
    health: str = ""


@dataclasses.dataclass(frozen=True)
class HostDevices:
    """A host's devices by physical id, with what ``npu-smi info`` said of each: health,
    processes (pid, name), and which it said run none. ``version`` is npu-smi's own version
    line; ``not_understood`` is empty when the output was read, else what was not."""

    version: str = ""
    dies: Mapping[int, Die] = dataclasses.field(default_factory=dict)
    processes: Mapping[int, tuple[tuple[int, str], ...]] = dataclasses.field(default_factory=dict)
    idle: frozenset[int] = frozenset()
    not_understood: str = ""

    @property
    def read(self) -> bool:
        return not self.not_understood

    def device_of(self, npu: int, chip: int) -> Optional[int]:
        """The device of die ``chip`` of NPU ``npu``."""
        return next((d.device for d in self.dies.values() if (d.npu, d.chip) == (npu, chip)), None)

    def device_of_logic(self, logic: int) -> int:
        """The device of logic id ``logic`` (the topology's ``NPU<n>``); the same number where
        the map does not say (910A/910B: logic and physical ids are one)."""
        return next((d.device for d in self.dies.values() if d.logic == logic), logic)

    def described(self) -> str:
        """``npu-smi 24.1.rc3.7``, or ``npu-smi (no version line)``."""
        return self.version or "npu-smi (no version line)"


def parse_chip_map(text: str) -> dict[int, Die]:
    """``npu-smi info -m``: device -> ``Die`` (management ``Mcu`` rows, ``-`` ids skipped).
    Without a ``Chip Phy-ID`` column (910A/910B) the logic id is the device. Empty when the
    output has no ``NPU ID`` header."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if "NPU ID" in line and "Chip ID" in line), None)
    if header is None:
        return {}
    columns = _COLUMNS.split(lines[header].strip())
    if "Chip Logic ID" not in columns and "Chip Phy-ID" not in columns:
        return {}
    npu, chip = columns.index("NPU ID"), columns.index("Chip ID")
    logic = columns.index("Chip Logic ID") if "Chip Logic ID" in columns else None
    phy = columns.index("Chip Phy-ID") if "Chip Phy-ID" in columns else logic
    dies: dict[int, Die] = {}
    for line in lines[header + 1:]:
        cells = _COLUMNS.split(line.strip())
        number = {i: _whole(cells[i]) if i is not None and len(cells) > i else None
                  for i in (npu, chip, logic, phy)}
        n, c, p = number[npu], number[chip], number[phy]
        if n is not None and c is not None and p is not None:
            dies[p] = Die(p, n, c, number[logic] if logic is not None else None)
    return dies


def parse_info(text: str, chip_map: Optional[Mapping[int, Die]] = None) -> HostDevices:
    """``npu-smi info``'s device and process tables as a ``HostDevices``; ``chip_map`` (from
    ``npu-smi info -m``) names the device of each die where the table does not."""
    version = next((m.group(1) for m in map(_VERSION.match, text.splitlines()[:4]) if m), "")
    device_part, process_part = _split_tables(text)
    read = _read_device_table(device_part, chip_map or {})
    if isinstance(read, str):
        return HostDevices(version, not_understood=read)
    dies = read
    if process_part is None:
        return HostDevices(version, dies, not_understood="no process table ('| NPU  Chip | Process id |')")
    processes, idle, why = _read_process_table(process_part, dies)
    return HostDevices(version, dies, processes, idle, why)


def _split_tables(text: str) -> tuple[list[str], Optional[list[str]]]:
    """The device table's lines and the process table's (None: there is none)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _PROCESS_HEADER.match(line)), None)
    return (lines, None) if start is None else (lines[:start], lines[start:])


def _read_device_table(lines: list[str], chip_map: Mapping[int, Die]) -> "dict[int, Die] | str":
    """Device -> Die with its health, or what was not understood."""
    if not any(_HEADER_NAME.match(line) for line in lines):
        return "no '| NPU  Name | Health |' header"
    chip_header = next((m for m in map(_HEADER_CHIP.match, lines) if m), None)
    if chip_header is None:
        return "no '| Chip [Phy-ID] | Bus-Id |' header"
    with_phy = chip_header.group(1) is not None
    pairs = _row_pairs(lines, with_phy)
    if isinstance(pairs, str):
        return pairs
    if not pairs:
        return "no device rows"
    return _dies(pairs, with_phy, chip_map)


def _row_pairs(lines: list[str], with_phy: bool) -> "list[tuple[int, str, int, Optional[int]]] | str":
    """``(npu, health, chip, phy)`` of each Name/Health row and the Chip row under it."""
    pairs, npu, health = [], None, ""
    for line in lines:
        if _HEADER_NAME.match(line) or _HEADER_CHIP.match(line):
            continue
        name = _NAME_ROW.match(line)
        if name:
            npu, health = int(name.group(1)), name.group(3)
            continue
        chip = _CHIP_ROW.match(line)
        if chip and npu is not None:
            phy = chip.group(2)
            if with_phy and phy is None:
                return f"a chip row without its Phy-ID: {line.strip()[:60]!r}"
            pairs.append((npu, health, int(chip.group(1)), int(phy) if phy is not None else None))
            npu = None
    return pairs


def _dies(pairs: list[tuple[int, str, int, Optional[int]]], with_phy: bool,
          chip_map: Mapping[int, Die]) -> "dict[int, Die] | str":
    by_die = {(d.npu, d.chip): d for d in chip_map.values()}
    one_die_each = len({npu for npu, *_ in pairs}) == len(pairs)
    dies: dict[int, Die] = {}
    for npu, health, chip, phy in pairs:
        mapped = by_die.get((npu, chip))
        if with_phy and phy is not None:
            device = phy
        elif mapped is not None:
            device = mapped.device
        elif one_die_each:
            device = npu  # 910A/910B: the NPU id is the device
        else:
            return (f"NPU {npu} has several dies and neither a Phy-ID column nor "
                    "npu-smi info -m names their devices")
        dies[device] = Die(device, npu, chip, mapped.logic if mapped else None, health)
    return dies


def _read_process_table(lines: list[str], dies: Mapping[int, Die]
                        ) -> tuple[dict[int, tuple[tuple[int, str], ...]], frozenset[int], str]:
    by_die = {(d.npu, d.chip): d.device for d in dies.values()}
    processes: dict[int, list[tuple[int, str]]] = {}
    free_npus: set[int] = set()
    for line in lines[1:]:
        free = _NO_PROCESS.search(line)
        row = _PROCESS_ROW.match(line)
        if free:
            free_npus.add(int(free.group(1)))
        elif row:
            device = by_die.get((int(row.group(1)), int(row.group(2))))
            if device is None:
                return {}, frozenset(), (f"a process row names NPU {row.group(1)} chip {row.group(2)}, "
                                         "which the device table does not list")
            processes.setdefault(device, []).append((int(row.group(3)), row.group(4)))
    # An NPU's section lists only its dies that run something: its other dies are free.
    named = free_npus | {d.npu for d in dies.values() if d.device in processes}
    idle = frozenset(d.device for d in dies.values() if d.npu in named and d.device not in processes)
    return {d: tuple(p) for d, p in processes.items()}, idle, ""


def _whole(cell: str) -> Optional[int]:
    return int(cell) if cell.isascii() and cell.isdigit() and len(cell) <= 4 else None
