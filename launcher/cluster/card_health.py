"""Is each card a job will use fit to start on? Asked on the card's own host, from the
driver's tools as they print (formats, generations and sources:
``tests/fixtures/ascend_tools/README.md``). A card is a device, its physical id (``davinciN``):

* ``npu-smi info``, read once into ``rank_tables.host_devices.HostDevices``: each device's
  ``Health`` cell (``OK`` and ``Warning`` pass; ``Alarm``, ``Critical`` or anything else
  fails; on Atlas A3 each die has its own), and the process table (a row ``| NPU  Chip |
  Process id | ...`` holds the die it names; ``No running processes found in NPU N`` frees
  its dies). Where the table alone does not name each die's device, ``npu-smi info -m``
  does;
* ``hccn_tool -i N -link -g``: ``link status: UP`` (anything else, e.g. ``DOWN``, fails);
* ``hccn_tool -i N -net_health -g``: ``net health status: Success`` (``Init``, no detection
  address set yet, passes too; ``Fault``, ``Detect ip set`` and the rest fail);
* ``hccn_tool -i N -ip -g``: an ``ipaddr:`` line (none: the card has no device IP, HCCL cannot
  use it);
* ``/proc/*/fd``: a process with ``<devfs>/davinciN`` open holds the card, whatever npu-smi
  says (a container's npu-smi may not see other containers' processes).

A tool is looked up on ``PATH``, then in ``/usr/local/sbin`` and the driver's tool folder
(``rank_tables.host_devices.find_tool``); the report names the binaries used
(``CardReport.tools``). A host without one skips the checks that need it and says which
(``CardReport.skipped``); so does output no rule reads (a new generation, a new npu-smi): one
note naming the tool, its version line and what was not understood. A card is refused only
for what was read. ``npu-smi`` and each card's ``hccn_tool`` calls run at once, every call
bounded by ``TOOL_TIMEOUT_S``. Runs in ``launcher.cluster.probe`` on remote hosts, in-process
on a single node.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import subprocess
import time
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from launcher.limits import whole_number
from parallel import contract
from parallel.contract import JsonObject
from rank_tables.host_devices import HostDevices, find_tool, parse_chip_map, parse_info

TOOL_TIMEOUT_S = 3.0
HEALTHY = ("OK", "Warning")
NET_HEALTHY = ("Success", "Init")
FREE_POLL_S = 0.2

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

    @classmethod
    def from_json(cls, value: Any) -> Optional["CardProblem"]:
        """One of a probe's ``problems``; None when it is not one."""
        problem = JsonObject.of(value)
        if problem is None:
            return None
        card, said, source = problem.whole("card"), problem.text("problem"), problem.text("source")
        held = problem.flag("held") if problem.given("held") else False
        if card is None or said is None or source is None or held is None:
            return None
        return cls(card, said, source, held)


@dataclasses.dataclass(frozen=True)
class CardReport:
    """One host's answer for the cards it was asked about."""

    cards: tuple[int, ...] = ()
    problems: tuple[CardProblem, ...] = ()
    skipped: tuple[str, ...] = ()
    """The checks not made, each with why (``link, network health, device IP: no hccn_tool``)."""
    ips: Mapping[int, str] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    tools: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The binaries the checks ran (``{"npu-smi": "/usr/local/sbin/npu-smi"}``)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"cards": list(self.cards), "skipped": list(self.skipped),
                "ips": {str(k): v for k, v in self.ips.items()}, "seconds": self.seconds,
                "tools": dict(self.tools),
                "problems": [dataclasses.asdict(p) for p in self.problems]}

    @classmethod
    def from_json(cls, value: Any) -> Optional["CardReport"]:
        """A probe's answer; None when it is not one (an older probe, or nonsense: a field, or
        an item of one, of another type). A field not given is its default."""
        report = JsonObject.of(value)
        if report is None:
            return None
        problems = _listed(report, "problems", CardProblem.from_json)
        cards = _listed(report, "cards", _whole)
        skipped = _listed(report, "skipped", _text)
        ips = _paired(report, "ips", whole_number)
        tools = _paired(report, "tools", _text)
        seconds = report.number("seconds") if report.given("seconds") else 0.0
        if problems is None or cards is None or skipped is None or ips is None or tools is None \
                or seconds is None:
            return None
        return cls(cards, problems, skipped, ips, seconds, tools)


T = TypeVar("T")
K = TypeVar("K")


