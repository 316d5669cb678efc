"""One server's rank table from this host's devices (what ``hccl_tools.py`` does, without its faults).

Device numbering, as in ``hccl_tools.py``: ``devices`` are *logical* ids, positions in the list
of visible devices; ``visible_devices`` are the *physical* ids behind them (by default the
``/dev/davinciN`` nodes present, ascending). The table records physical ids, and every device IP
is looked up by physical id (``hccl_tools.py`` asks ``hccn_tool`` for the logical one).
Ranks are numbered 0..N-1 in ascending logical order.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Mapping, Optional

from parallel.contract import shown
from rank_tables.ascend import AscendHost, DeviceIp
from rank_tables.bounded import MAX_DEVICE_ID, display_name, whole_number
from rank_tables.errors import TableInputError
from rank_tables.table import DeviceEntry, RankTable, ServerEntry, SuperPod, check_table
from rank_tables.validate import HOST_NIC_RESERVED, MAX_PORT, VERSIONS

# Digits are matched loosely here and judged by whole_number, so 5000 of them get the bound's message.
_HALF_OPEN = re.compile(r"\[\s*([0-9]+)\s*,\s*([0-9]+)\s*\)")
_SPAN = re.compile(r"([0-9]+)(?:-([0-9]+))?")
IdMap = tuple[tuple[int, str], ...]


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """Everything ``generate`` needs besides the host itself; checks itself when built.

    Maps from a physical device id (``device_ips``, ``super_device_ids``, ``backup_device_ips``)
    are tuples of ``(device, value)`` pairs so the config stays a frozen value.
    """

    server_id: str
    version: str = "1.0"
    devices: Optional[tuple[int, ...]] = None
    visible_devices: Optional[tuple[int, ...]] = None
    device_ips: IdMap = ()
    device_port: Optional[int] = None
    host_port: Optional[int] = None
    host_ip: Optional[str] = None
    super_pod_id: Optional[str] = None
    super_device_ids: IdMap = ()
    backup_device_ips: IdMap = ()
    backup_device_port: Optional[int] = None

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise TableInputError(f"--format {self.version}: must be one of {', '.join(VERSIONS)}")
        if not 0 < len(self.server_id) <= 64:
            raise TableInputError(f"--server-id {shown(self.server_id)}: must be 1 to 64 characters")
        self._check_version_options()
        self._check_super_device_ids()
        self._check_ports()

    def _check_version_options(self) -> None:
        only_v12 = {"--super-pod-id": self.super_pod_id, "--super-device-id": self.super_device_ids,
                    "--backup-device-ip": self.backup_device_ips, "--backup-device-port": self.backup_device_port}
        used = [name for name, value in only_v12.items() if value]
        if self.version != "1.2" and used:
            raise TableInputError(f"{', '.join(used)}: only for --format 1.2 (Atlas A3 SuperPoD)")

    def _check_super_device_ids(self) -> None:
        bad = [f"{d}={v}" for d, v in self.super_device_ids if whole_number(v) is None]
        if bad:
            raise TableInputError(f"--super-device-id {display_name(bad[0])}: the value must be a whole number "
                              "written in digits 0-9 (at most 12)")

    def _check_ports(self) -> None:
        ports = {"--device-port": self.device_port, "--host-port": self.host_port,
                 "--backup-device-port": self.backup_device_port}
        for name, port in ports.items():
            if port is not None and not 1 <= port <= MAX_PORT:
                raise TableInputError(f"{name} {port}: must be within 1-{MAX_PORT}")
        if self.host_port is not None and self.host_port + MAX_DEVICE_ID > MAX_PORT:
            raise TableInputError(f"--host-port {self.host_port}: devices get consecutive host ports, "
                              f"so it must be at most {MAX_PORT - MAX_DEVICE_ID}")


@dataclasses.dataclass(frozen=True)
class GeneratedServer:
    """A generated one-server table and what the user should hear about how it was made."""

    table: RankTable
    logical_ids: tuple[int, ...]
    device_ips: Mapping[int, DeviceIp]

    def default_filename(self) -> str:
        """``hccl_{N}p_{logical ids}_{server_id}.json``, the name ``hccl_tools.py`` gives."""
        ids = "".join(map(str, self.logical_ids))
        return f"hccl_{len(self.logical_ids)}p_{ids}_{self.table.servers[0].server_id}.json"


def parse_device_list(text: str, option: str = "--devices") -> tuple[int, ...]:
    """``0-7``, ``0,2,4,6``, ``0-3,8-11`` or ``hccl_tools.py``'s ``[0,8)`` -> ascending ids, each
    within 0..``MAX_DEVICE_ID`` (so ``0-99999999999`` is refused, not listed)."""
    half_open = _HALF_OPEN.fullmatch(text.strip())
    if half_open:
        first = _device_id(half_open.group(1), text, option)
        last = _device_id(half_open.group(2), text, option, past_end=True)
        ids = list(range(first, last + 1))
    else:
        ids = [i for part in text.split(",") for i in _parse_span(part, text, option)]
    if not ids:
        raise TableInputError(f"{option} {shown(text)}: names no device")
    if len(set(ids)) != len(ids):
        raise TableInputError(f"{option} {shown(text)}: names a device twice")
    return tuple(sorted(ids))


def _parse_span(part: str, text: str, option: str) -> range:
    match = _SPAN.fullmatch(part.strip())
    if match is None:
        raise TableInputError(f"{option} {shown(text)}: expected ids like 0-7, 0,2,4,6 or [0,8)")
    first = _device_id(match.group(1), text, option)
    last = _device_id(match.group(2) or match.group(1), text, option)
    if last < first:
        raise TableInputError(f"{option} {shown(text)}: range {part.strip()} runs backwards")
    return range(first, last + 1)


def _device_id(digits: str, text: str, option: str, past_end: bool = False) -> int:
    """A device id; with ``past_end``, the id before it (``[0,8)`` names 0 .. 7): the one the
    user named last is the one an error names."""
    number = whole_number(digits)
    if number is not None and past_end:
        number -= 1  # -1 for [0,0), which names no device
        digits = str(number)
    if number is None or number > MAX_DEVICE_ID:
        said = digits if len(digits) <= 12 else f"{digits[:12]}...({len(digits)} digits)"
        raise TableInputError(f"{option} {shown(text)}: {said} is out of range 0-{MAX_DEVICE_ID} "
                          f"(physical ids of /dev/davinci0 .. /dev/davinci{MAX_DEVICE_ID})")
    return number


def parse_assignments(items: Iterable[str], option: str, example: str = "192.168.1.6") -> IdMap:
    """``["0=192.168.1.6", ...]`` -> ``((0, "192.168.1.6"), ...)``; ``N`` is a physical device id."""
    pairs: dict[int, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        device = whole_number(key.strip())
        if not sep or device is None or not value.strip():
            raise TableInputError(f"{option} {shown(item)}: expected N=VALUE with N a device id written in "
                              f"digits 0-9, e.g. {option} 0={example}")
        if device > MAX_DEVICE_ID:
            raise TableInputError(f"{option} {shown(item)}: device {device} is out of range 0-{MAX_DEVICE_ID} "
                              f"(physical ids of /dev/davinci0 .. /dev/davinci{MAX_DEVICE_ID})")
        if device in pairs:
            raise TableInputError(f"{option}: device {device} is given twice")
        pairs[device] = value.strip()
    return tuple(sorted(pairs.items()))


def generate_server(config: GenerateConfig, host: AscendHost) -> GeneratedServer:
    """Build and validate the one-server table for ``config`` from what ``host`` reports."""
    logical, physical = _chosen_devices(config, host.devices())
    ips = host.device_ips(physical, dict(config.device_ips))
    pods = host.super_pod_info(physical) if _needs_npu_smi(config, physical) else {}
    given = {d: whole_number(v) for d, v in config.super_device_ids}
    sdids = {d: info.super_device_id for d, info in pods.items()} | given
    devices = tuple(_device(config, rank, phys, ips[phys].ip, sdids.get(phys)) for rank, phys in enumerate(physical))
    server = ServerEntry(server_id=config.server_id, devices=devices, host_ip=config.host_ip,
                         host_nic_ip=HOST_NIC_RESERVED if config.version == "1.0" else None)
    table = RankTable(version=config.version, servers=(server,), super_pods=_super_pods(config, pods))
    return GeneratedServer(check_table(table, f"generated table for {config.server_id}"), logical, ips)


def _chosen_devices(config: GenerateConfig, present: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    visible = config.visible_devices if config.visible_devices is not None else present
    if not visible:
        raise TableInputError("no Ascend devices found (no davinciN device nodes); pass --visible-devices "
                          "to describe the host's devices by hand")
    absent = [d for d in visible if present and d not in present]
    if absent:
        raise TableInputError(f"--visible-devices: no device node for {','.join(map(str, absent))} "
                          f"(present: {','.join(map(str, present))})")
    logical = config.devices if config.devices is not None else tuple(range(len(visible)))
    beyond = [i for i in logical if i >= len(visible)]
    if beyond:
        raise TableInputError(f"--devices: logical id(s) {','.join(map(str, beyond))} out of range, "
                          f"{len(visible)} device(s) visible ({','.join(map(str, visible))})")
    return logical, tuple(visible[i] for i in logical)


def _needs_npu_smi(config: GenerateConfig, physical: tuple[int, ...]) -> bool:
    given = {d for d, _ in config.super_device_ids}
    return config.version == "1.2" and (config.super_pod_id is None or not given.issuperset(physical))


def _device(config: GenerateConfig, rank: int, physical: int, ip: str, sdid: Optional[int]) -> DeviceEntry:
    backup = dict(config.backup_device_ips).get(physical)
    return DeviceEntry(
        device_id=physical,
        device_ip=ip,
        rank_id=rank,
        device_port=config.device_port,
        super_device_id=sdid,
        backup_device_ip=backup,
        backup_device_port=config.backup_device_port if backup else None,
        host_port=None if config.host_port is None else config.host_port + rank,
    )


def _super_pods(config: GenerateConfig, pods: Mapping) -> tuple[SuperPod, ...]:
    if config.version != "1.2":
        return ()
    pod_ids = {info.super_pod_id for info in pods.values()}
    if config.super_pod_id is None and len(pod_ids) != 1:
        raise TableInputError(f"npu-smi reports super pod ids {sorted(pod_ids)} for one server; pass --super-pod-id")
    return (SuperPod(config.super_pod_id or pod_ids.pop(), (config.server_id,)),)
