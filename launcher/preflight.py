"""Check every host before a multi-node job starts, in parallel, and print one table.

Each host runs ``launcher.probe`` over ssh. A host fails when it is unreachable, has no such
Python, runs another npu-launch or MindSpore version than node 0 (this host), has fewer cards
than its slots (on NPU), shares its hostname with another host (MindSpore needs them unique),
or, for the first host, already has something on the master port.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import subprocess
import sys
from typing import Optional, Sequence

from launcher import probe
from launcher.backends import TransportOptions
from launcher.backends.ssh import split_ssh_options, ssh_argv
from launcher.devices import DeviceKind
from launcher.hostfile import HostSelection, path_shown
from launcher.limits import shown

PROBE_TIMEOUT = 30.0
_CD_FAILED = ": cd: "
"""How bash begins its complaint when the remote ``cd`` fails (dash says "can't cd")."""


@dataclasses.dataclass(frozen=True)
class HostCheck:
    """One host's probe answer (``facts``) and what is wrong with it (``problems``)."""

    host: str
    facts: Optional[dict]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def run_preflight(hosts: Sequence[HostSelection], options: TransportOptions, workdir: str,
                  device: DeviceKind, master_port: Optional[int]) -> list[HostCheck]:
    """Probe every host at once; then judge each against this host and the others.

    A bad ``--ssh-option`` raises ``ConfigError`` here, before any host is asked."""
    split_ssh_options(options.ssh_options)

    def ask(index_host: tuple[int, HostSelection]) -> tuple[Optional[dict], str]:
        index, host = index_host
        port = master_port if index == 0 else None
        return _probe(host, options, workdir, port)

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(hosts) or 1)) as pool:
        answers = list(pool.map(ask, enumerate(hosts)))
    local = probe.report(None)
    names = [str(facts.get("hostname")) for facts, _ in answers if facts]
    return [HostCheck(h.host, facts, tuple(_problems(h, facts, error, local, names, device,
                                                      i == 0 and master_port is not None)))
            for i, (h, (facts, error)) in enumerate(zip(hosts, answers))]


def _probe(host: HostSelection, options: TransportOptions, workdir: str,
           port: Optional[int]) -> tuple[Optional[dict], str]:
    remote = [sys.executable, "-m", "launcher.probe"] + (["--port", str(port)] if port else [])
    argv = ssh_argv(host.host, host.user, remote, workdir, options)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"no answer in {PROBE_TIMEOUT:g} s"
    if out.returncode == 255:
        return None, "unreachable: " + _last_line(out.stderr)
    if _CD_FAILED in out.stderr or "can't cd" in out.stderr:
        return None, f"no directory {path_shown(workdir)} there"
    if out.returncode == 127:  # the remote shell found no such command
        return None, f"no {sys.executable} there"
    if out.returncode != 0:
        return None, f"probe failed ({out.returncode}): {_last_line(out.stderr)}"
    return _facts(out.stdout)


def _facts(stdout: str) -> tuple[Optional[dict], str]:
    try:
        facts = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        facts = None
    if not isinstance(facts, dict) or not isinstance(facts.get("cards", 0), int):
        return None, f"probe answered nonsense: {shown(_last_line(stdout))}"
    return facts, ""


def _problems(host: HostSelection, facts: Optional[dict], error: str, local: dict,
              names: list[str], device: DeviceKind, check_port: bool) -> list[str]:
    if facts is None:
        return [error]
    problems = []
    for key, what in (("npu_launch", "npu-launch"), ("mindspore", "MindSpore")):
        if facts.get(key) != local.get(key):
            problems.append(f"{what} {facts.get(key)} here, {local.get(key)} on node 0")
    if device is DeviceKind.NPU and facts.get("cards", 0) < len(host.cards):
        problems.append(f"{facts.get('cards')} card(s) for {len(host.cards)} slot(s)")
    if names.count(str(facts.get("hostname"))) > 1:
        problems.append(f"hostname {facts.get('hostname')} is not unique")
    if check_port and facts.get("port_free") is False:
        problems.append("master port in use")
    return problems


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def render(checks: Sequence[HostCheck]) -> str:
    """The preflight table."""
    rows = [("host", "hostname", "npu-launch", "mindspore", "cards", "status")]
    for check in checks:
        f = check.facts or {}
        rows.append((check.host, str(f.get("hostname", "-")), str(f.get("npu_launch", "-")),
                     str(f.get("mindspore", "-")), str(f.get("cards", "-")),
                     "ok" if check.ok else "FAIL: " + "; ".join(check.problems)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                     for r in rows)
