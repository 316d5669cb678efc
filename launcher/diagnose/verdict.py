"""From the faults found in each rank's logs to one diagnosis: the likely cause first, the
ranks that only suffered it after, and what to do.

The rank the launcher already blamed (the earliest failure, or the hang watch's stalled rank)
comes first when it has a fault of its own. A fault marked ``consequence`` (a peer's timeout)
never hides a cause: a rank whose own fault is known is the cause, whichever rank was blamed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from launcher.diagnose.scan import Hit
from launcher.ranks.ranges import runs_text


@dataclasses.dataclass(frozen=True)
class Finding:
    """What one rank's logs (or one file, for a log of no known rank) say went wrong."""

    rank: Optional[int]
    host: Optional[str]
    hit: Hit
    consequence_of: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        fault = self.hit.fault
        return {"rank": self.rank, "host": self.host, "id": fault.id, "code": fault.code,
                "cause": fault.cause, "fix": fault.fix, "evidence": self.hit.evidence,
                "consequence_of": self.consequence_of}


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Every finding, causes first (the blamed rank's before the others), then consequences."""

    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    files_read: int = 0

    @property
    def named(self) -> bool:
        return bool(self.findings)

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.findings]

    def block(self) -> list[str]:
        """The lines that end a failure block (none when nothing known matched)."""
        if not self.findings:
            return []
        causes = [f for f in self.findings if not f.hit.fault.consequence]
        after = [f for f in self.findings if f.hit.fault.consequence]
        head = causes[0] if causes else after[0]
        parts = [_group_text(group, head is group[0]) for group in _groups(causes)]
        if not causes:
            parts = ["no rank's own fault was found in the logs"]
        parts += [_group_text(group, False) for group in _groups(after)]
        fault = head.hit.fault
        return [f"npu-launch: likely cause: {'; '.join(parts)}. Fix: {fault.fix}",
                f"  why: {fault.cause}",
                f"  check: {'; '.join(fault.check)}",
                f"  see: {fault.link}"]


def decide(found: Sequence[tuple[Optional[int], Optional[str], Sequence[Hit]]],
           blamed: Optional[int] = None) -> Diagnosis:
    """The diagnosis from each rank's hits (rank ``None``: a file of no known rank, on its
    own). Each is represented by its first cause in the knowledge base's order, or its first
    consequence."""
    picks = {i: Finding(rank, host, _pick(hits)) for i, (rank, host, hits) in enumerate(found)
             if hits}
    if all(f.hit.fault.noise for f in picks.values()):
        return Diagnosis()  # only what healthy runs print too: nothing to name
    causes = sorted((f for f in picks.values() if not f.hit.fault.consequence),
                    key=lambda f: (f.rank != blamed, _order(f.rank)))
    culprit = causes[0].rank if causes else blamed
    after = [dataclasses.replace(f, consequence_of=culprit if culprit != f.rank else None)
             for f in sorted(picks.values(), key=lambda f: _order(f.rank))
             if f.hit.fault.consequence]
    return Diagnosis(tuple(causes + after))


def _pick(hits: Sequence[Hit]) -> Hit:
    own = [h for h in hits if not h.fault.consequence]
    return own[0] if own else hits[0]


def _order(rank: Optional[int]) -> int:
    return -1 if rank is None else rank


def _groups(findings: Sequence[Finding]) -> list[list[Finding]]:
    """Findings of the same fault together, in first-seen order."""
    groups: dict[str, list[Finding]] = {}
    for finding in findings:
        groups.setdefault(finding.hit.fault.id, []).append(finding)
    return list(groups.values())


def _group_text(group: Sequence[Finding], first: bool) -> str:
    fault = group[0].hit.fault
    ranks = sorted(f.rank for f in group if f.rank is not None)
    hosts = sorted({f.host for f in group if f.host})
    if ranks:
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {runs_text(ranks, ', ')}"
        if len(hosts) == 1:
            who += f" on {hosts[0]}"
    else:
        who = group[0].hit.evidence.rsplit(":", 1)[0]
    where = f", {group[0].hit.evidence}" if first or len(group) == 1 else ""
    return f"{who} {fault.title} ({fault.label}{where})"
