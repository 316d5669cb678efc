"""Is each card a job will use fit to start on? Asked on the card's own host, from the
driver's tools as they print (formats and sources: ``tests/fixtures/ascend_tools/README.md``):

* ``npu-smi info``: the device table's ``Health`` cell of each NPU (``OK`` and ``Warning``
  pass; ``Alarm``, ``Critical`` or anything else fails), and its process table (a row
  ``| NPU  Chip | Process id | ...`` holds the card; ``No running processes found in NPU N``
  frees it);
* ``hccn_tool -i N -link -g``: ``link status: UP`` (anything else, e.g. ``DOWN``, fails);
* ``hccn_tool -i N -net_health -g``: ``net health status: Success`` (``Init``, no detection
  address set yet, passes too; ``Fault``, ``Detect ip set`` and the rest fail);
* ``hccn_tool -i N -ip -g``: an ``ipaddr:`` line (none: the card has no device IP, HCCL cannot
  use it);
* ``/proc/*/fd``: a process with ``<devfs>/davinciN`` open holds the card, whatever npu-smi
  says (a container's npu-smi may not see other containers' processes).

A host without ``npu-smi`` or ``hccn_tool`` (on ``PATH`` or in the driver's tool folder)
skips the checks that need it and says which (``CardReport.skipped``). ``npu-smi`` and each
card's ``hccn_tool`` calls run at once, every call bounded by ``TOOL_TIMEOUT_S``: a host's
checks take about as long as one card's three ``hccn_tool`` calls. Runs in
``launcher.cluster.probe`` on remote hosts, in-process on a single node.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from parallel import contract

TOOL_TIMEOUT_S = 3.0
ASCEND_TOOL_DIR = "/usr/local/Ascend/driver/tools"
"""Where the driver installs ``hccn_tool`` (and sometimes ``npu-smi``); often not on PATH."""
HEALTHY = ("OK", "Warning")
NET_HEALTHY = ("Success", "Init")
FREE_POLL_S = 0.2

_DEVICE_ROW = re.compile(r"^\|\s*(\d+)\s+([^|\s][^|]*?)\s*\|\s*([^|\s]+)\s*\|")
_PROCESS_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s*\|\s*([^|]*?)\s*\|")
_NO_PROCESS = re.compile(r"No running processes found in NPU\s+(\d+)")
_KEY_VALUE = re.compile(r"^\s*([^:]+?)\s*:\s*(.*?)\s*$")


@dataclasses.dataclass(frozen=True)
class CardProblem:
    """What one tool said is wrong with one card: ``link DOWN``, from ``source``
    (``hccn_tool -i 5 -link -g``)."""

    card: int
    problem: str
    source: str
    held: bool = False
    """The card is held by a process (it may be freed; the others stay)."""

    def describe(self, host: str) -> str:
        """``node3 card 5: link DOWN (hccn_tool -i 5 -link -g)``."""
        return f"{host} card {self.card}: {self.problem} ({self.source})"


@dataclasses.dataclass(frozen=True)
class CardReport:
    """One host's answer for the cards it was asked about."""

    cards: tuple[int, ...] = ()
    problems: tuple[CardProblem, ...] = ()
    skipped: tuple[str, ...] = ()
    """The checks not made, each with why (``link, network health, device IP: no hccn_tool``)."""
    ips: Mapping[int, str] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"cards": list(self.cards), "skipped": list(self.skipped),
                "ips": {str(k): v for k, v in self.ips.items()}, "seconds": self.seconds,
                "problems": [dataclasses.asdict(p) for p in self.problems]}

    @classmethod
    def from_json(cls, value: Any) -> Optional["CardReport"]:
        """A probe's answer; None when it is not one (an older probe, or nonsense)."""
        if not isinstance(value, dict):
            return None
        try:
            problems = tuple(CardProblem(int(p["card"]), str(p["problem"]), str(p["source"]),
                                         bool(p.get("held", False)))
                             for p in value.get("problems", ()))
            return cls(tuple(int(c) for c in value.get("cards", ())), problems,
                       tuple(str(s) for s in value.get("skipped", ())),
                       {int(k): str(v) for k, v in dict(value.get("ips", {})).items()},
                       float(value.get("seconds", 0.0)))
        except (KeyError, TypeError, ValueError):
            return None


