"""The launch configuration: a frozen value built from options and an optional YAML file.

Building one never reads ``os.environ`` and never starts anything; it only checks that the values
make sense together and raises ``ConfigError`` (exit 2, one line) when they do not.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Iterable, Mapping, Optional

import yaml

from launcher import contract
from launcher.devices import DeviceKind
from launcher.errors import ConfigError
from parallel.config import ParallelConfig


@dataclasses.dataclass(frozen=True)
class ConsoleFilter:
    """Which ranks' lines reach the console: all (``ranks is None``), none, or a set."""

    ranks: Optional[frozenset[int]] = None

    @classmethod
    def parse(cls, text: str) -> "ConsoleFilter":
        text = text.strip().lower()
        if text in ("", "all"):
            return cls(None)
        if text == "none":
            return cls(frozenset())
        try:
            return cls(frozenset(int(part) for part in text.split(",")))
        except ValueError:
            raise ConfigError(f"--console {text}: expected 'all', 'none' or ranks like 0,3") \
                from None

    def shows(self, rank: Optional[int]) -> bool:
        return self.ranks is None or rank in self.ranks

    def __str__(self) -> str:
        if self.ranks is None:
            return "all"
        return ",".join(map(str, sorted(self.ranks))) or "none"


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Everything one launch needs, already checked. ``cards=None`` means every card found."""

    script: str
    script_args: tuple[str, ...] = ()
    cards: Optional[int] = None
    device: DeviceKind = DeviceKind.AUTO
    rank_table: Optional[str] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    log_dir: Optional[str] = None
    job_id: Optional[str] = None
    console: ConsoleFilter = ConsoleFilter()
    kill_timeout: float = 5.0
    startup_timeout: float = 300.0
    debug: bool = False
    dry_run: bool = False
    json: bool = False
    env: tuple[tuple[str, str], ...] = ()
    python: str = ""
    workdir: str = ""
    hostfile: Optional[str] = None
    include: Optional[str] = None
    exclude: Optional[str] = None
    nnodes: Optional[int] = None
    node_rank: Optional[int] = None
    launcher: str = "auto"
    ssh_port: Optional[int] = None
    ssh_options: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    preflight: bool = True
    server_id: Optional[str] = None
    hang_timeout: float = 0.0
    max_restarts: int = 0
    parallel: ParallelConfig = ParallelConfig()

    def __post_init__(self) -> None:
        if not self.script:
            raise ConfigError("no script given: npu-launch [OPTIONS] SCRIPT [ARGS]...")
        if not os.path.isfile(os.path.join(self.workdir, self.script)):
            raise ConfigError(f"script {self.script}: no such file")
        if self.cards is not None and self.cards < 1:
            raise ConfigError(f"--cards {self.cards}: must be at least 1")
        if self.debug and self.cards not in (None, 1):
            raise ConfigError(f"--debug runs one card; got --cards {self.cards}")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ConfigError(f"--master-port {self.master_port}: not a TCP port")
        if self.kill_timeout < 0:
            raise ConfigError(f"--kill-timeout {self.kill_timeout}: must not be negative")
        if self.startup_timeout < 0:
            raise ConfigError(f"--startup-timeout {self.startup_timeout}: must not be negative")
        if self.hang_timeout < 0:
            raise ConfigError(f"--hang-timeout {self.hang_timeout}: must not be negative")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts}: must not be negative")
        if self.json and not self.dry_run:
            raise ConfigError("--json goes with --dry-run")
        if self.nnodes is not None and self.nnodes < 1:
            raise ConfigError(f"--nnodes {self.nnodes}: must be at least 1")
        if self.node_rank is not None:
            self._check_manual_node()
        for key, _ in self.env:
            _check_env_name(key)

    def _check_manual_node(self) -> None:
        """``--node-rank`` starts this node's share of a job started by hand on every node."""
        if self.hostfile:
            raise ConfigError("--node-rank goes without --hostfile (node 0 starts the others)")
        if self.nnodes is None or not 0 <= self.node_rank < self.nnodes:  # type: ignore[operator]
            raise ConfigError(f"--node-rank {self.node_rank}: needs --nnodes N with "
                              "0 <= node rank < N")
        if not self.master_addr or self.master_port is None:
            raise ConfigError("--node-rank: every node needs the same --master-addr and "
                              "--master-port")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_env_name(key: str) -> None:
    if not _ENV_NAME.fullmatch(key):
        raise ConfigError(f"--env {key[:80]!r}: not a variable name (letters, digits, _; "
                          "not starting with a digit)")
    owner = contract.owner_of(key)
    if owner:
        raise ConfigError(f"--env {key}: npu-launch sets {key} in every rank itself ({owner})")


def parse_env_pairs(pairs: Iterable[str], option: str = "--env") -> tuple[tuple[str, str], ...]:
    """``K=V`` strings to pairs; the value may hold anything, including ``=``."""
    result = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"{option} {pair!r}: expected KEY=VALUE")
        result.append((key, value))
    return tuple(result)


@dataclasses.dataclass(frozen=True)
class FileSetting:
    """One key of a config file, with the line it stands on for error messages."""

    value: Any
    line: int


def read_config_file(path: str) -> dict[str, FileSetting]:
    """Read a YAML mapping of option names (``cards``, ``kill-timeout`` ...) to values.

    Keys may use ``-`` or ``_``; they come back with ``_``. Errors name ``path:line``.
    """
    text = _read_bounded(path)
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


CONFIG_MAX_BYTES = 1 << 20


def _read_bounded(path: str) -> str:
    """The file's text, refused past ``CONFIG_MAX_BYTES`` (``/dev/zero`` is a file too)."""
    try:
        with open(path, "rb") as f:
            data = f.read(CONFIG_MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"--config {path}: {e.strerror}") from None
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError(f"--config {path}: larger than {CONFIG_MAX_BYTES // 1024} KiB; a job "
                          "config is a page of options")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text") from None


def _refuse_aliases(path: str, text: str) -> None:
    """A job config has no use for YAML aliases, and an alias bomb ("billion laughs") expands
    to gigabytes: refuse every alias, before anything is built from the document."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"{path}:{event.start_mark.line + 1}: YAML alias *{event.anchor} "
                              "(aliases are not allowed in a job config; write the value out)")


def _settings_from_mapping(path: str, node: yaml.MappingNode) -> dict[str, FileSetting]:
    loader = yaml.SafeLoader("")
    settings: dict[str, FileSetting] = {}
    for key_node, value_node in node.value:
        key = str(key_node.value).replace("-", "_")
        line = key_node.start_mark.line + 1
        if key in settings:
            raise ConfigError(f"{path}:{line}: {key_node.value} given twice")
        settings[key] = FileSetting(loader.construct_object(value_node, deep=True), line)
    return settings


def check_known_keys(path: str, settings: Mapping[str, FileSetting],
                     known: Iterable[str]) -> None:
    """Refuse keys that are no option, naming the first by line."""
    allowed = set(known)
    for key, setting in sorted(settings.items(), key=lambda kv: kv[1].line):
        if key not in allowed:
            raise ConfigError(f"{path}:{setting.line}: unknown key '{key}'")
