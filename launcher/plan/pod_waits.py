"""What a pod waits for before its ranks start (``launcher.plan.pods`` reads the pod).

Kubeflow's ``MASTER_ADDR`` is the master pod's service name, which resolves only once that pod
runs (``with_master_ip``); MindCluster's rank table reads ``"status": "initializing"`` until
every pod of the job is placed, then ``"completed"`` (``wait_for_rank_table``). Each wait is
bounded and says once what it waits for; a wait that runs out is a ``LaunchError`` and nothing
has started.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import socket
import time
from typing import Callable, Optional, TextIO

from launcher.config.launch_config import LaunchConfig
from launcher.errors import LaunchError
from launcher.limits import MAX_RANK_TABLE_BYTES, read_at_most, shown
from launcher.plan.pods import Pod

DEFAULT_RANK_TABLE_TIMEOUT = 300.0
"""Seconds to wait for ``"completed"`` (MindCluster's own start script polls 60 x 5 s)."""
COMPLETED = "completed"
_POLL = 1.0


def with_master_ip(pod: Pod, timeout: Optional[float], err: TextIO, poll: float = _POLL,
                   resolve: Callable[[str], str] = socket.gethostbyname,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Pod:
    """``pod`` with its scheduler's address as an IP: MindSpore's scheduler and workers take
    no name (2.10: "Parse ip failed"), and Kubeflow's ``MASTER_ADDR`` is the master pod's
    service name, which resolves only once that pod runs. ``timeout`` bounds the wait (0: no
    limit; None, for a dry run: asked once, and the name kept if it does not resolve)."""
    try:
        ipaddress.ip_address(pod.master_addr)
        return pod
    except ValueError:
        pass
    start, said = clock(), False
    while True:
        try:
            address = resolve(pod.master_addr)
            return dataclasses.replace(pod, master_addr=address, master_name=pod.master_addr)
        except OSError as e:
            problem = e.strerror or str(e)
        if timeout is None:
            return pod
        if timeout > 0 and clock() - start >= timeout:
            raise LaunchError(f"{pod.master_variable}={pod.master_addr}: the name does not "
                              f"resolve after {timeout:g} s ({problem}; --startup-timeout waits "
                              "longer): nothing was started")
        if not said:
            err.write(f"npu-launch: waiting for {pod.master_variable}={pod.master_addr} to "
                      f"resolve (the scheduler's pod may not run yet): {problem}\n")
            said = True
        sleep(poll)


@dataclasses.dataclass(frozen=True)
class TableStatus:
    """What the rank table reads now: ``completed``, or how it is not (for the messages)."""

    completed: bool
    said: str


def table_status(path: str) -> TableStatus:
    """The rank table's ``status``. A missing file, or one that is not JSON (the operator
    truncates it, then writes), is one still to come: it says so, and the wait goes on."""
    try:
        data = read_at_most(path, MAX_RANK_TABLE_BYTES + 1)
    except FileNotFoundError:
        return TableStatus(False, "missing")
    except OSError as e:
        return TableStatus(False, f"unreadable ({e.strerror})")
    if len(data) > MAX_RANK_TABLE_BYTES:
        return TableStatus(False, f"larger than {MAX_RANK_TABLE_BYTES >> 20} MiB")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return TableStatus(False, "not JSON" if data.strip() else "empty")
    if not isinstance(doc, dict):
        return TableStatus(False, "not a JSON object")
    if "status" not in doc:
        return TableStatus(False, 'without a "status"')
    status = doc["status"]
    return TableStatus(status == COMPLETED, json.dumps(status) if isinstance(status, str)
                       and len(status) <= 40 else shown(status))


def table_wait(pod: Pod, config: LaunchConfig, err: TextIO) -> Optional[Callable[[], None]]:
    """What to do before this pod's ranks start: wait for its rank table (``--rank-table-timeout``);
    None where there is none, and for a dry run."""
    table = pod.rank_table
    if table is None or config.dry_run:
        return None
    given = config.rank_table_timeout
    timeout = DEFAULT_RANK_TABLE_TIMEOUT if given is None else given

    def wait() -> None:
        wait_for_rank_table(table, timeout, err)
    return wait


def wait_for_rank_table(path: str, timeout: float, err: TextIO, poll: float = _POLL,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until ``path`` reads ``"status": "completed"``; the seconds it took. After
    ``timeout`` seconds (0: no limit) a ``LaunchError`` names the file and what it read last."""
    start = clock()
    status = table_status(path)
    if status.completed:
        return 0.0
    limit = f"up to {timeout:g} s" if timeout > 0 else "without a time limit"
    err.write(f"npu-launch: waiting for the operator's rank table {path} to read "
              f"\"status\": \"completed\" (now {status.said}), {limit}\n")
    err.flush()
    while not status.completed:
        if timeout > 0 and clock() - start >= timeout:
            raise LaunchError(f"rank table {path}: still {status.said} after {timeout:g} s "
                              "(the operator writes \"completed\" once every pod of the job is "
                              "placed; --rank-table-timeout waits longer): nothing was started")
        sleep(poll)
        status = table_status(path)
    waited = clock() - start
    err.write(f"npu-launch: rank table {path} completed after {waited:.1f} s\n")
    return waited
