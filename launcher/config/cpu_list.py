"""CPU lists as the kernel writes them (``0-3,8,10-11``) and the ``--bind-cores`` /
``--bind-numa`` options: what ``LaunchConfig`` checks before anything is planned. The cores each
rank gets are planned in ``launcher.plan.binding``."""
from __future__ import annotations

import re
from typing import Iterable, Optional

from launcher import limits
from launcher.errors import ConfigError
from launcher.limits import shown
from parallel import contract

AUTO = "auto"
NONE = "none"
OPTION = "--bind-cores"
NUMA_OPTION = "--bind-numa"
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_cpu_list(text: str, what: str = OPTION) -> tuple[int, ...]:
    """The cores of a CPU list, ascending; garbage, a descending range or a core past
    ``limits.MAX_CPU_ID`` is a ``ConfigError`` naming ``what``."""
    if len(text) > limits.MAX_WORDS_CHARS:
        raise ConfigError(f"{what} {shown(text)}: longer than {limits.MAX_WORDS_CHARS} characters")
    cores: set[int] = set()
    if not text.strip():
        raise ConfigError(f"{what} {shown(text)}: expected auto, none or cores like 0-3,8 "
                          "(a Linux CPU list)")
    for part in text.strip().split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ConfigError(f"{what} {shown(text)}: expected auto, none or cores like 0-3,8 "
                              "(a Linux CPU list)")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high > limits.MAX_CPU_ID:
            raise ConfigError(f"{what} {shown(text)}: core {high} is past "
                              f"{limits.MAX_CPU_ID}, the highest a Linux host numbers")
        if high < low:
            raise ConfigError(f"{what} {shown(text)}: {low}-{high} runs backwards")
        cores.update(range(low, high + 1))
    return tuple(sorted(cores))


def format_cpu_list(cores: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``0-3,8``."""
    parts: list[str] = []
    run: list[int] = []
    for core in sorted(set(cores)):
        if run and core != run[-1] + 1:
            parts.append(_run_text(run))
            run = []
        run.append(core)
    if run:
        parts.append(_run_text(run))
    return ",".join(parts)


def _run_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"



def rule_of(bind_cores: Optional[str], bind_numa: bool) -> Optional[str]:
    """The rule the plan carries: ``None`` (no binding), ``auto``, or the list, written as the
    kernel writes it. ``--bind-numa`` without ``--bind-cores`` binds ``auto``."""
    if bind_cores is None:
        return AUTO if bind_numa else None
    text = bind_cores.strip().lower()
    if text == NONE:
        if bind_numa:
            raise ConfigError(f"{NUMA_OPTION} binds each rank's memory to the NUMA nodes of its "
                              f"cores; it goes without {OPTION} none")
        return None
    if text == AUTO:
        return AUTO
    return format_cpu_list(parse_cpu_list(text))


def check_options(bind_cores: Optional[str], bind_numa: bool,
                  env: Iterable[tuple[str, str]]) -> None:
    """What ``LaunchConfig`` checks: the rule parses, and ``--env`` does not set the variable
    the binding sets (the rank would be told other cores than it runs on)."""
    if rule_of(bind_cores, bind_numa) is None:
        return
    for key, _ in env:
        if key == contract.MSRUN_CPU_LIST:
            raise ConfigError(f"--env {key}: npu-launch sets {key} in every rank with "
                              f"{OPTION} (the rank's cores)")
