"""DeepSpeed-format hostfiles and the ``--include`` / ``--exclude`` / ``--nnodes`` filters.

A hostfile lists one host per line::

    # rack 3
    node1 slots=8
    admin@node2 slots=8   # the login user for ssh is optional

Slots are the accelerator cards of the host, numbered ``0 .. slots-1``. The filters use
DeepSpeed's syntax: ``node1@node2:0,2`` names all cards of ``node1`` and cards 0 and 2 of
``node2``. A missing or empty hostfile is an error, never a silent fall-back to a local run.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterable, Optional, Union

from launcher.errors import ConfigError, HostfileError

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*")
_SLOTS = re.compile(r"slots=(.*)")
NODE_SEP = "@"
CARD_LIST_START = ":"
CARD_SEP = ","


@dataclasses.dataclass(frozen=True)
class HostEntry:
    """One hostfile line: ``[user@]host slots=N``; ``line`` is 1-based."""

    host: str
    slots: int
    user: Optional[str]
    line: int


@dataclasses.dataclass(frozen=True)
class HostSelection:
    """A host chosen for the job and the cards (slot indices) used on it, ascending."""

    host: str
    user: Optional[str]
    cards: tuple[int, ...]


def read_hostfile(path: Union[str, Path]) -> list[HostEntry]:
    """Read and check a hostfile; raise ``HostfileError`` (``path:line: ...``) on any fault."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"{path}: cannot read the hostfile: {_reason(exc)}") from None
    return parse_hostfile(text, str(path))


def parse_hostfile(text: str, name: str) -> list[HostEntry]:
    """Parse hostfile ``text``; ``name`` starts every error message."""
    entries: list[HostEntry] = []
    seen: dict[str, HostEntry] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        entry = _parse_line(raw, name, number)
        if entry is None:
            continue
        if entry.host in seen:
            first = seen[entry.host].line
            raise HostfileError(f"{name}:{number}: duplicate host {entry.host!r} (first on line {first})")
        seen[entry.host] = entry
        entries.append(entry)
    if not entries:
        raise HostfileError(f"{name}: no hosts in the hostfile (expected lines like 'node1 slots=8')")
    return entries


def _parse_line(raw: str, name: str, number: int) -> Optional[HostEntry]:
    tokens = raw.split("#", 1)[0].split()
    if not tokens:
        return None
    where = f"{name}:{number}: "
    if len(tokens) == 1:
        raise HostfileError(f"{where}missing 'slots=N' after {tokens[0]!r}")
    if len(tokens) > 2:
        raise HostfileError(f"{where}unexpected {' '.join(tokens[2:])!r} (expected '[user@]host slots=N')")
    user, host = _parse_destination(tokens[0], where)
    return HostEntry(host=host, slots=_parse_slots(tokens[1], where), user=user, line=number)


def _parse_destination(token: str, where: str) -> tuple[Optional[str], str]:
    user, _, host = token.rpartition("@")
    if "@" in token and not _USER.fullmatch(user):
        raise HostfileError(f"{where}bad user name {user!r} in {token!r}")
    if not _HOST.fullmatch(host):
        raise HostfileError(f"{where}bad host name {host!r} (letters, digits, '.', '_', '-')")
    return (user or None), host


def _parse_slots(token: str, where: str) -> int:
    match = _SLOTS.fullmatch(token)
    if match is None:
        raise HostfileError(f"{where}expected 'slots=N', got {token!r}")
    value = match.group(1)
    if not value.isdigit() or int(value) < 1:
        raise HostfileError(f"{where}slots must be a whole number of at least 1, got {value!r}")
    return int(value)


def select_hosts(
    entries: Iterable[HostEntry],
    include: Optional[str] = None,
    exclude: Optional[str] = None,
    nnodes: Optional[int] = None,
) -> list[HostSelection]:
    """Apply ``include`` (keep only what it names), then ``exclude``, then keep the first ``nnodes``.

    Hosts keep hostfile order; a host left with no cards is dropped. Raises ``ConfigError``
    naming the unknown host, the card out of range or the impossible ``nnodes``.
    """
    entries = list(entries)
    pool = {e.host: tuple(range(e.slots)) for e in entries}
    if include:
        chosen = _parse_filter(include, "--include", entries)
        pool = {host: chosen[host] for host in pool if host in chosen}
    if exclude:
        removed = _parse_filter(exclude, "--exclude", entries)
        pool = {host: tuple(c for c in cards if c not in removed.get(host, ())) for host, cards in pool.items()}
    selections = [HostSelection(e.host, e.user, pool[e.host]) for e in entries if pool.get(e.host)]
    return _first_nodes(selections, nnodes)


def _first_nodes(selections: list[HostSelection], nnodes: Optional[int]) -> list[HostSelection]:
    if not selections:
        raise ConfigError("no hosts left after --include/--exclude")
    if nnodes is None:
        return selections
    if nnodes < 1 or nnodes > len(selections):
        raise ConfigError(f"--nnodes {nnodes}: must be between 1 and the {len(selections)} hosts available")
    return selections[:nnodes]


def _parse_filter(text: str, option: str, entries: list[HostEntry]) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME[:CARD[,CARD...]][@NAME...]`` into host -> cards (all cards when none given)."""
    slots = {e.host: e.slots for e in entries}
    result: dict[str, tuple[int, ...]] = {}
    for spec in text.split(NODE_SEP):
        host, cards = _parse_node_spec(spec, option, slots)
        if host in result:
            raise ConfigError(f"{option} {text!r}: host {host!r} is named twice")
        result[host] = cards
    return result


def _parse_node_spec(spec: str, option: str, slots: dict[str, int]) -> tuple[str, tuple[int, ...]]:
    host, has_cards, card_text = spec.strip().partition(CARD_LIST_START)
    if host not in slots:
        known = ", ".join(slots)
        raise ConfigError(f"{option}: unknown host {host!r} (the hostfile has: {known})")
    if not has_cards:
        return host, tuple(range(slots[host]))
    return host, _parse_cards(card_text, host, option, slots[host])


def _parse_cards(text: str, host: str, option: str, slots: int) -> tuple[int, ...]:
    cards: set[int] = set()
    for token in text.split(CARD_SEP):
        token = token.strip()
        if not token.isdigit():
            raise ConfigError(f"{option}: bad card {token!r} for host {host!r} (expected e.g. {host}:0,2)")
        if int(token) >= slots:
            raise ConfigError(f"{option}: card {token} out of range for host {host!r} "
                              f"(slots={slots}: cards 0-{slots - 1})")
        cards.add(int(token))
    return tuple(sorted(cards))


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)
