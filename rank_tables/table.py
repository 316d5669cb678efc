"""The rank table as a value: ``RankTable`` and the entries it holds, read from and written to JSON.

``RankTable`` objects are built only from valid documents (``load_rank_table``,
``parse_rank_table``) or by the generators, which validate what they build. In memory every id
is an ``int``; ``to_json`` writes every value as a JSON string, as HCCL wants. Keys that this
package does not know (``container_ip``, ``hardware_type`` ... added by cluster tools) are kept
in ``extra`` and written back unchanged.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional, Union

from parallel.contract import shown
from rank_tables.bounded import MAX_RANK_TABLE_BYTES, UnreadableFile, display_name, parse_json, read_text
from rank_tables.errors import RankTableError
from rank_tables.validate import Problem, validate

Extra = tuple[tuple[str, Any], ...]

_DEVICE_KEYS = ("device_id", "super_device_id", "device_ip", "device_port", "backup_device_ip",
                "backup_device_port", "host_port", "rank_id")
_DEVICE_KEY_SET = frozenset(_DEVICE_KEYS)
_SERVER_KEYS = ("server_id", "host_ip", "device", "host_nic_ip")
_TABLE_KEYS = ("version", "server_count", "server_list", "super_pod_list", "status")
_SERVER_KEY_SET = frozenset(_SERVER_KEYS)
_TABLE_KEY_SET = frozenset(_TABLE_KEYS)


@dataclasses.dataclass(frozen=True)
class DeviceEntry:
    """One device (one rank). ``device_id`` is the physical id, N of ``/dev/davinciN``."""

    device_id: int
    device_ip: Optional[str]
    rank_id: int
    device_port: Optional[int] = None
    super_device_id: Optional[int] = None
    backup_device_ip: Optional[str] = None
    backup_device_port: Optional[int] = None
    host_port: Optional[int] = None
    extra: Extra = ()

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "DeviceEntry":
        """Build from a validated ``device`` object."""
        return cls(  # validated: every number is at most 12 ASCII digits
            device_id=int(doc["device_id"]),
            device_ip=doc.get("device_ip"),
            rank_id=int(doc["rank_id"]),
            device_port=_optional_int(doc.get("device_port")),
            super_device_id=_optional_int(doc.get("super_device_id")),
            backup_device_ip=doc.get("backup_device_ip"),
            backup_device_port=_optional_int(doc.get("backup_device_port")),
            host_port=_optional_int(doc.get("host_port")),
            extra=_extra(doc, _DEVICE_KEY_SET),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object, every value a string, fields absent when ``None``."""
        # Attribute reads in a tuple, not getattr per key: this runs once per rank (16k times).
        values = (self.device_id, self.super_device_id, self.device_ip, self.device_port, self.backup_device_ip,
                  self.backup_device_port, self.host_port, self.rank_id)
        doc = {k: v if type(v) is str else str(v) for k, v in zip(_DEVICE_KEYS, values) if v is not None}
        return doc | dict(self.extra) if self.extra else doc

    def with_rank(self, rank_id: int) -> "DeviceEntry":
        """The same device as rank ``rank_id`` (``dataclasses.replace`` is 5x slower per rank)."""
        return DeviceEntry(self.device_id, self.device_ip, rank_id, self.device_port, self.super_device_id,
                           self.backup_device_ip, self.backup_device_port, self.host_port, self.extra)


