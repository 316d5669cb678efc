"""``npu-launch SCRIPT``: turn a checked config into a plan, then run it (or print it)."""
from __future__ import annotations

import importlib.util
import os
import secrets
import socket
import time
from typing import Mapping, TextIO

from launcher import ports
from launcher.config import LaunchConfig
from launcher.devices import Card, DeviceKind, find_cards, resolve_kind
from launcher.errors import ConfigError
from launcher.events import prepare_dirs
from launcher.plan import LaunchPlan, Node, PlanInputs, build_plan
from launcher.supervisor import JobResult, Supervisor, SupervisorSettings, print_message


def launch(config: LaunchConfig, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """Plan the job; print the plan (``--dry-run``) or run it. Returns the exit code."""
    plan = make_plan(config, environ, err)
    if config.dry_run:
        out.write((plan.to_json() if config.json else plan.render()) + "\n")
        return 0
    result = run_plan(plan, config, environ)
    print_message(result, err)
    return result.exit_code


def run_plan(plan: LaunchPlan, config: LaunchConfig, environ: Mapping[str, str]) -> JobResult:
    prepare_dirs(plan.log_dir)
    with open(os.path.join(plan.log_dir, "plan.json"), "w") as f:
        f.write(plan.to_json())
    settings = SupervisorSettings(config.kill_timeout, config.startup_timeout, config.console)
    return Supervisor(plan, settings, environ).run()


def make_plan(config: LaunchConfig, environ: Mapping[str, str], err: TextIO) -> LaunchPlan:
    """Everything that must be true before a process starts is checked here."""
    device, cards = _local_cards(config, environ, err)
    job_id = config.job_id or new_job_id()
    log_dir = os.path.abspath(config.log_dir or os.path.join("npu_launch_logs", job_id))
    port = _master_port(config)
    inputs = PlanInputs(
        job_id=job_id, log_dir=log_dir, master_port=port, device=device,
        nodes=(Node(socket.gethostname(), 0, cards),),
        base_pythonpath=environ.get("PYTHONPATH", ""), boot_dir=boot_dir(),
        inherited=frozenset(environ),
    )
    return build_plan(config, inputs)


def _local_cards(config: LaunchConfig, environ: Mapping[str, str],
                 err: TextIO) -> tuple[DeviceKind, tuple[Card, ...]]:
    found = find_cards(environ)
    kind = resolve_kind(config.device, found)
    if kind is DeviceKind.CPU:
        count = 1 if config.debug else (config.cards or 1)
        if config.device is DeviceKind.AUTO:
            err.write(f"npu-launch: no Ascend cards found: running {count} CPU rank(s)\n")
        return kind, tuple(Card(i, i) for i in range(count))
    count = 1 if config.debug else (config.cards or len(found))
    if count > len(found):
        ids = ",".join(str(c.physical) for c in found)
        raise ConfigError(f"--cards {count}: this host has {len(found)} Ascend card(s) ({ids})")
    if config.device is DeviceKind.AUTO:
        err.write(f"npu-launch: found {len(found)} Ascend card(s): running {count} rank(s) "
                  "on npu\n")
    return kind, found[:count]


def _master_port(config: LaunchConfig) -> int:
    if config.master_port is None:
        return ports.free_port(config.master_addr)
    ports.require_free(config.master_addr, config.master_port)
    return config.master_port


def new_job_id() -> str:
    """Sortable and unique enough across one cluster: ``20261130-101500-3fa2``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def boot_dir() -> str:
    """The folder whose ``sitecustomize`` installs the rank hook in every rank."""
    spec = importlib.util.find_spec("parallel")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(list(spec.submodule_search_locations)[0], "_boot")