def find_tool(name: str, environ: Mapping[str, str]) -> Optional[str]:
    """``name`` on ``PATH``, else in the driver's tool folder."""
    path = environ.get("PATH", os.defpath) + os.pathsep + ASCEND_TOOL_DIR
    return shutil.which(name, path=path)


def check_cards(cards: Sequence[int], environ: Mapping[str, str],
                free_within: float = 0.0) -> CardReport:
    """The health of ``cards`` (physical ids) on this host. With ``free_within`` > 0, first
    wait up to that many seconds until no process holds any of them (a restart's ranks
    would find them busy)."""
    started = time.monotonic()
    devfs = environ.get(contract.DEVFS, "/dev")
    if free_within > 0:
        wait_until_free(cards, devfs, free_within)
    npu_smi, hccn = find_tool("npu-smi", environ), find_tool("hccn_tool", environ)
    skipped = tuple(what for what, tool in (
        ("health and processes: no npu-smi", npu_smi),
        ("link, network health, device IP: no hccn_tool", hccn)) if tool is None)
    with concurrent.futures.ThreadPoolExecutor(1 + len(cards)) as pool:
        smi = pool.submit(_npu_smi_problems, npu_smi, cards, environ) if npu_smi else None
        per_card = [pool.submit(_hccn_card, hccn, card, environ) for card in cards] \
            if hccn else []
        holders = holders_of(cards, devfs)
        problems = list(smi.result()) if smi else []
        ips: dict[int, str] = {}
        for card, future in zip(cards, per_card):
            found, ip = future.result()
            problems += found
            if ip:
                ips[card] = ip
    problems += [CardProblem(card, f"held by pid {pid} ({name})", f"{devfs}/davinci{card}",
                             held=True) for card, pid, name in holders]
    return CardReport(tuple(cards), tuple(_unique(problems)), skipped, ips,
                      round(time.monotonic() - started, 3))


def _unique(problems: Sequence[CardProblem]) -> list[CardProblem]:
    """One problem of each kind per card: npu-smi and /proc may both see a holder."""
    seen: set[tuple[int, str]] = set()
    kept = []
    for p in sorted(problems, key=lambda p: (p.card, p.held)):
        key = (p.card, p.problem)
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return kept


def wait_until_free(cards: Sequence[int], devfs: str, timeout: float,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether no process holds any of ``cards`` within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while holders_of(cards, devfs):
        if time.monotonic() >= deadline:
            return False
        sleep(FREE_POLL_S)
    return True


def holders_of(cards: Sequence[int], devfs: str) -> list[tuple[int, int, str]]:
    """``(card, pid, command name)`` of every process (but this one) with one of ``cards``'
    device nodes open, from ``/proc/*/fd``. Processes this user may not look into are not
    seen (as ``fuser`` run by them would not)."""
    wanted = {os.path.join(devfs, f"davinci{card}"): card for card in cards}
    found = []
    for pid in _pids():
        for target in _open_files(pid):
            card = wanted.get(target)
            if card is not None:
                found.append((card, pid, _command_name(pid)))
                break
    return found


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit() and
                int(name) != os.getpid()]
    except OSError:
        return []


def _open_files(pid: int) -> list[str]:
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(os.path.join(fd_dir, name)))
        except OSError:
            continue
    return targets


