"""Check every host before a multi-node job starts, in parallel (``--fanout`` at once), and
print one table.

Each host runs ``launcher.cluster.probe`` over ssh, in the launch directory. A host fails when it is
unreachable, has no such Python, runs another npu-launch or MindSpore version than node 0 (this
host), has fewer cards than its slots (on NPU), shares its hostname with another host (MindSpore
needs them unique), or, for the first host, already has something on the master port. It also
fails when its launch directory is not node 0's: missing, or the files the job names
(``launch_files``: the script, and the arguments that are files in the launch directory) missing
or different by size or sha256. That last problem is the host's ``stale``, what
``--sync-workdir`` (``launcher.cluster.workdir_sync``) mends. Unless the job runs on CPU, each host
also checks the cards its slots name (``launcher.cluster.card_health``: health, HCCL link, network
health, device IP, no process holding them); a bad card is one of the host's ``bad_cards``.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shlex
import stat
import string
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from launcher.cluster import probe
from launcher.cluster.backends import TransportOptions
from launcher.cluster.backends.ssh import split_ssh_options, ssh_argv
from launcher.cluster.card_health import CardProblem, CardReport
from launcher.cluster.fanout import workers
from launcher.cluster.probe import FileFact, HostFacts
from launcher.config.devices import DeviceKind
from launcher.config.hostfile import HostSelection, path_shown
from launcher.limits import MAX_COMPARED_FILES, shown

PROBE_TIMEOUT = 30.0
_CD_FAILED = ": cd: "
"""How bash begins its complaint when the remote ``cd`` fails (dash says "can't cd")."""
_SHA_SHOWN = 12


@dataclasses.dataclass(frozen=True)
class HostCheck:
    """One host's probe answer (``facts``) and what is wrong with it (``problems``)."""

    host: str
    facts: Optional[HostFacts]
    problems: tuple[str, ...]
    stale: Optional[str] = None
    """Why this host's launch directory is not node 0's (no such directory, or files the job
    names missing or different), also one of ``problems``; None when it is the same, or the
    host could not be asked."""
    card_health: Optional[CardReport] = None
    """What the host said of its cards; None when they were not checked (a CPU job, a host
    without device nodes, or one that could not be asked)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_cards(self) -> tuple[CardProblem, ...]:
        return self.card_health.problems if self.card_health is not None else ()

    @property
    def only_cards_bad(self) -> bool:
        """Every problem of this host is one of its cards (it could run, without them)."""
        return bool(self.bad_cards) and len(self.problems) == len(self.bad_cards)

    def assuming_copied(self) -> "HostCheck":
        """This check as it would be once the launch directory is copied here (``--dry-run``)."""
        return dataclasses.replace(self, stale=None,
                                   problems=tuple(p for p in self.problems if p != self.stale))


@dataclasses.dataclass(frozen=True)
class _Answer:
    facts: Optional[HostFacts]
    error: str = ""
    no_workdir: bool = False


def launch_files(workdir: str, script: str, script_args: Sequence[str]) -> tuple[str, ...]:
    """The files a job names, as preflight compares them across hosts: the script (its
    ``__main__.py`` for a directory), then each argument that names a regular file of at most
    ``probe.MAX_HASHED_BYTES`` inside the launch directory here, ``MAX_COMPARED_FILES`` in
    all. A path inside the launch directory is given relative to it, as the probe reads it."""
    script_path = os.path.normpath(os.path.join(workdir, script))
    if os.path.isdir(script_path):
        script_path = os.path.join(script_path, "__main__.py")
    found = [_as_named(workdir, script_path)]
    for arg in script_args:
        if len(found) >= MAX_COMPARED_FILES:
            break
        path = os.path.normpath(os.path.join(workdir, arg))
        if _inside(workdir, path) and _small_file(path) and _as_named(workdir, path) not in found:
            found.append(_as_named(workdir, path))
    return tuple(found)


def _inside(workdir: str, path: str) -> bool:
    return path != workdir and os.path.commonpath([workdir, path]) == workdir


def _as_named(workdir: str, path: str) -> str:
    return os.path.relpath(path, workdir) if _inside(workdir, path) else path


def _small_file(path: str) -> bool:
    try:
        info = os.stat(path)
    except (OSError, ValueError):  # e.g. an argument longer than a file name may be
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size <= probe.MAX_HASHED_BYTES


def run_preflight(hosts: Sequence[HostSelection], options: TransportOptions, workdir: str,
                  device: DeviceKind, master_port: Optional[int],
                  files: Sequence[str] = (), cards_used: Optional[int] = None) -> list[HostCheck]:
    """Probe every host, at most ``options.fanout`` at once; then judge each against this host
    and the others, ``files`` (relative to ``workdir``, see ``launch_files``) by their size and
    sha256 here. Unless ``device`` is CPU, the first ``cards_used`` cards of each host's slots
    (all of them: None) are checked there.

    A bad ``--ssh-option`` raises ``ConfigError`` here, before any host is asked."""
    split_ssh_options(options.ssh_options)

    def ask(index_host: tuple[int, HostSelection]) -> _Answer:
        index, host = index_host
        port = master_port if index == 0 else None
        cards = () if device is DeviceKind.CPU else host.cards[:cards_used]
        return _probe(host, options, workdir, port, files, cards)

    with concurrent.futures.ThreadPoolExecutor(workers(options.fanout, len(hosts))) as pool:
        answers = list(pool.map(ask, enumerate(hosts)))
    local = HostFacts.from_json(probe.report(None)) or HostFacts()
    ours = probe.file_facts(files, workdir)
    names = [str(a.facts.hostname) for a in answers if a.facts]
    return [_check(h, answer, local, ours, names, device, i == 0 and master_port is not None)
            for i, (h, answer) in enumerate(zip(hosts, answers))]


def _probe(host: HostSelection, options: TransportOptions, workdir: str,
           port: Optional[int], files: Sequence[str], cards: Sequence[int] = ()) -> _Answer:
    remote = [sys.executable, "-m", "launcher.cluster.probe"] + (["--port", str(port)] if port else [])
    remote += [f"--file={path}" for path in files]  # one word each: a name may start with '-'
    remote += ["--check-cards", ",".join(map(str, cards))] if cards else []
    if options.masters is not None:  # the one handshake with this host, kept for its agent
        first = options.masters.open(host.host, host.user, options.ssh_port, options.ssh_options,
                                     f"cd -- {shlex.quote(workdir)} && {shlex.join(remote)}",
                                     PROBE_TIMEOUT)
        if first is not None:
            return _judge(first.returncode, first.stdout, first.stderr, workdir)
    argv = ssh_argv(host.host, host.user, remote, workdir, options)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return _Answer(None, f"no answer in {PROBE_TIMEOUT:g} s")
    return _judge(out.returncode, out.stdout, out.stderr, workdir)


def _judge(returncode: Optional[int], stdout: str, stderr: str, workdir: str) -> _Answer:
    """The probe's answer from its exit status and output (None: it gave none in time)."""
    if returncode is None:
        return _Answer(None, f"no answer in {PROBE_TIMEOUT:g} s")
    if returncode == 255:
        return _Answer(None, "unreachable: " + _last_line(stderr))
    if _CD_FAILED in stderr or "can't cd" in stderr:
        return _Answer(None, f"no directory {path_shown(workdir)} there", no_workdir=True)
    if returncode == 127:  # the remote shell found no such command
        return _Answer(None, f"no {sys.executable} there")
    if returncode != 0:
        said = _last_line(stderr) or _last_line(stdout)
        return _Answer(None, f"probe failed ({returncode})" + (f": {said}" if said
                                                              else " and said nothing"))
    return _facts(stdout)


