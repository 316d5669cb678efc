"""Check a rank table's structure (JSON Schema) and meaning, reporting every problem with its path.

Structure comes from ``rank_tables/schemas/rank_table_v<version>.json`` (see ``structure``).
Meaning, as HCCL and MindSpore expect it (CANN HCCL user guide, "rank table configuration"):

* ``server_count`` equals the servers listed; ``server_id`` values are unique;
* ``rank_id`` values are 0..N-1, each once, and follow server order (server 0 holds the lowest
  block of ranks, and so on: MindSpore derives rank order from ``server_list`` order);
* a server lists each ``device_id`` once, within 0..15 (``/dev/davinci0`` .. ``davinci15``);
* every ``device_ip`` is a well-formed IPv4/IPv6 address used once in the table, and present
  whenever the table spans several servers (v1.0) or several super pods (v1.2);
* ports are within 1..65535 and ``host_port`` is unique on its server;
* v1.2: each server is in exactly one super pod, listed together with the rest of its pod,
  every pod member exists, and ``super_device_id`` is present and unique within its pod.

Semantic checks skip values that already failed the structure checks, so each fault is reported
once.
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional

from rank_tables.bounded import MAX_DEVICE_ID, whole_number
from rank_tables.structure import Check, Fault, JsonPath, compile_schema, describe, format_path
from rank_tables.surrogates import all_text, surrogates

VERSIONS = ("1.0", "1.2")
MAX_PORT = 65535
HOST_NIC_RESERVED = "reserve"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = re.compile(rf"{_OCTET}(\.{_OCTET}){{3}}")
PORT_KEYS = frozenset({"device_port", "backup_device_port", "host_port"})
SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a table: a JSON path such as ``server_list[1].device[3].rank_id``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def validate(doc: Any) -> list[Problem]:
    """Every problem in ``doc`` (a parsed rank table); an empty list means the table is valid."""
    faults: list = []
    structure_check(_version_of(doc))(doc, (), faults)
    problems = [Problem(format_path(f.path), f.message) for f in _with_version_listed(doc, faults)]
    if isinstance(doc, dict) and isinstance(doc.get("server_list"), list):
        view = _TableView.of(doc)
        for check in _SEMANTIC_CHECKS:
            problems.extend(check(view))
    if not all_text(doc):
        faulted = {p.path for p in problems}
        problems.extend(Problem(format_path(path), message) for path, message in surrogates(doc)
                        if format_path(path) not in faulted)
    return problems


def load_schema(version: str) -> dict[str, Any]:
    """The JSON Schema of rank table ``version`` ("1.0" or "1.2") shipped in this package."""
    # A path next to this file, not importlib.resources: an editable install made before
    # rank_tables/__init__.py existed maps the package as a namespace, which resources rejects.
    return json.loads((SCHEMA_DIR / f"rank_table_v{version}.json").read_text("utf-8"))


@functools.lru_cache(maxsize=None)
def structure_check(version: str) -> Check:
    """The compiled structure check for ``version``."""
    return compile_schema(load_schema(version))


def _with_version_listed(doc: Any, faults: list) -> list:
    """The v1.0 schema checking a table of unknown version says 'must be "1.0"'; say every one."""
    version = doc.get("version") if isinstance(doc, dict) else None
    if version is None or version in VERSIONS:
        return faults
    listed = " or ".join(json.dumps(v) for v in VERSIONS)
    kind = "" if isinstance(version, str) else " (a string)"
    message = f"must be {listed}{kind}, got {describe(version)}"
    return [Fault(f.path, f.keyword, message) if f.path == ("version",) else f for f in faults]


def _version_of(doc: Any) -> str:
    # An unknown version is checked against v1.0, whose schema then reports the version itself.
    version = doc.get("version") if isinstance(doc, dict) else None
    return version if version in VERSIONS else VERSIONS[0]


class _Device(NamedTuple):
    # A NamedTuple, not a frozen dataclass: one is built per rank and this is 3x cheaper.
    path: JsonPath
    server: int
    fields: dict


@dataclasses.dataclass(frozen=True)
class _TableView:
    """The parts of a table that are objects where objects belong, gathered in one pass."""

    doc: dict
    servers: tuple[tuple[int, dict], ...]
    devices: tuple[_Device, ...]

    device_count: int
    """Entries in all device lists, objects or not."""

    @classmethod
    def of(cls, doc: dict) -> "_TableView":
        servers = tuple((i, s) for i, s in enumerate(doc["server_list"]) if isinstance(s, dict))
        lists = [(i, server["device"]) for i, server in servers if isinstance(server.get("device"), list)]
        devices = tuple(_Device(("server_list", i, "device", j), i, d)
                        for i, listed in lists for j, d in enumerate(listed) if isinstance(d, dict))
        return cls(doc, servers, devices, sum(len(listed) for _, listed in lists))

    @property
    def complete(self) -> bool:
        """Every server is an object with a device list, and every device is an object."""
        servers_ok = len(self.servers) == len(self.doc["server_list"])
        lists_ok = all(isinstance(s.get("device"), list) for _, s in self.servers)
        return servers_ok and lists_ok and len(self.devices) == self.device_count

    @property
    def version(self) -> Any:
        return self.doc.get("version")

    def super_pods(self) -> Optional[list]:
        pods = self.doc.get("super_pod_list")
        return pods if self.version == "1.2" and isinstance(pods, list) else None


def _number(value: Any) -> Optional[int]:
    """The int in a string such as ``"12"``; ``None`` for anything the schema already rejects
    (``str.isdigit`` would let ``"²"`` through, and ``int`` refuses 5000 digits)."""
    return whole_number(value) if isinstance(value, str) else None


def _problem(path: JsonPath, message: str) -> Problem:
    return Problem(format_path(path), message)


def _check_server_count(view: _TableView) -> Iterator[Problem]:
    count = _number(view.doc.get("server_count"))
    listed = len(view.doc["server_list"])
    if count is not None and count != listed:
        yield _problem(("server_count",), f"says {count} but server_list has {listed} server(s)")


def _check_server_ids(view: _TableView) -> Iterator[Problem]:
    first: dict[str, int] = {}
    for index, server in view.servers:
        server_id = server.get("server_id")
        if not isinstance(server_id, str):
            continue
        if server_id in first:
            yield _problem(("server_list", index, "server_id"),
                           f"{describe(server_id)} is already server_list[{first[server_id]}]")
        else:
            first[server_id] = index


def _check_device_ids(view: _TableView) -> Iterator[Problem]:
    seen: dict[tuple[int, int], JsonPath] = {}
    for device in view.devices:
        device_id = _number(device.fields.get("device_id"))
        if device_id is None:
            continue
        path = device.path + ("device_id",)
        if device_id > MAX_DEVICE_ID:
            yield _problem(path, f"{device_id} is out of range 0-{MAX_DEVICE_ID} "
                                 f"(physical ids of /dev/davinci0 .. /dev/davinci{MAX_DEVICE_ID})")
        elif (device.server, device_id) in seen:
            yield _problem(path, f"device {device_id} is listed twice on this server "
                                 f"(also {format_path(seen[device.server, device_id])})")
        else:
            seen[device.server, device_id] = device.path


def _check_ranks(view: _TableView) -> Iterator[Problem]:
    total = view.device_count
    owner: dict[int, JsonPath] = {}
    problems, unreadable = [], not view.complete
    for device in view.devices:
        rank = _number(device.fields.get("rank_id"))
        path = device.path + ("rank_id",)
        if rank is None:
            unreadable = True
        elif rank >= total:
            problems.append(_problem(path, f"rank {rank} is out of range 0-{total - 1} ({total} devices in the table)"))
        elif rank in owner:
            problems.append(_problem(path, f"rank {rank} is already {format_path(owner[rank])}"))
        else:
            owner[rank] = device.path
    yield from problems
    # Order is judged only on a complete set of ranks; otherwise it would repeat the faults above.
    if not problems and not unreadable:
        yield from _check_rank_order(view)


def _check_rank_order(view: _TableView) -> Iterator[Problem]:
    by_server: dict[int, list[int]] = {index: [] for index, _ in view.servers}
    for device in view.devices:
        rank_id = _number(device.fields["rank_id"])
        if rank_id is not None:  # always, in a table with no other problem
            by_server[device.server].append(rank_id)
    start = 0
    for index, ranks in by_server.items():
        expected = list(range(start, start + len(ranks)))
        if ranks and sorted(ranks) != expected:
            yield _problem(("server_list", index, "device"),
                           f"holds ranks {_span(sorted(ranks))} but server order gives it {_span(expected)} "
                           "(rank order must follow server_list order)")
        start += len(ranks)


def _span(ranks: list) -> str:
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
    return ",".join(map(str, ranks))


def _is_address(value: str) -> bool:
    if _IPV4.fullmatch(value):
        return True
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _bad_address(path: JsonPath, value: str) -> Problem:
    return _problem(path, f"{describe(value)} is not an IPv4 or IPv6 address")


def _check_device_ips(view: _TableView) -> Iterator[Problem]:
    owner: dict[str, JsonPath] = {}
    needed = _device_ip_needed(view)
    for device in view.devices:
        path = device.path + ("device_ip",)
        value = device.fields.get("device_ip")
        if value is None and needed:
            yield _problem(path, f"required when the table spans more than one {needed}")
        if not isinstance(value, str) or not value:
            continue
        if not _is_address(value):
            yield _bad_address(path, value)
        elif value in owner:
            yield _problem(path, f"{value} is already used by {format_path(owner[value])}")
        else:
            owner[value] = device.path


def _device_ip_needed(view: _TableView) -> Optional[str]:
    pods = view.super_pods()
    if pods is not None:
        return "super pod" if len(pods) > 1 else None
    return "server" if len(view.servers) > 1 else None


def _check_other_addresses(view: _TableView) -> Iterator[Problem]:
    for index, server in view.servers:
        host_ip = server.get("host_ip")
        if isinstance(host_ip, str) and host_ip and not _is_address(host_ip):
            yield _bad_address(("server_list", index, "host_ip"), host_ip)
        nic = server.get("host_nic_ip")
        if isinstance(nic, str) and nic != HOST_NIC_RESERVED and not _is_address(nic):
            yield _problem(("server_list", index, "host_nic_ip"),
                           f"must be {json.dumps(HOST_NIC_RESERVED)} or an IP address, got {describe(nic)}")
    for device in view.devices:
        backup = device.fields.get("backup_device_ip")
        if isinstance(backup, str) and backup and not _is_address(backup):
            yield _bad_address(device.path + ("backup_device_ip",), backup)


def _check_ports(view: _TableView) -> Iterator[Problem]:
    host_ports: dict[tuple[int, int], JsonPath] = {}
    for device in view.devices:
        if PORT_KEYS.isdisjoint(device.fields):
            continue
        for key in PORT_KEYS & device.fields.keys():
            port = _number(device.fields.get(key))
            if port is not None and not 1 <= port <= MAX_PORT:
                yield _problem(device.path + (key,), f"{port} is out of range 1-{MAX_PORT}")
        port = _number(device.fields.get("host_port"))
        if port is None:
            continue
        if (device.server, port) in host_ports:
            yield _problem(device.path + ("host_port",), f"{port} is already used on this server by "
                                                          f"{format_path(host_ports[device.server, port])}")
        host_ports[device.server, port] = device.path


def _check_super_pods(view: _TableView) -> Iterator[Problem]:
    pods = view.super_pods()
    if pods is None:
        return
    membership: dict[str, int] = {}
    yield from _check_pod_ids(pods)
    yield from _check_pod_members(view, pods, membership)
    yield from _check_servers_in_pods(view, membership)
    yield from _check_super_device_ids(view, membership)


def _check_pod_ids(pods: list) -> Iterator[Problem]:
    first: dict[str, int] = {}
    for index, pod in enumerate(pods):
        pod_id = pod.get("super_pod_id") if isinstance(pod, dict) else None
        if not isinstance(pod_id, str):
            continue
        if pod_id in first:
            yield _problem(("super_pod_list", index, "super_pod_id"),
                           f"{describe(pod_id)} is already super_pod_list[{first[pod_id]}]")
        first.setdefault(pod_id, index)


def _check_pod_members(view: _TableView, pods: list, membership: dict[str, int]) -> Iterator[Problem]:
    known = {s.get("server_id") for _, s in view.servers if isinstance(s.get("server_id"), str)}
    for index, pod in enumerate(pods):
        members = pod.get("server_list") if isinstance(pod, dict) else None
        for k, entry in enumerate(members if isinstance(members, list) else []):
            server_id = entry.get("server_id") if isinstance(entry, dict) else None
            if not isinstance(server_id, str):
                continue
            path = ("super_pod_list", index, "server_list", k, "server_id")
            if server_id not in known:
                yield _problem(path, f"{describe(server_id)} is not a server_id in server_list")
            elif server_id in membership:
                yield _problem(path, f"{describe(server_id)} is already in super_pod_list[{membership[server_id]}]")
            else:
                membership[server_id] = index


def _check_servers_in_pods(view: _TableView, membership: dict[str, int]) -> Iterator[Problem]:
    finished: set[int] = set()
    current: Optional[int] = None
    for index, server in view.servers:
        server_id = server.get("server_id")
        if not isinstance(server_id, str):
            continue
        pod = membership.get(server_id)
        path = ("server_list", index, "server_id")
        if pod is None:
            yield _problem(path, f"{describe(server_id)} is in no super pod of super_pod_list")
            continue
        if pod in finished:
            yield _problem(path, f"servers of super_pod_list[{pod}] must be listed together in server_list")
        if current is not None and pod != current:
            finished.add(current)
        current = pod


def _check_super_device_ids(view: _TableView, membership: dict[str, int]) -> Iterator[Problem]:
    owner: dict[tuple[int, int], JsonPath] = {}
    server_ids = dict(view.servers)
    for device in view.devices:
        path = device.path + ("super_device_id",)
        if "super_device_id" not in device.fields:
            yield _problem(path, "required when super_pod_list is present")
            continue
        sdid = _number(device.fields["super_device_id"])
        server_id = server_ids[device.server].get("server_id")
        pod = membership.get(server_id) if isinstance(server_id, str) else None
        if sdid is None or pod is None:
            continue
        if (pod, sdid) in owner:
            yield _problem(path, f"{sdid} is already {format_path(owner[pod, sdid])} "
                                 f"in the same super pod (super_pod_list[{pod}])")
        else:
            owner[pod, sdid] = device.path


_SEMANTIC_CHECKS: tuple[Callable[[_TableView], Iterator[Problem]], ...] = (
    _check_server_count,
    _check_server_ids,
    _check_device_ids,
    _check_ranks,
    _check_device_ips,
    _check_other_addresses,
    _check_ports,
    _check_super_pods,
)