def _command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _run(argv: list[str], environ: Mapping[str, str]) -> tuple[Optional[str], str]:
    """``(stdout, "")``, or ``(None, why)`` when the tool failed or did not answer."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False, env=dict(environ))
    except subprocess.TimeoutExpired:
        return None, f"no answer in {TOOL_TIMEOUT_S:g} s"
    except OSError as e:
        return None, e.strerror or str(e)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return None, f"failed ({done.returncode}){': ' + said[-1][:120] if said else ''}"
    return done.stdout, ""


def _npu_smi_problems(tool: str, cards: Sequence[int],
                      environ: Mapping[str, str]) -> list[CardProblem]:
    source = "npu-smi info"
    out, why = _run([tool, "info"], environ)
    if out is None:
        return [CardProblem(card, f"npu-smi {why}", source) for card in cards]
    health, processes, idle = parse_npu_smi_info(out)
    problems = []
    for card in cards:
        if card not in health:
            problems.append(CardProblem(card, "not listed", source))
        elif health[card] not in HEALTHY:
            problems.append(CardProblem(card, f"health {health[card]}", source))
        for pid, name in processes.get(card, ()):
            problems.append(CardProblem(card, f"held by pid {pid}{f' ({name})' if name else ''}",
                                        source, held=True))
        if card in health and card not in idle and not processes.get(card):
            problems.append(CardProblem(card, "process table unreadable", source))
    return problems


def parse_npu_smi_info(text: str) -> tuple[dict[int, str], dict[int, list[tuple[int, str]]],
                                           set[int]]:
    """From ``npu-smi info``: each NPU's health, the processes on each NPU (pid, name), and the
    NPUs said to run none. The device table comes before the process table; a device row is
    ``| ID  Name | Health | ...``, a process row ``| ID  Chip | PID | Name | Memory |``."""
    health: dict[int, str] = {}
    processes: dict[int, list[tuple[int, str]]] = {}
    idle: set[int] = set()
    in_processes = False
    for line in text.splitlines():
        if "Process id" in line:
            in_processes = True
            continue
        if in_processes:
            free = _NO_PROCESS.search(line)
            row = _PROCESS_ROW.match(line)
            if free:
                idle.add(int(free.group(1)))
            elif row:
                processes.setdefault(int(row.group(1)), []).append((int(row.group(3)),
                                                                    row.group(4)))
            continue
        device = _DEVICE_ROW.match(line)
        if device and not device.group(3)[:1].isdigit():  # the chip row has a Bus-Id there
            health[int(device.group(1))] = device.group(3)
    return health, processes, idle


def _hccn_card(tool: str, card: int,
               environ: Mapping[str, str]) -> tuple[list[CardProblem], Optional[str]]:
    problems = []
    link = _hccn_value(tool, card, "-link", "link status", environ)
    if link[0] != "UP":
        problems.append(CardProblem(card, f"link {link[0] or link[1]}", link[2]))
    health = _hccn_value(tool, card, "-net_health", "net health status", environ)
    if health[0] not in NET_HEALTHY:
        problems.append(CardProblem(card, f"net health {health[0] or health[1]}", health[2]))
    ip = _hccn_value(tool, card, "-ip", "ipaddr", environ)
    if not ip[0]:
        problems.append(CardProblem(card, f"no device IP{' (' + ip[1] + ')' if ip[1] else ''}",
                                    ip[2]))
    return problems, ip[0] or None


def _hccn_value(tool: str, card: int, option: str, key: str,
                environ: Mapping[str, str]) -> tuple[str, str, str]:
    """``(value of the key's line, why there is none, the command)`` of
    ``hccn_tool -i CARD OPTION -g``."""
    source = f"hccn_tool -i {card} {option} -g"
    out, why = _run([tool, "-i", str(card), option, "-g"], environ)
    if out is None:
        return "", why, source
    value = parse_key_value(out).get(key)
    return (value, "", source) if value else ("", f"no '{key}' line", source)


def parse_key_value(text: str) -> dict[str, str]:
    """``key: value`` lines (``link status: UP``, ``ipaddr:192.168.1.8``), keys lowered."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = _KEY_VALUE.match(line)
        if m:
            found.setdefault(m.group(1).lower(), m.group(2))
    return found