@dataclasses.dataclass(frozen=True)
class ServerEntry:
    """One server: its id (the host IP in MindSpore practice) and its devices in table order."""

    server_id: str
    devices: tuple[DeviceEntry, ...]
    host_ip: Optional[str] = None
    host_nic_ip: Optional[str] = None
    extra: Extra = ()

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "ServerEntry":
        """Build from a validated ``server_list`` item."""
        return cls(
            server_id=doc["server_id"],
            devices=tuple(DeviceEntry.from_json(d) for d in doc["device"]),
            host_ip=doc.get("host_ip"),
            host_nic_ip=doc.get("host_nic_ip"),
            extra=_extra(doc, _SERVER_KEY_SET),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object for ``server_list``."""
        values = {"server_id": self.server_id, "host_ip": self.host_ip,
                  "device": [d.to_json() for d in self.devices], "host_nic_ip": self.host_nic_ip}
        return _strings(values) | dict(self.extra)


@dataclasses.dataclass(frozen=True)
class SuperPod:
    """A v1.2 super pod and the ids of its servers."""

    super_pod_id: str
    server_ids: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON object for ``super_pod_list``."""
        return {"super_pod_id": self.super_pod_id, "server_list": [{"server_id": s} for s in self.server_ids]}


@dataclasses.dataclass(frozen=True)
class RankTable:
    """A whole rank table; ``servers`` in table order, which is also rank order."""

    version: str
    servers: tuple[ServerEntry, ...]
    super_pods: tuple[SuperPod, ...] = ()
    status: str = "completed"
    extra: Extra = ()

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "RankTable":
        """Build from a document that ``validate`` accepted (use ``parse_rank_table`` otherwise)."""
        pods = tuple(SuperPod(p["super_pod_id"], tuple(s["server_id"] for s in p["server_list"]))
                     for p in doc.get("super_pod_list", ()))
        return cls(version=doc["version"], servers=tuple(ServerEntry.from_json(s) for s in doc["server_list"]),
                   super_pods=pods, status=doc["status"], extra=_extra(doc, _TABLE_KEY_SET))

    @property
    def rank_count(self) -> int:
        """How many ranks (devices) the table holds: ``RANK_SIZE``."""
        return sum(len(s.devices) for s in self.servers)

    def server_ids(self) -> tuple[str, ...]:
        """The server ids in table order."""
        return tuple(s.server_id for s in self.servers)

    def server(self, server_id: str) -> ServerEntry:
        """The server named ``server_id``; ``RankTableError`` naming the known ones if absent."""
        for server in self.servers:
            if server.server_id == server_id:
                return server
        ids = self.server_ids()
        listed = ", ".join(ids[:8]) + (f", ... ({len(ids)} in all)" if len(ids) > 8 else "")
        raise RankTableError(f"server {shown(server_id)} is not in the rank table (it has: {listed})")

    def ranks_for_server(self, server_id: str) -> tuple[DeviceEntry, ...]:
        """The devices of ``server_id`` in rank order."""
        return tuple(sorted(self.server(server_id).devices, key=lambda d: d.rank_id))

    def to_json(self) -> dict[str, Any]:
        """The JSON document: every value a string, ``server_count`` matching the servers."""
        doc: dict[str, Any] = {"version": self.version, "server_count": str(len(self.servers)),
                               "server_list": [s.to_json() for s in self.servers]}
        if self.super_pods:
            doc["super_pod_list"] = [p.to_json() for p in self.super_pods]
        doc["status"] = self.status
        return doc | dict(self.extra)

    def dumps(self) -> str:
        """The table as text, indented like ``hccl_tools.py`` writes it, ending in a newline."""
        return json.dumps(self.to_json(), indent=4) + "\n"


def load_rank_table(path: Union[str, Path]) -> RankTable:
    """Read, parse and validate the rank table at ``path``.

    Raises ``RankTableError``, one line starting with the file name: for an unreadable file, one
    larger than ``MAX_RANK_TABLE_BYTES``, text that is not UTF-8 or not JSON (with line and
    column), JSON nested deeper than ``MAX_JSON_DEPTH`` or numbers that no table holds; and
    ``InvalidRankTable`` for a document with problems (``JSON.path: message`` each).
    """
    try:
        text = read_text(path, MAX_RANK_TABLE_BYTES, "rank table")
        doc = parse_json(text, display_name(path))
    except UnreadableFile as exc:
        raise RankTableError(exc.message) from None
    return parse_rank_table(doc, display_name(path))


def parse_rank_table(doc: Any, name: str) -> RankTable:
    """Validate a parsed document and build the table; ``name`` starts every error line."""
    problems = validate(doc)
    if problems:
        raise InvalidRankTable(name, problems)
    return RankTable.from_json(doc)


def check_table(table: RankTable, name: str) -> RankTable:
    """``table`` itself if its JSON is valid, else ``RankTableError`` (for tables built in code)."""
    problems = validate(table.to_json())
    if problems:
        raise InvalidRankTable(name, problems)
    return table


class InvalidRankTable(RankTableError):
    """A table with problems. The message is one line: the first problem, and how many more;
    ``lines`` holds every problem as ``name: JSON.path: message``."""

    def __init__(self, name: str, problems: list[Problem]) -> None:
        self.lines = tuple(describe_problems(name, problems).splitlines())
        more = len(problems) - 1
        super().__init__(self.lines[0] + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""))


def describe_problems(name: str, problems: list[Problem]) -> str:
    """One line per problem, each ``name: JSON.path: message``."""
    return "\n".join(f"{name}: {p}" for p in problems)


def _optional_int(value: Optional[str]) -> Optional[int]:
    # Validated: at most 12 ASCII digits (the schemas' "number").
    return None if value is None else int(value)


def _extra(doc: dict[str, Any], known: frozenset[str]) -> Extra:
    if doc.keys() <= known:
        return ()
    return tuple((k, v) for k, v in doc.items() if k not in known)


def _strings(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, (str, list)) else str(v)) for k, v in values.items() if v is not None}
