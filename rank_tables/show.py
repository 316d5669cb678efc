"""A rank table as a readable text table: one line per rank, in rank order."""
from __future__ import annotations

from typing import Sequence

from rank_tables.table import RankTable


def format_table(table: RankTable) -> str:
    """A summary line, then columns rank, server, device, device IP (and super pod ids for v1.2)."""
    pod_of = {server_id: pod.super_pod_id for pod in table.super_pods for server_id in pod.server_ids}
    header = ["rank", "server", "device", "device_ip"] + (["super_pod", "super_device"] if pod_of else [])
    ranked = []
    for server in table.servers:
        for device in server.devices:
            row = [str(device.rank_id), server.server_id, str(device.device_id), device.device_ip or "-"]
            if pod_of:
                row += [pod_of.get(server.server_id, "-"), _text(device.super_device_id)]
            ranked.append((device.rank_id, row))
    rows = [row for _, row in sorted(ranked, key=lambda pair: pair[0])]
    summary = (f"rank table v{table.version}: {len(table.servers)} server(s), {table.rank_count} rank(s)"
               + (f", {len(table.super_pods)} super pod(s)" if table.super_pods else ""))
    return "\n".join([summary, *_aligned([header, *rows])]) + "\n"


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
