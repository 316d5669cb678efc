"""Node 0's judgement of the hosts' cards (``launcher.cluster.card_health`` asks the cards themselves).

* At start-up: preflight's answers (``HostCheck.card_health``) refuse the job in one line
  naming each bad card (``node3 card 5: link DOWN (hccn_tool -i 5 -link -g)``), or, with
  ``--min-nodes``, leave the hosts out whose only fault is a card, if enough remain; a single
  node checks its own cards in-process (``check_here``). Hosts that lack the tools, or whose
  tools print what no rule reads, are named once (``skipped_note``); the binaries the checks
  ran are named once too (``tools_note``), so a plan says which ``npu-smi`` it trusted.
* Before a restart (``recheck_before_restart``): the host whose ranks failed waits, at most
  ``--card-free-timeout`` seconds, until no process holds its cards, then checks them again; a
  card still held or now bad leaves the host out (``--min-nodes``) or stops the job.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Callable, Mapping, Optional, Sequence, TextIO

from launcher.cluster.backends import Backend, HostfileBackend
from launcher.cluster.backends.ssh import ssh_argv
from launcher.cluster.card_health import FREE_POLL_S, CardProblem, CardReport, WaitStopped, check_cards
from launcher.cluster.preflight import HostCheck
from launcher.config.devices import DeviceKind, find_cards
from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan
from parallel.contract import JsonObject

RECHECK_SLACK_S = 30.0
"""Beyond ``--card-free-timeout``: the ssh connection and the checks themselves."""
RECHECK_END_S = 5.0
"""How long the ssh client of a re-check given up has to end once its input is closed."""


def refusal(bad: Sequence[tuple[str, CardProblem]]) -> str:
    """The one line that refuses a job for its bad cards."""
    return "; ".join(problem.describe(host) for host, problem in bad) + ": nothing was started"


def skipped_note(reports: Mapping[str, Optional[CardReport]]) -> Optional[str]:
    """One line naming the hosts that skipped checks, and which; None when none did."""
    by_what: dict[tuple[str, ...], list[str]] = {}
    for host, report in reports.items():
        if report is not None and report.skipped:
            by_what.setdefault(report.skipped, []).append(host)
    if not by_what:
        return None
    parts = [f"{', '.join(hosts)} ({'; '.join(what)})" for what, hosts in by_what.items()]
    return f"npu-launch: card checks skipped on {'; '.join(parts)}"


def tools_note(reports: Mapping[str, Optional[CardReport]]) -> Optional[str]:
    """One line naming the tool binaries the hosts' card checks ran, hosts with the same ones
    together; None when no check ran a tool."""
    by_tools: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for host, report in reports.items():
        if report is not None and report.tools:
            by_tools.setdefault(tuple(sorted(report.tools.items())), []).append(host)
    if not by_tools:
        return None
    parts = [f"{', '.join(hosts)} ({', '.join(path for _, path in tools)})"
             for tools, hosts in by_tools.items()]
    return f"npu-launch: card checks ran {'; '.join(parts)}"


@dataclasses.dataclass(frozen=True)
class StartCards:
    """Preflight's card verdict: the hosts to leave out, and what to say."""

    left_out: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def judge_at_start(checks: Sequence[HostCheck], min_nodes: Optional[int]) -> StartCards:
    """What the hosts' card checks mean for the start: ``LaunchError`` (one line) when a card
    is bad and its host cannot be left out; else the hosts to leave out and the notes."""
    bad = [c for c in checks if c.only_cards_bad]
    others_fail = any(not c.ok and not c.only_cards_bad for c in checks)
    reports = {c.host: c.card_health for c in checks}
    notes = tuple(n for n in (tools_note(reports), skipped_note(reports)) if n)
    if not bad or others_fail:  # other faults are told by preflight's table
        return StartCards((), notes)
    problems = [(c.host, p) for c in bad for p in c.bad_cards]
    remain = len(checks) - len(bad)
    if min_nodes is None or remain < min_nodes:
        why = "" if min_nodes is None else f" (--min-nodes {min_nodes}: {remain} host(s) left)"
        raise LaunchError(refusal(problems) + why)
    gone = tuple(c.host for c in bad)
    said = "; ".join(p.describe(h) for h, p in problems)
    return StartCards(gone, notes + (f"npu-launch: leaving {', '.join(gone)} out at start-up: "
                                     f"{said}; {remain} host(s) go on (--min-nodes {min_nodes})",))


