"""DeepSpeed-format hostfiles and the ``--include`` / ``--exclude`` / ``--nnodes`` filters.

A hostfile lists one host per line::

    # rack 3
    node1 slots=8
    admin@node2 slots=8   # the login user for ssh is optional

Slots are the accelerator cards of the host, numbered ``0 .. slots-1``. The filters use
DeepSpeed's syntax: ``node1@node2:0,2`` names all cards of ``node1`` and cards 0 and 2 of
``node2``. A missing or empty hostfile is an error, never a silent fall-back to a local run.

Host and user names reach ssh, srun and mpirun command lines, so they are held to what DNS
and ``useradd`` allow: letters, digits, ``.``, ``_`` and ``-``, never a leading ``-`` (which
ssh would read as an option). Host names compare without case, as DNS does.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterable, Optional, Union

from launcher.errors import ConfigError, HostfileError
from launcher.limits import (
    MAX_FILE_BYTES,
    MAX_NODES,
    MAX_RANKS_PER_NODE,
    NotUtf8,
    read_at_most,
    shown,
    utf8_text,
    whole_number,
)

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*")
_DIGITS = re.compile(r"[0-9]+")
_SLOTS = re.compile(r"slots=(.*)")
MAX_HOST_CHARS = 253
"""DNS: a whole name (RFC 1035), and each dot-separated label at most ``MAX_LABEL_CHARS``."""
MAX_LABEL_CHARS = 63
MAX_USER_CHARS = 32
"""Login names: ``useradd`` and utmp (``UT_NAMESIZE``) stop at 32."""
MAX_PATH_SHOWN = 4096
NODE_SEP = "@"
CARD_LIST_START = ":"
CARD_SEP = ","
_KNOWN_SHOWN = 5


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
    """Read and check a hostfile; raise ``HostfileError`` (``path:line: ...``) on any fault.

    At most ``MAX_FILE_BYTES`` are read: ``/dev/zero`` or a runaway line is refused, not
    swallowed. A FIFO nobody writes to reads as empty instead of waiting for ever.
    """
    name = path_shown(path)
    try:
        data = read_at_most(str(path), MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise HostfileError(f"{name}: cannot read the hostfile: {_reason(exc)}") from None
    if len(data) > MAX_FILE_BYTES:
        raise HostfileError(f"{name}: larger than {MAX_FILE_BYTES // 1024 // 1024} MiB, the "
                            "most a hostfile may be (one short line per host)")
    try:
        text = utf8_text(data)
    except NotUtf8 as exc:
        raise HostfileError(f"{name}:{exc.line}: {exc}") from None
    return parse_hostfile(text, name)


def parse_hostfile(text: str, name: str) -> list[HostEntry]:
    """Parse hostfile ``text``; ``name`` starts every error message."""
    entries: list[HostEntry] = []
    seen: dict[str, HostEntry] = {}
    # Lines end at "\n" only: str.splitlines() also splits at \f, \x1c, U+2028 ..., and the
    # line numbers would then disagree with the user's editor.
    for number, raw in enumerate(text.split("\n"), start=1):
        entry = _parse_line(raw, name, number)
        if entry is None:
            continue
        key = entry.host.lower()
        if key in seen:
            first = seen[key]
            same = "" if first.host == entry.host else f" as {first.host!r}; names ignore case"
            raise HostfileError(f"{name}:{number}: duplicate host {entry.host!r} "
                                f"(first on line {first.line}{same})")
        if len(entries) == MAX_NODES:
            raise HostfileError(f"{name}:{number}: more than {MAX_NODES} hosts, the most a job "
                                "may have")
        seen[key] = entry
        entries.append(entry)
    if not entries:
        raise HostfileError(f"{name}: no hosts in the hostfile (expected lines like 'node1 slots=8')")
    return entries


def check_host_name(host: str) -> Optional[str]:
    """Why ``host`` cannot be a host name here, or None when it can.

    Also for names that come from elsewhere (a Slurm allocation)."""
    if host.startswith("-"):
        return f"host name {shown(host)} starts with '-' (ssh would read it as an option)"
    if not _HOST.fullmatch(host):
        return f"bad host name {shown(host)} (letters, digits, '.', '_', '-')"
    if len(host) > MAX_HOST_CHARS:
        return f"host name {shown(host)} is longer than {MAX_HOST_CHARS} characters (DNS)"
    labels = host.rstrip(".").split(".")
    if "" in labels:
        return f"bad host name {shown(host)} (an empty part between dots)"
    if any(len(label) > MAX_LABEL_CHARS for label in labels):
        return (f"host name {shown(host)} has a part longer than {MAX_LABEL_CHARS} "
                "characters (DNS)")
    return None


def path_shown(path: Union[str, Path]) -> str:
    """A file name as it starts a message: itself, unless it would break the one line."""
    text = str(path)
    return text if text.isprintable() and len(text) <= MAX_PATH_SHOWN else shown(text)


def _parse_line(raw: str, name: str, number: int) -> Optional[HostEntry]:
    tokens = raw.split("#", 1)[0].split()
    if not tokens:
        return None
    where = f"{name}:{number}: "
    if len(tokens) == 1:
        raise HostfileError(f"{where}missing 'slots=N' after {shown(tokens[0])}")
    if len(tokens) > 2:
        raise HostfileError(f"{where}unexpected {shown(' '.join(tokens[2:]))} "
                            "(expected '[user@]host slots=N')")
    user, host = _parse_destination(tokens[0], where)
    return HostEntry(host=host, slots=_parse_slots(tokens[1], where), user=user, line=number)


def _parse_destination(token: str, where: str) -> tuple[Optional[str], str]:
    user, _, host = token.rpartition("@")
    if "@" in token:
        _check_user(user, token, where)
    problem = check_host_name(host)
    if problem is not None:
        raise HostfileError(where + problem)
    return (user or None), host


def _check_user(user: str, token: str, where: str) -> None:
    if user.startswith("-"):
        raise HostfileError(f"{where}user name {shown(user)} starts with '-' "
                            "(ssh would read it as an option)")
    if not _USER.fullmatch(user):
        raise HostfileError(f"{where}bad user name {shown(user)} in {shown(token)} "
                            "(letters, digits, '.', '_', '-')")
    if len(user) > MAX_USER_CHARS:
        raise HostfileError(f"{where}user name {shown(user)} is longer than {MAX_USER_CHARS} "
                            "characters")


def _parse_slots(token: str, where: str) -> int:
    match = _SLOTS.fullmatch(token)
    if match is None:
        raise HostfileError(f"{where}expected 'slots=N', got {shown(token)}")
    value = match.group(1)
    slots = whole_number(value)
    if (slots is None and not _DIGITS.fullmatch(value)) or slots == 0:
        raise HostfileError(f"{where}slots must be a whole number of at least 1, "
                            f"got {shown(value)}")
    if slots is None or slots > MAX_RANKS_PER_NODE:
        raise HostfileError(f"{where}slots={_number_shown(value)}: "
                            f"at most {MAX_RANKS_PER_NODE} per host")
    return slots


def select_hosts(
    entries: Iterable[HostEntry],
    include: Optional[str] = None,
    exclude: Optional[str] = None,
    nnodes: Optional[int] = None,
) -> list[HostSelection]:
    """Apply ``include`` (keep only what it names), then ``exclude``, then keep the first ``nnodes``.

    Hosts keep hostfile order; a host left with no cards is dropped. Host names in the filters
    ignore case, as in the hostfile. Raises ``ConfigError`` naming the unknown host, the card
    out of range or the impossible ``nnodes``.
    """
    entries = list(entries)
    pool = {e.host: tuple(range(e.slots)) for e in entries}
    if include is not None:
        chosen = _parse_filter(include, "--include", entries)
        pool = {host: chosen[host] for host in pool if host in chosen}
    if exclude is not None:
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
    if not text.strip():  # given, and empty: not read as no filter
        raise ConfigError(f"{option}: empty (expected hosts and cards, e.g. node1:0,2@node2)")
    slots = {e.host: e.slots for e in entries}
    by_key = {e.host.lower(): e.host for e in entries}
    result: dict[str, tuple[int, ...]] = {}
    for spec in text.split(NODE_SEP):
        host, cards = _parse_node_spec(spec, option, slots, by_key)
        if host in result:
            raise ConfigError(f"{option} {shown(text)}: host {host!r} is named twice")
        result[host] = cards
    return result


def _parse_node_spec(spec: str, option: str, slots: dict[str, int],
                     by_key: dict[str, str]) -> tuple[str, tuple[int, ...]]:
    name, has_cards, card_text = spec.strip().partition(CARD_LIST_START)
    host = by_key.get(name.lower())
    if host is None:
        raise ConfigError(f"{option}: unknown host {shown(name)} (the hostfile has: "
                          f"{_known(list(slots))})")
    if not has_cards:
        return host, tuple(range(slots[host]))
    return host, _parse_cards(card_text, host, option, slots[host])


def _known(hosts: list[str]) -> str:
    if len(hosts) <= _KNOWN_SHOWN:
        return ", ".join(hosts)
    return f"{', '.join(hosts[:_KNOWN_SHOWN])}, ... ({len(hosts)} hosts)"


def _parse_cards(text: str, host: str, option: str, slots: int) -> tuple[int, ...]:
    cards: set[int] = set()
    for token in text.split(CARD_SEP):
        token = token.strip()
        card = whole_number(token)
        if card is None and not _DIGITS.fullmatch(token):
            raise ConfigError(f"{option}: bad card {shown(token)} for host {host!r} "
                              f"(expected e.g. {host}:0,2)")
        if card is None or card >= slots:
            raise ConfigError(f"{option}: card {_number_shown(token)} out of range for host "
                              f"{host!r} (slots={slots}: cards 0-{slots - 1})")
        if card in cards:
            raise ConfigError(f"{option}: card {card} is named twice for host {host!r}")
        cards.add(card)
    return tuple(sorted(cards))


def _number_shown(digits: str) -> str:
    return digits if len(digits) <= 20 else f"{digits[:12]}...({len(digits)} digits)"


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)
