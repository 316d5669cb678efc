"""What preflight asks each host: ``python -m launcher.cluster.probe [--port P] [--file=PATH ...]``
prints one JSON line.

Runs on the remote host, in the launch directory, with the same Python node 0 uses; imports
nothing heavy (MindSpore's version comes from its installed metadata, not from importing it).
Each ``--file`` (relative to the launch directory, or absolute) is reported as a ``FileFact``:
its size and sha256, or why there is none. ``--check-cards 0,1`` adds the health of those cards
(``launcher.cluster.card_health``) when this host has device nodes; ``--wait-free S`` first waits up to
S seconds until no process holds them (before a restart). While it waits, the end of its standard
input ends it, with no answer: node 0 closes it (its ssh ends) when a stop signal ends the job.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import stat
import sys
import threading
from importlib import metadata
from typing import Any, Callable, Mapping, Optional, Sequence

from launcher import __version__
from launcher.cluster.card_health import CardReport, WaitStopped, check_cards
from launcher.config.devices import find_cards
from launcher.limits import MAX_HASHED_BYTES
from parallel.checkpoints.manifest import sha256_file
from parallel.contract import JsonObject

_PROBLEMS = ("missing", "not a regular file", "unreadable")


@dataclasses.dataclass(frozen=True)
class FileFact:
    """One named file as a host sees it: ``size`` and ``sha256`` (None when larger than
    ``MAX_HASHED_BYTES``), or ``problem`` (``missing``, ``not a regular file``, ``unreadable``)."""

    size: Optional[int] = None
    sha256: Optional[str] = None
    problem: Optional[str] = None

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, value: Any) -> "FileFact":
        """A probe's answer for one file; anything malformed is a problem, never an error."""
        fact = JsonObject.of(value)
        if fact is None:
            return cls(problem="not reported")
        if fact.given("problem"):
            problem = fact.text("problem")
            return cls(problem=problem if problem in _PROBLEMS else "not reported")
        size, digest = fact.whole("size"), fact.text("sha256")
        if size is None or (digest is None and fact.given("sha256")):
            return cls(problem="not reported")
        return cls(size, digest)


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What a host's probe said (``report``), typed where node 0 reads it (``from_json``)."""

    hostname: Optional[str] = None
    npu_launch: Optional[str] = None
    mindspore: Optional[str] = None
    """The versions installed there; None where there is none."""
    cards: int = 0
    port_free: Optional[bool] = None
    """Whether the master port was free there; None when it was not asked about."""
    files: Mapping[str, FileFact] = dataclasses.field(default_factory=dict)
    """The files the job names, as that host sees them (``FileFact``)."""
    card_health: Optional[CardReport] = None
    """What it said of its cards; None when they were not checked (or it said nonsense)."""

    @classmethod
    def from_json(cls, value: Any) -> "Optional[HostFacts]":
        """A probe's answer; None when it is not one: not an object, or what node 0 compares
        (the hostname, the versions, the cards) of another type."""
        facts = JsonObject.of(value)
        if facts is None:
            return None
        texts = {key: facts.text(key) for key in ("hostname", "npu_launch", "mindspore")}
        cards = facts.whole("cards") if facts.given("cards") else 0
        if cards is None or any(text is None and facts.given(key) for key, text in texts.items()):
            return None
        files = facts.object("files")
        return cls(**texts, cards=cards, port_free=facts.flag("port_free"),
                   files={str(path): FileFact.from_json(fact) for path, fact in files.record.items()}
                   if files is not None else {},
                   card_health=CardReport.from_json(facts.object("card_health")))


def file_fact(path: str) -> FileFact:
    """``path`` as this host sees it. Only a regular file is opened (a FIFO would block)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return FileFact(problem="missing")
    except OSError:
        return FileFact(problem="unreadable")
    if not stat.S_ISREG(info.st_mode):
        return FileFact(problem="not a regular file")
    if info.st_size > MAX_HASHED_BYTES:
        return FileFact(info.st_size)
    try:
        return FileFact(info.st_size, sha256_file(path))
    except OSError:
        return FileFact(problem="unreadable")


def file_facts(paths: Sequence[str], root: str) -> dict[str, FileFact]:
    """Each of ``paths`` (relative ones under ``root``) by the path as given."""
    return {path: file_fact(os.path.join(root, path)) for path in paths}


def report(port: Optional[int], files: Optional[Mapping[str, FileFact]] = None,
           cards: Sequence[int] = (), wait_free: float = 0.0,
           stopped: Callable[[], bool] = lambda: False) -> dict:
    """This host's facts, as node 0 compares them; ``card_health`` only when ``cards`` were
    asked about and this host has device nodes (a CPU host has nothing to check).
    ``WaitStopped`` when ``stopped`` says so while it waits for the cards."""
    found = find_cards(os.environ)
    health = check_cards(cards, os.environ, wait_free, stopped).to_json() if cards and found else None
    return {
        "hostname": socket.gethostname(),
        "npu_launch": __version__,
        "mindspore": _version("mindspore"),
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "cards": len(found),
        "card_health": health,
        "port_free": _port_free(port) if port else None,
        "files": {path: fact.to_json() for path, fact in (files or {}).items()},
    }


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m launcher.cluster.probe")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--file", dest="files", action="append", default=[],
                        help="a file to report (given as --file=PATH: a path may start with '-')")
    parser.add_argument("--check-cards", default="", help="card ids to check, e.g. 0,1")
    parser.add_argument("--wait-free", type=float, default=0.0,
                        help="seconds to wait until no process holds those cards")
    args = parser.parse_args()
    cards = [int(c) for c in args.check_cards.split(",") if c.strip()]
    try:
        print(json.dumps(report(args.port, file_facts(args.files, os.getcwd()), cards,
                                args.wait_free, _stdin_closed() if args.wait_free > 0 else lambda: False)))
    except WaitStopped:
        sys.exit(1)


def _stdin_closed() -> Callable[[], bool]:
    """Whether standard input has ended, read by a thread from now on."""
    closed = threading.Event()

    def read_to_the_end() -> None:
        while os.read(sys.stdin.fileno(), 4096):
            pass
        closed.set()

    threading.Thread(target=read_to_the_end, daemon=True).start()
    return closed.is_set


if __name__ == "__main__":
    main()
