"""Preflight for a multi-node job: every host checked before anything starts.

The hosts with a bad card are left out when ``--min-nodes`` allows it
(``card_checks.judge_at_start``); with ``--sync-workdir`` the copy of the launch directory to
hosts that lack it is planned, and made only once the rest of the job is known to be good. A
host that fails is a ``LaunchError`` (one line, the table before it) and nothing has started.
"""
from __future__ import annotations

import functools
import io
import os
from typing import Callable, Optional, TextIO

from launcher.cluster.backends import TransportOptions
from launcher.cluster.card_checks import judge_at_start
from launcher.cluster.preflight import HostCheck, launch_files, render, run_preflight
from launcher.cluster.workdir_sync import LaunchDir, sync_stale_hosts
from launcher.config.devices import DeviceKind
from launcher.config.hostfile import HostSelection
from launcher.config.launch_config import LaunchConfig
from launcher.errors import LaunchError


def preflight_hosts(config: LaunchConfig, hosts: list[HostSelection], options: TransportOptions,
               device: DeviceKind, port: int, err: TextIO
               ) -> tuple[DeviceKind, Optional[Callable[[], None]], list[HostSelection]]:
    """Preflight on every host of a job (``launcher.cluster.preflight``). Returns the device
    the hosts have, once every host passed; with ``--sync-workdir`` and
    hosts that lack the launch directory or differ, the copy to make (and check) once the rest
    of the job is known to be good: a refused job changes no host; and the hosts the job runs
    on (``--min-nodes`` leaves out those with a bad card, ``card_checks.judge_at_start``)."""
    workdir = os.path.abspath(config.workdir or ".")
    files = launch_files(workdir, config.script, config.script_args)

    def check() -> list[HostCheck]:
        return run_preflight(hosts, options, workdir, DeviceKind(config.device), port, files,
                             config.cards)

    source = LaunchDir.of(workdir, config.log_dir) if config.sync_workdir else None
    if source is not None:
        source.measure()  # over the cap: refused before any host is asked
    checks = check()
    verdict = judge_at_start(checks, config.min_nodes)
    err.writelines(note + "\n" for note in verdict.notes)
    hosts = [h for h in hosts if h.host not in verdict.left_out]
    checks = [c for c in checks if c.host not in verdict.left_out]
    sync = None
    if source is not None:
        judged = sync_stale_hosts(source, hosts, checks, options, check,
                                  err if config.dry_run else io.StringIO(), dry_run=True)
        if not config.dry_run and judged != checks:
            sync = functools.partial(_sync_then_check, source, hosts, checks, options, check, err)
        checks = judged
    _require_passed(checks, err)
    if DeviceKind(config.device) is DeviceKind.AUTO:
        # A host that lacked the launch directory (copied once the job is good) said nothing
        # of its cards: the others speak for it.
        known = [c.facts.cards for c in checks if c.facts is not None]
        with_cards = bool(known) and all(cards > 0 for cards in known)
        return (DeviceKind.NPU if with_cards else DeviceKind.CPU), sync, hosts
    return device, sync, hosts


def _sync_then_check(source: LaunchDir, hosts: list[HostSelection], checks: list[HostCheck],
                     options: TransportOptions, check: Callable[[], list[HostCheck]],
                     err: TextIO) -> None:
    _require_passed(sync_stale_hosts(source, hosts, checks, options, check, err), err)


def _require_passed(checks: list[HostCheck], err: TextIO) -> None:
    failed = [c.host for c in checks if not c.ok]
    if failed:
        err.write(render(checks) + "\n")
        raise LaunchError(f"preflight failed on {', '.join(failed)}: nothing was started")