def physical_cards(plan: LaunchPlan, host: str,
                   here: Optional[Mapping[str, str]] = None) -> tuple[int, ...]:
    """The physical ids of the cards ``plan``'s ranks use on ``host`` (none on CPU). A node
    started here (``here``: its environment) maps its logical ids through
    ``ASCEND_RT_VISIBLE_DEVICES``; a hostfile's ids are physical already."""
    if plan.device is not DeviceKind.NPU:
        return ()
    ids = [s.device_id for s in plan.ranks if s.host == host and s.device_id is not None]
    by_logical = {c.logical: c.physical for c in find_cards(here)} if here is not None else {}
    return tuple(by_logical.get(i, i) for i in ids)


def check_here(plan: LaunchPlan, node_rank: int, environ: Mapping[str, str],
               notes: TextIO) -> None:
    """A single node's own cards, before anything starts: ``LaunchError`` naming each bad one."""
    specs = [s for s in plan.on_node(node_rank) if s.rank is not None]
    if plan.device is not DeviceKind.NPU or not specs:
        return
    host = specs[0].host
    report = check_cards(physical_cards(plan, host, environ), environ)
    if report.problems:
        raise LaunchError(refusal([(host, p) for p in report.problems]))
    for note in (tools_note({host: report}), skipped_note({host: report})):
        if note:
            notes.write(note + "\n")


@dataclasses.dataclass(frozen=True)
class BadCards:
    """A host whose cards are not fit for the next attempt."""

    host: str
    problems: tuple[CardProblem, ...]

    @property
    def why(self) -> str:
        """Every bad card, in one line (the restart decision's ``CardVerdict.why``)."""
        return "; ".join(p.describe(self.host) for p in self.problems)


def recheck_before_restart(plan: LaunchPlan, backend: Optional[Backend],
                           failed_host: Optional[str], free_within: float,
                           environ: Mapping[str, str], err: TextIO,
                           stopped: Callable[[], bool] = lambda: False) -> Optional[BadCards]:
    """Wait (at most ``free_within`` s) until no process holds ``failed_host``'s cards, then
    check them again there: over ssh for a hostfile job, in-process for one node. None: fit
    (or not checkable: a CPU job, a Slurm job, no host to blame), or given up because
    ``stopped`` said so (a stop signal: the caller ends the job)."""
    here = environ if backend is None else None
    cards = physical_cards(plan, failed_host, here) if failed_host else ()
    if not cards or failed_host is None:
        return None
    err.write(f"npu-launch: checking {failed_host}'s card(s) {', '.join(map(str, cards))} "
              f"before the restart (waiting up to {free_within:g} s for them to be free)\n")
    try:
        if backend is None:
            report: Optional[CardReport] = check_cards(cards, environ, free_within, stopped)
        elif isinstance(backend, HostfileBackend):
            report = _remote_report(plan, backend, failed_host, cards, free_within, stopped)
        else:
            return None
    except WaitStopped:
        return None
    if report is None:
        return BadCards(failed_host, (CardProblem(cards[0], "no answer", "launcher.cluster.probe"),))
    return BadCards(failed_host, report.problems) if report.problems else None


def _remote_report(plan: LaunchPlan, backend: HostfileBackend, host: str, cards: Sequence[int],
                   free_within: float, stopped: Callable[[], bool]) -> Optional[CardReport]:
    """The probe's answer over ssh; its standard input stays open while it waits, and closing
    it (``stopped``) ends the probe there: ``WaitStopped``."""
    selection = next((h for h in backend.hosts() if h.host == host), None)
    if selection is None:
        return None
    remote = [sys.executable, "-m", "launcher.cluster.probe", "--check-cards",
              ",".join(map(str, cards)), "--wait-free", f"{free_within:g}"]
    argv = ssh_argv(host, selection.user, remote, plan.workdir, backend.options)
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as probe:
        deadline = time.monotonic() + free_within + RECHECK_SLACK_S
        while probe.poll() is None:
            if stopped() or time.monotonic() >= deadline:
                _end(probe)
                if stopped():
                    raise WaitStopped()
                return None
            time.sleep(FREE_POLL_S)
        out = probe.stdout.read() if probe.stdout else ""
    try:
        facts = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    answer = JsonObject.of(facts)
    return CardReport.from_json(answer.object("card_health")) if answer is not None else None


def _end(probe: subprocess.Popen) -> None:
    """Close the probe's standard input (its ssh sends the end, and the probe there ends), then
    end the ssh client if it does not end by itself."""
    if probe.stdin:
        probe.stdin.close()
    try:
        probe.wait(timeout=RECHECK_END_S)
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.wait()