def _listed(report: JsonObject, key: str, read: Callable[[Any], Optional[T]]) -> Optional[tuple[T, ...]]:
    """The items of list ``key``, each read by ``read``; () when not given, None when it or an
    item is not what it should be."""
    if not report.given(key):
        return ()
    items = report.items(key)
    found = [read(item) for item in items] if items is not None else [None]
    return tuple(item for item in found if item is not None) if None not in found else None


def _paired(report: JsonObject, key: str, read_key: Callable[[str], Optional[K]]
            ) -> Optional[dict[K, str]]:
    """The object ``key`` of strings, its keys read by ``read_key``; {} when not given, None
    when it, a key or a value is not what it should be."""
    if not report.given(key):
        return {}
    pairs = report.object(key)
    found = {read_key(name): _text(value) for name, value in pairs.record.items()} if pairs else {None: None}
    kept = {k: v for k, v in found.items() if k is not None and v is not None}
    return kept if len(kept) == len(found) == len(pairs.record if pairs else ()) else None


def _whole(value: Any) -> Optional[int]:
    return value if type(value) is int else None


def _text(value: Any) -> Optional[str]:
    return value if type(value) is str else None


class WaitStopped(Exception):
    """The wait for free cards was given up: the launcher got a stop signal meanwhile."""


def check_cards(cards: Sequence[int], environ: Mapping[str, str], free_within: float = 0.0,
                stopped: Callable[[], bool] = lambda: False) -> CardReport:
    """The health of ``cards`` (physical ids) on this host. With ``free_within`` > 0, first
    wait up to that many seconds until no process holds any of them (a restart's ranks
    would find them busy); ``WaitStopped`` as soon as ``stopped`` says so during that wait."""
    started = time.monotonic()
    devfs = environ.get(contract.DEVFS, "/dev")
    if free_within > 0 and not wait_until_free(cards, devfs, free_within, stopped=stopped) \
            and stopped():
        raise WaitStopped()
    npu_smi, hccn = find_tool("npu-smi", environ), find_tool("hccn_tool", environ)
    skipped = [what for what, tool in (
        ("health and processes: no npu-smi", npu_smi),
        ("link, network health, device IP: no hccn_tool", hccn)) if tool is None]
    with concurrent.futures.ThreadPoolExecutor(1 + len(cards)) as pool:
        smi = pool.submit(_npu_smi_problems, npu_smi, cards, environ) if npu_smi else None
        per_card = [pool.submit(_hccn_card, hccn, card, environ) for card in cards] \
            if hccn else []
        holders = holders_of(cards, devfs)
        problems, smi_skipped = smi.result() if smi else ([], [])
        skipped += smi_skipped
        ips: dict[int, str] = {}
        unread: list[tuple[str, int]] = []
        for card, future in zip(cards, per_card):
            found, ip, not_read = future.result()
            problems += found
            unread += [(what, card) for what in not_read]
            if ip:
                ips[card] = ip
    skipped += _unread_notes(unread)
    problems += [CardProblem(card, f"held by pid {pid} ({name})", f"{devfs}/davinci{card}",
                             held=True) for card, pid, name in holders]
    tools = {name: path for name, path in (("npu-smi", npu_smi), ("hccn_tool", hccn)) if path}
    return CardReport(tuple(cards), tuple(_unique(problems)), tuple(skipped), ips,
                      round(time.monotonic() - started, 3), tools)


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
                    sleep: Callable[[float], None] = time.sleep,
                    stopped: Callable[[], bool] = lambda: False) -> bool:
    """Whether no process holds any of ``cards`` within ``timeout`` seconds (polled); False as
    soon as ``stopped`` says so."""
    deadline = time.monotonic() + timeout
    while holders_of(cards, devfs):
        if time.monotonic() >= deadline or stopped():
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
                      environ: Mapping[str, str]) -> tuple[list[CardProblem], list[str]]:
    """The cards' problems that ``npu-smi info`` shows, and the checks skipped (its output
    not understood, or a card it says nothing of)."""
    source = "npu-smi info"
    out, why = _run([tool, "info"], environ)
    if out is None:
        return [CardProblem(card, f"npu-smi {why}", source) for card in cards], []
    host = read_host_devices(out, tool, environ)
    if not host.dies:
        return [], [f"health and processes: {tool} info ({host.described()}) not understood: "
                    f"{host.not_understood}"]
    problems = [p for card in cards for p in _device_problems(host, card, source)]
    skipped = [f"processes: {tool} info ({host.described()}) not understood: {host.not_understood}"] \
        if not host.read else []
    silent = [card for card in cards if card in host.dies and host.read and
              card not in host.idle and card not in host.processes]
    if silent:
        skipped.append(f"processes of card(s) {','.join(map(str, silent))}: "
                       f"npu-smi info ({host.described()}) lists none and says none run")
    return problems, skipped


