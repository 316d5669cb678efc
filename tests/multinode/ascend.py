"""Fake Ascend cards on the test hosts: device nodes, the driver's tools, and their faults.

A host given cards has, under its own ``/tmp/npl-ascend`` (each host's ``/tmp`` is private):
``dev/davinciN`` (plain files standing in for the device nodes; its sshd's sessions have
``NPU_LAUNCH_DEVFS`` pointing there), ``bin/npu-smi`` and ``bin/hccn_tool`` (the fakes of
``tests/fixtures/ascend_tools``, which print the recorded real formats; first on the sessions'
``PATH``) unless ``tools=False``, and ``faults/`` where ``break_card`` writes what the fakes read.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Sequence

from .cluster import Cluster
from .common import FAKE_ASCEND_DIR

TOOLS = Path(__file__).resolve().parents[1] / "fixtures" / "ascend_tools"
DEVFS = f"{FAKE_ASCEND_DIR}/dev"


def _sh(cluster: Cluster, host: str, script: str) -> None:
    res = cluster.run_on(host, ["sh", "-c", script])
    assert res.returncode == 0, f"{script} on {host}: {res.stderr}"


def give_cards(cluster: Cluster, host: str, cards: Sequence[int], tools: bool = True) -> None:
    """``host`` gets device nodes for ``cards`` and, with ``tools``, the fake driver tools."""
    d = shlex.quote(FAKE_ASCEND_DIR)
    nodes = " ".join(f"{d}/dev/davinci{c}" for c in cards)
    script = f"rm -rf {d} && mkdir -p {d}/dev {d}/faults && touch {nodes}"
    if tools:
        src = shlex.quote(str(TOOLS))
        script += f" && mkdir {d}/bin && cp {src}/bin/* {d}/bin/ && cp {src}/*.txt {d}/"
    _sh(cluster, host, script)


def break_card(cluster: Cluster, host: str, fault: str, value: str) -> None:
    """Write ``faults/<fault>`` on ``host`` (``link_1`` = ``DOWN``: card 1's link is down)."""
    _sh(cluster, host, f"printf '%s\\n' {shlex.quote(value)} > {FAKE_ASCEND_DIR}/faults/{fault}")


def take_cards(cluster: Cluster, hosts: Sequence[str]) -> None:
    """Remove every fake card and tool from ``hosts``."""
    for host in hosts:
        _sh(cluster, host, f"rm -rf {FAKE_ASCEND_DIR}")


def node0_env(cluster: Cluster) -> dict:
    """The environment of npu-launch started inside the first host: its fake cards."""
    return {**cluster.env, "NPU_LAUNCH_DEVFS": DEVFS,
            "PATH": f"{FAKE_ASCEND_DIR}/bin:{cluster.env.get('PATH', '')}"}


def hold_card_argv(card: int, seconds: float, stamp: str) -> list[str]:
    """A stray process that holds ``card`` open for ``seconds``, then writes the time it lets
    go to ``stamp`` (before closing it: the card is free only after that time)."""
    code = ("import sys, time; f = open(sys.argv[1]); time.sleep(float(sys.argv[2])); "
            "open(sys.argv[3], 'w').write(repr(time.time())); f.close()")
    return [sys.executable, "-c", code, f"{DEVFS}/davinci{card}", str(seconds), stamp]
