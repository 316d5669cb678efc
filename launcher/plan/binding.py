"""Core and NUMA binding (``--bind-cores``, ``--bind-numa``): the CPU cores each rank runs on.

Where the cores are found. The plan carries the *rule* on every rank (a ``Binding``: ``auto``
or a CPU list, NUMA or not, and the rank's physical card), and the *cores* are found on the host
the rank runs on, by the process that starts it: the launcher itself for the ranks of its own host
(a one-node job, or this node of a job started by hand on every node), while it builds the plan,
so ``--dry-run`` and ``plan.json`` show them; each node agent for its host's ranks, before it
starts any of them (``bind_node``). Hosts differ (a container's cpuset, how many cores, which
NUMA node sits next to which card, whether numactl is installed) and node 0 sees none of that: a
mapping it computed for another host could bind to cores that host does not allow. So node 0's
plan shows another host's rule, and that host's agent says in one line what it found (node 0
shows it as ``[host:agent]``). A restart starts from node 0's plan and finds them again.

``auto``. On Ascend, each card's CPU affinity as ``npu-smi info -t topo`` prints it (its last
column, ``CPU Affinity``; on a 910B server two cards share each NUMA node's cores). The range is
split evenly between all cards that report the same range, so two cards never get the same cores,
not even when two jobs on one host use one card each (``ASCEND_RT_VISIBLE_DEVICES``), and it is
kept within the cores this launcher may use. The topology's ``NPU<n>`` rows are matched to the
driver's ``davinci<n>`` through ``rank_tables.host_devices`` (the one model of a host's devices
the card checks and rank tables read too): ``n`` is a chip logic id, mapped to its physical id by
``npu-smi info -m`` (on A2 (910B) servers the same number; on Atlas A3, two dies per NPU, the
map says). ``npu-smi`` is looked up on ``PATH``, then ``/usr/local/sbin`` and the driver's tool
folder; the plan names the binary. Elsewhere (CPU ranks, no npu-smi, or an affinity outside
the allowed cores): the cores this process may use (``os.sched_getaffinity``: a container's
cpuset, or ``taskset`` around npu-launch) in contiguous blocks by local rank, as even as they
divide (the first blocks one core larger). With more ranks than cores, neighbouring ranks share
a core, as evenly as they divide, and the launcher says so. A list (``--bind-cores 0-15``) is
split the same way; every core in it must be allowed.

Applying it. A bound rank starts as ``taskset -c CORES ARGV`` (with ``--bind-numa``,
``numactl --physcpubind=CORES --membind=NODES ARGV``: its memory on the NUMA nodes of its cores),
as msrun's ``--bind_core`` does it; both exec the rank, so it keeps the pid the launcher started.
Every bound rank finds its cores in ``NPU_LAUNCH_CPUS`` (a CPU list) and, for scripts written for
msrun, in ``MSRUN_CPU_LIST`` as msrun writes it (a Python list, which
``mindspore.runtime.set_cpu_affinity`` reads), and its memory nodes in ``NPU_LAUNCH_NUMA_NODES``.
MindSpore's scheduler and the node agents are not bound.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from typing import Any, Mapping, Optional, Sequence

from launcher.config.cpu_list import AUTO, NUMA_OPTION, OPTION, format_cpu_list, parse_cpu_list, rule_of
from launcher.errors import ConfigError
from launcher.limits import shown
from parallel import contract
from rank_tables.host_devices import HostDevices, find_tool, parse_chip_map

_TOPO_TIMEOUT = 10.0
_SYS_NODES = "/sys/devices/system/node"


def split(cores: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """``cores`` in ``count`` contiguous blocks, as even as they divide (the first ones larger);
    with fewer cores than blocks, neighbouring blocks share one core each."""
    if len(cores) < count:
        return [(cores[i * len(cores) // count],) for i in range(count)]
    size, extra = divmod(len(cores), count)
    blocks, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        blocks.append(tuple(cores[start:end]))
        start = end
    return blocks


# A rank's binding --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Binding:
    """One rank's binding: the rule it was planned with and, once found on its host, its cores.

    ``cpus`` is empty until the cores are found on the rank's host (``bind_node``); ``mems`` are
    the NUMA nodes its memory is bound to (``--bind-numa``); ``how`` says where the cores came
    from; ``sharing`` is how many ranks share each of them (more ranks than cores)."""

    rule: str
    numa: bool = False
    card: Optional[int] = None
    """The physical card (``davinciN``) whose CPU affinity ``auto`` follows; None on CPU."""
    cpus: tuple[int, ...] = ()
    mems: tuple[int, ...] = ()
    how: str = ""
    sharing: int = 1

    @property
    def resolved(self) -> bool:
        return bool(self.cpus)

    def wrap(self, argv: Sequence[str]) -> tuple[str, ...]:
        """``argv`` started on these cores (and memory nodes)."""
        if not self.resolved:
            raise RuntimeError(f"a rank bound by {OPTION} {self.rule} was started before its "
                               "cores were found on its host")
        if self.numa:
            return ("numactl", f"--physcpubind={format_cpu_list(self.cpus)}",
                    f"--membind={format_cpu_list(self.mems)}", *argv)
        return ("taskset", "-c", format_cpu_list(self.cpus), *argv)

    def env(self) -> dict[str, str]:
        """What the rank is told of its binding."""
        told = {contract.CPUS: format_cpu_list(self.cpus),
                contract.MSRUN_CPU_LIST: str(list(self.cpus))}
        if self.numa:
            told[contract.NUMA_NODES] = format_cpu_list(self.mems)
        return told

    def describe(self, host: str) -> str:
        """One line for ``--dry-run``."""
        if not self.resolved:
            return f"cores {self.rule}: found on {host} before its ranks start there"
        shared = f", shared by {self.sharing} ranks" if self.sharing > 1 else ""
        memory = f", memory on NUMA node(s) {format_cpu_list(self.mems)}" if self.numa else ""
        return f"cores {format_cpu_list(self.cpus)} ({self.how}{shared}){memory}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Binding":
        """The inverse of ``dataclasses.asdict`` (the plan's JSON)."""
        return cls(rule=str(data["rule"]), numa=bool(data["numa"]),
                   card=None if data["card"] is None else int(data["card"]),
                   cpus=tuple(int(c) for c in data["cpus"]), mems=tuple(int(m) for m in data["mems"]),
                   how=str(data["how"]), sharing=int(data["sharing"]))


def planned(bind_cores: Optional[str], bind_numa: bool, card: Optional[int]) -> Optional[Binding]:
    """The binding a rank is planned with (None: not bound); its cores are found later."""
    rule = rule_of(bind_cores, bind_numa)
    return None if rule is None else Binding(rule, bind_numa, card)


# What a host offers ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HostCores:
    """What this host lets the ranks use, as read here: the allowed cores, each card's CPU
    affinity (``npu-smi info -t topo``; empty, with ``topo_note`` saying why, when there is none),
    the NUMA nodes' cores and the memory nodes allowed, and which of taskset/numactl exist."""

    allowed: tuple[int, ...]
    affinity: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    topo_note: str = ""
    nodes: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    mems_allowed: tuple[int, ...] = ()
    tools: frozenset[str] = frozenset()
    topo_tool: str = "npu-smi"
    """The ``npu-smi`` binary the affinity came from (the plan names it)."""

    @classmethod
    def here(cls, with_topo: bool) -> "HostCores":
        """This host, as this process sees it; ``npu-smi`` is asked only ``with_topo``."""
        tool = find_tool("npu-smi", os.environ) if with_topo else None
        affinity, note = card_affinity(tool) if with_topo else ({}, "")
        return cls(tuple(sorted(os.sched_getaffinity(0))), affinity, note, numa_nodes(),
                   mems_allowed(), frozenset(t for t in ("taskset", "numactl") if shutil.which(t)),
                   tool or "npu-smi")


def read_topo(text: str) -> dict[int, tuple[int, ...]]:
    """``npu-smi info -t topo``'s ``CPU Affinity`` column: ``{n: cores}`` for each ``NPU<n>``
    row whose last field is a CPU list (the header, the legend and ``NA`` are skipped)."""
    affinity = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or not re.fullmatch(r"NPU[0-9]{1,3}", fields[0]):
            continue
        try:
            cores = parse_cpu_list(fields[-1], "npu-smi info -t topo")
        except ConfigError:
            continue  # the header row ("... CPU Affinity"), or an affinity the driver left out
        affinity[int(fields[0][3:])] = cores
    return affinity


def card_affinity(tool: Optional[str]) -> tuple[dict[int, tuple[int, ...]], str]:
    """Each device's CPU affinity from ``TOOL info -t topo`` (its ``NPU<n>`` rows are logic
    ids, mapped to devices by ``TOOL info -m``), or nothing and why."""
    if tool is None:
        return {}, "no npu-smi on PATH, in /usr/local/sbin or in the driver's tool folder"
    out, why = _npu_smi(tool, "info", "-t", "topo")
    if out is None:
        return {}, why
    by_logic = read_topo(out)
    if not by_logic:
        return {}, f"{tool} info -t topo shows no CPU Affinity"
    chips, _ = _npu_smi(tool, "info", "-m")
    devices = HostDevices(dies=parse_chip_map(chips or ""))
    return {devices.device_of_logic(n): cores for n, cores in by_logic.items()}, ""


def _npu_smi(tool: str, *args: str) -> tuple[Optional[str], str]:
    """``(stdout, "")`` of ``tool args``, or ``(None, why)``."""
    what = " ".join((tool, *args))
    try:
        done = subprocess.run([tool, *args], capture_output=True, text=True, errors="replace",
                              timeout=_TOPO_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{what} failed ({type(e).__name__})"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
        return None, f"{what} failed: {shown(said)}"
    return done.stdout, ""


def numa_nodes(root: str = _SYS_NODES) -> dict[int, tuple[int, ...]]:
    """Each NUMA node's cores, from sysfs (empty where the kernel shows none)."""
    nodes = {}
    try:
        names = os.listdir(root)
    except OSError:
        return {}
    for name in names:
        if re.fullmatch(r"node[0-9]+", name):
            try:
                with open(os.path.join(root, name, "cpulist")) as f:
                    text = f.read().strip()
                nodes[int(name[4:])] = parse_cpu_list(text, name) if text else ()
            except (OSError, ConfigError):
                continue
    return nodes


def mems_allowed(status: str = "/proc/self/status") -> tuple[int, ...]:
    """The memory nodes this process may use (its cpuset's ``Mems_allowed_list``)."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("Mems_allowed_list:"):
                    return parse_cpu_list(line.split(":", 1)[1].strip(), "Mems_allowed_list")
    except (OSError, ConfigError):
        pass
    return ()


# Finding the cores -------------------------------------------------------------------------------

def resolve(bindings: Sequence[Binding], host: HostCores) -> list[Binding]:
    """One node's ranks' bindings (in local-rank order, planned with one rule) with their cores
    found on ``host``; a ``ConfigError`` when they cannot be (a core not allowed, numactl
    missing)."""
    rule, numa = bindings[0].rule, bindings[0].numa
    _require_tool(host, "numactl" if numa else "taskset", NUMA_OPTION if numa else OPTION)
    if rule == AUTO:
        blocks, hows = _auto(bindings, host)
    else:
        blocks, how = _listed(rule, len(bindings), host)
        hows = [how] * len(blocks)
    found = [dataclasses.replace(b, cpus=block, how=how, sharing=_sharing(block, blocks))
             for b, block, how in zip(bindings, blocks, hows)]
    if numa:
        found = [dataclasses.replace(b, mems=_memory_nodes(b.cpus, host)) for b in found]
    return found


def _require_tool(host: HostCores, tool: str, option: str) -> None:
    if tool not in host.tools:
        package = "numactl" if tool == "numactl" else "util-linux"
        raise ConfigError(f"{option}: {tool} is not installed on this host (the {package} "
                          f"package), so ranks cannot be bound; install it or leave {option} out")


def _listed(rule: str, count: int, host: HostCores) -> tuple[list[tuple[int, ...]], str]:
    cores = parse_cpu_list(rule)
    outside = sorted(set(cores) - set(host.allowed))
    if outside:
        raise ConfigError(f"{OPTION} {rule}: core(s) {format_cpu_list(outside)} are not among "
                          f"the cores this host allows ({format_cpu_list(host.allowed)})")
    return split(cores, count), f"{OPTION} {rule} split by local rank"


def _auto(bindings: Sequence[Binding],
          host: HostCores) -> tuple[list[tuple[int, ...]], list[str]]:
    """The cards' affinity when every rank has one within the allowed cores; else the allowed
    cores split, saying why. Each rank's cores, and how they were found."""
    count = len(bindings)
    allowed = f"this host's allowed cores {format_cpu_list(host.allowed)} split by local rank"
    cards = [b.card for b in bindings if b.card is not None]
    if len(cards) < count:
        return split(host.allowed, count), [allowed] * count
    if not host.affinity:
        return split(host.allowed, count), [f"{allowed}: {host.topo_note}"] * count
    shares, hows = [], []
    for card in cards:
        share, how = _card_share(card, host)
        if not share:
            return split(host.allowed, count), [f"{allowed}: {how}"] * count
        shares.append(share)
        hows.append(how)
    return shares, hows


def _card_share(card: int, host: HostCores) -> tuple[tuple[int, ...], str]:
    """The card's block of its affinity, split between every card that reports the same one,
    within the allowed cores, and how it was found; empty, and why, when there is none."""
    affinity = host.affinity.get(card)
    if affinity is None:
        return (), f"{host.topo_tool} info -t topo has no row for device {card}"
    peers = sorted(n for n, cores in host.affinity.items() if cores == affinity)
    block = split(affinity, len(peers))[peers.index(card)]
    usable = tuple(c for c in block if c in set(host.allowed))
    if not usable:
        return (), (f"card {card}'s share {format_cpu_list(block)} of its CPU affinity "
                    f"{format_cpu_list(affinity)} is outside them")
    return usable, (f"card {card}: its share of CPU affinity {format_cpu_list(affinity)}, "
                    f"which {len(peers)} card(s) report in {host.topo_tool} info -t topo")


def _sharing(block: tuple[int, ...], blocks: Sequence[tuple[int, ...]]) -> int:
    return sum(1 for other in blocks if set(other) & set(block))


def _memory_nodes(cpus: tuple[int, ...], host: HostCores) -> tuple[int, ...]:
    """The NUMA nodes holding ``cpus`` that this host lets the rank's memory use."""
    if not host.nodes:
        raise ConfigError(f"{NUMA_OPTION}: this host shows no NUMA nodes ({_SYS_NODES})")
    allowed = set(host.mems_allowed) or set(host.nodes)
    mems = tuple(sorted(n for n, cores in host.nodes.items()
                        if set(cores) & set(cpus) and n in allowed))
    if not mems:
        raise ConfigError(f"{NUMA_OPTION}: no NUMA node this host allows holds cores "
                          f"{format_cpu_list(cpus)}")
    return mems


def summary(ranks: Sequence[Optional[int]], found: Sequence[Binding]) -> str:
    """One line for a node: each rank's cores, how they were found, who shares them."""
    each = ", ".join(f"rank {r} -> {format_cpu_list(b.cpus)}" for r, b in zip(ranks, found))
    cores = len({c for b in found for c in b.cpus})
    shared = ""
    if len(found) > cores:
        most = max(b.sharing for b in found)
        shared = (f"; {len(found)} ranks on {cores} core(s): up to {most} ranks share each "
                  "core")
    memory = ""
    if found and found[0].numa:
        memory = "; memory on NUMA node(s): " + ", ".join(
            f"rank {r} -> {format_cpu_list(b.mems)}" for r, b in zip(ranks, found))
    hows = {b.how for b in found}
    how = hows.pop() if len(hows) == 1 else \
        "each card's share of its CPU affinity in npu-smi info -t topo"
    return f"cores: {each} ({how}{shared}){memory}"