def read_host_devices(info: str, tool: str, environ: Mapping[str, str]) -> HostDevices:
    """``npu-smi info`` read; ``npu-smi info -m`` asked too where the table alone does not
    name each die's device (several dies per NPU without a Phy-ID column)."""
    host = parse_info(info)
    if host.read or "npu-smi info -m" not in host.not_understood:
        return host
    chips, _ = _run([tool, "info", "-m"], environ)
    return parse_info(info, parse_chip_map(chips)) if chips else host


def _device_problems(host: HostDevices, card: int, source: str) -> list[CardProblem]:
    die = host.dies.get(card)
    if die is None:
        return [CardProblem(card, "not listed", source)]
    problems = [] if die.health in HEALTHY else [CardProblem(card, f"health {die.health}", source)]
    return problems + [CardProblem(card, f"held by pid {pid}{f' ({name})' if name else ''}", source,
                                   held=True) for pid, name in host.processes.get(card, ())]


def parse_npu_smi_info(text: str) -> tuple[dict[int, str], dict[int, list[tuple[int, str]]],
                                           set[int]]:
    """From ``npu-smi info``: each device's health, the processes on each device (pid, name),
    and the devices said to run none (``HostDevices`` as plain dicts)."""
    host = parse_info(text)
    return ({d: die.health for d, die in host.dies.items()},
            {d: list(p) for d, p in host.processes.items()}, set(host.idle))


def _hccn_card(tool: str, card: int, environ: Mapping[str, str]
               ) -> tuple[list[CardProblem], Optional[str], list[str]]:
    """The card's problems, its device IP, and the checks whose output no rule read."""
    problems, unread = [], []
    link = _hccn_value(tool, card, "-link", "link status", environ)
    if link.unread:
        unread.append(link.unread)
    elif link.value != "UP":
        problems.append(CardProblem(card, f"link {link.value or link.why}", link.source))
    health = _hccn_value(tool, card, "-net_health", "net health status", environ)
    if health.unread:
        unread.append(health.unread)
    elif health.value not in NET_HEALTHY:
        problems.append(CardProblem(card, f"net health {health.value or health.why}", health.source))
    ip = _hccn_value(tool, card, "-ip", "ipaddr", environ)
    if ip.unread:
        unread.append(ip.unread)
    elif not ip.value:
        problems.append(CardProblem(card, f"no device IP{' (' + ip.why + ')' if ip.why else ''}",
                                    ip.source))
    return problems, ip.value or None, unread


@dataclasses.dataclass(frozen=True)
class _HccnAnswer:
    value: str
    why: str
    source: str
    unread: str = ""
    """The tool answered (exit 0) with no line a rule reads: ``link: hccn_tool -link -g printed
    no 'link status:' line ('...')``; the check is skipped, not failed."""


def _hccn_value(tool: str, card: int, option: str, key: str,
                environ: Mapping[str, str]) -> _HccnAnswer:
    """The value of the key's line of ``hccn_tool -i CARD OPTION -g``, why there is none, or
    that its output was not understood."""
    source = f"hccn_tool -i {card} {option} -g"
    out, why = _run([tool, "-i", str(card), option, "-g"], environ)
    if out is None:
        return _HccnAnswer("", why, source)
    value = parse_key_value(out).get(key)
    if value:
        return _HccnAnswer(value, "", source)
    first = next((line.strip() for line in out.splitlines() if line.strip()), "nothing")
    return _HccnAnswer("", "", source, f"{_HCCN_CHECKS[option]}: {tool} -i N {option} -g printed no "
                                      f"'{key}:' line ({first[:60]!r})")


_HCCN_CHECKS = {"-link": "link", "-net_health": "network health", "-ip": "device IP"}


def _unread_notes(unread: Sequence[tuple[str, int]]) -> list[str]:
    """One note per check whose output was not understood, naming its cards."""
    cards: dict[str, list[int]] = {}
    for what, card in unread:
        cards.setdefault(what, []).append(card)
    return [f"{what} (card(s) {','.join(map(str, found))})" for what, found in cards.items()]


def parse_key_value(text: str) -> dict[str, str]:
    """``key: value`` lines (``link status: UP``, ``ipaddr:192.168.1.8``), keys lowered."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = _KEY_VALUE.match(line)
        if m:
            found.setdefault(m.group(1).lower(), m.group(2))
    return found
