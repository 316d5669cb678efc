"""A rank range as text: ``0-2,4-7``, and the ranks of several hosts as ``a:0-1 b:2-3``. One fold,
used by the console, the attempt's notes, the stall judge, the diagnosis and the status line."""
from __future__ import annotations


def label(ranks: dict[int, str]) -> str:
    """``vm:0-3,5`` for one host, ``a:0-1 b:2-3`` across hosts (each host's ranks as runs)."""
    by_host: dict[str, list[int]] = {}
    for rank in sorted(ranks):
        by_host.setdefault(ranks[rank], []).append(rank)
    return " ".join(f"{host}:{runs_text(found)}" for host, found in by_host.items())


def runs_text(ranks: list[int], separator: str = ",") -> str:
    """Sorted ranks as runs: ``0-2,5``."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return separator.join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