def _facts(stdout: str) -> _Answer:
    try:
        facts = HostFacts.from_json(json.loads(stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError, RecursionError):
        facts = None
    if facts is None:
        return _Answer(None, f"probe answered nonsense: {shown(_last_line(stdout))}")
    return _Answer(facts)


def _check(host: HostSelection, answer: _Answer, local: HostFacts, ours: Mapping[str, FileFact],
           names: list[str], device: DeviceKind, check_port: bool) -> HostCheck:
    if answer.facts is None:
        return HostCheck(host.host, None, (answer.error,),
                         answer.error if answer.no_workdir else None)
    problems = _problems(host, answer.facts, local, names, device, check_port)
    stale = files_problem(ours, answer.facts.files)
    health = answer.facts.card_health
    cards = tuple(f"card {p.card}: {p.problem} ({p.source})" for p in
                  (health.problems if health else ()))
    return HostCheck(host.host, answer.facts,
                     tuple(problems) + ((stale,) if stale else ()) + cards, stale, health)


def _problems(host: HostSelection, facts: HostFacts, local: HostFacts, names: list[str],
              device: DeviceKind, check_port: bool) -> list[str]:
    problems = []
    for what, theirs, ours in (("npu-launch", facts.npu_launch, local.npu_launch),
                               ("MindSpore", facts.mindspore, local.mindspore)):
        if theirs != ours:
            problems.append(f"{what} {theirs} here, {ours} on node 0")
    if device is DeviceKind.NPU and facts.cards < len(host.cards):
        problems.append(f"{facts.cards} card(s) for {len(host.cards)} slot(s)")
    if names.count(str(facts.hostname)) > 1:
        problems.append(f"hostname {facts.hostname} is not unique")
    if check_port and facts.port_free is False:
        problems.append("master port in use")
    return problems


def files_problem(ours: Mapping[str, FileFact], theirs: Mapping[str, FileFact]) -> Optional[str]:
    """One problem naming every file of ``ours`` (node 0's) that is missing or differs in
    ``theirs`` (a host's), or None when all are the same. Sizes are compared first; the
    sha256 of a file over ``probe.MAX_HASHED_BYTES`` is not known, its size alone decides."""
    unknown = FileFact(problem="not reported")
    parts = [_difference(path, fact, theirs.get(path, unknown)) for path, fact in ours.items()
             if fact.problem is None]  # what node 0 cannot read it cannot compare
    return ", ".join(part for part in parts if part) or None


def _difference(path: str, ours: FileFact, theirs: FileFact) -> Optional[str]:
    name = path_shown(path)
    if theirs.problem is not None:
        return f"{name} is {theirs.problem}"
    if theirs.size != ours.size:
        return f"{name} differs from node 0's (size {theirs.size} vs {ours.size} bytes)"
    if theirs.sha256 != ours.sha256:
        return (f"{name} differs from node 0's (sha256 {_sha(theirs.sha256)} vs "
                f"{_sha(ours.sha256)})")
    return None


def _sha(digest: Optional[str]) -> str:
    head = (digest or "")[:_SHA_SHOWN]
    return head if head and all(c in string.hexdigits for c in head) else "unknown"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def card_column(health: Optional[CardReport]) -> str:
    """A host's card checks in the table: ``ok (2, 0.03 s)``, ``2 bad``, ``skipped ...``."""
    if health is None:
        return "-"
    said = f"{len(health.problems)} bad" if health.problems else \
        f"ok ({len(health.cards)}, {health.seconds:.2f} s)"
    return said + "".join(f"; skipped {what}" for what in health.skipped)


def render(checks: Sequence[HostCheck]) -> str:
    """The preflight table; its ``card checks`` column only when some host checked cards."""
    cards = any(check.card_health is not None for check in checks)
    rows = [("host", "hostname", "npu-launch", "mindspore", "cards") +
            (("card checks",) if cards else ()) + ("status",)]
    for check in checks:
        f = check.facts
        said = ("-",) * 4 if f is None else (str(f.hostname), str(f.npu_launch), str(f.mindspore), str(f.cards))
        rows.append((check.host, *said) +
                    ((card_column(check.card_health),) if cards else ()) +
                    ("ok" if check.ok else "FAIL: " + "; ".join(check.problems),))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                      for r in rows)
    return table + "".join(f"\n{line}" for line in _tool_lines(checks))


def _tool_lines(checks: Sequence[HostCheck]) -> list[str]:
    """``card tools: node1, node2: /usr/local/sbin/npu-smi, ...``: which binaries each host's
    card checks ran (hosts differ: a PATH, an image)."""
    by_tools: dict[tuple[str, ...], list[str]] = {}
    for check in checks:
        if check.card_health is not None and check.card_health.tools:
            paths = tuple(path for _, path in sorted(check.card_health.tools.items()))
            by_tools.setdefault(paths, []).append(check.host)
    return [f"card tools: {', '.join(hosts)}: {', '.join(paths)}" for paths, hosts in by_tools.items()]
