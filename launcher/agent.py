"""A node agent: npu-launch on one host of a multi-node job, supervising that host's ranks.

Node 0 starts one per host (over ssh, srun or mpirun) with the whole job's plan; the agent runs
its node's share exactly as a one-node launch does, sends every rank line to its stdout as
``[host:rank] line``, and adds control lines (``launcher.control``) for events and its result.
Fed over stdin, it takes the end of stdin as node 0's order to stop (or node 0's death).

    python -m launcher.agent --plan - --node-rank 1      # payload on stdin (ssh)
    python -m launcher.agent --plan FILE                  # node rank from Slurm or OpenMPI

After the payload, stdin carries ``finish`` once every node's ranks are done (the scheduler's
node may then stop it) and, by its end, the order to stop.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Mapping, Optional, Sequence

from launcher import control, payload
from launcher.errors import LaunchError
from launcher.config import ConsoleFilter
from launcher.events import prepare_dirs
from launcher.failures import JobResult
from launcher.limits import whole_number
from launcher.output import Console
from launcher.plan import LaunchPlan
from launcher.stalls import Stall
from launcher.supervisor import LocalRanks
from launcher.watch import Watch
from parallel import contract
from parallel.contract import Event

NODE_RANK_SOURCES = ("SLURM_NODEID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def payload_for(plan: LaunchPlan) -> bytes:
    """What node 0 sends every agent: one JSON line."""
    body = {"plan": plan.to_json()}
    return json.dumps(body).encode() + b"\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m launcher.agent")
    parser.add_argument("--plan", required=True, help="payload file, or - for stdin")
    parser.add_argument("--node-rank", type=int, default=None)
    parser.add_argument("--stdin-control", choices=("all", "node0", "none"), default="all",
                        help="which agents take stdin as node 0's control channel (mpirun feeds "
                        "only the first)")
    args = parser.parse_args(argv)
    body = json.loads(_payload(args.plan))
    plan = LaunchPlan.from_json(body["plan"])
    node_rank = args.node_rank if args.node_rank is not None else node_rank_from(os.environ)
    watch = args.stdin_control == "all" or (args.stdin_control == "node0" and node_rank == 0)
    sys.exit(run_agent(plan, node_rank, watch))


def _payload(source: str) -> bytes:
    """The payload: on stdin (``-``, ssh), from the launcher (``tcp://``, srun and mpirun; the
    key in the environment is this process's alone, and its ranks do not inherit it), or in a
    file."""
    if source == "-":
        return _read_line(0)
    if source.startswith(payload.SCHEME):
        key = os.environ.pop(contract.PAYLOAD_KEY, "")
        if not key:
            raise SystemExit(f"npu-launch agent: no {contract.PAYLOAD_KEY} in the environment "
                             "(does --launcher-args stop srun or mpirun passing it on?)")
        try:
            return payload.fetch(source, key)
        except LaunchError as e:
            raise SystemExit(f"npu-launch agent: {e.message}") from None
    return Path(source).read_bytes()


def _read_line(fd: int) -> bytes:
    """The payload line from ``fd``; node 0 writes nothing more until every node's ranks are
    done (``finish``), so no later byte is read here by mistake."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def node_rank_from(environ: Mapping[str, str]) -> int:
    for name in NODE_RANK_SOURCES:
        node_rank = whole_number(environ.get(name, ""))
        if node_rank is not None:
            return node_rank
    raise SystemExit("npu-launch agent: no --node-rank and none of "
                     f"{', '.join(NODE_RANK_SOURCES)} set")


class ControlReporter:
    """An agent's news for node 0: control lines in its stdout, among its ranks' lines."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def event(self, event: Event) -> None:
        self._console.write_line(b"", control.event_line(event))

    def ranks_done(self, node_rank: int) -> None:
        self._console.write_line(b"", control.node_done_line(node_rank))

    def tick(self) -> Optional[Stall]:
        return None  # node 0 sees every node's events and judges who fell behind

    def result(self, result: JobResult) -> None:
        self._console.write_line(b"", control.result_line(result))


def run_agent(plan: LaunchPlan, node_rank: int, watch_stdin: bool) -> int:
    specs = plan.on_node(node_rank)
    prepare_dirs(plan.log_dir, [path for spec in specs for path in spec.files])
    console = Console(sys.stdout.buffer)
    reporter = ControlReporter(console)
    ranks = LocalRanks(plan, os.environ, node_rank, console, ConsoleFilter(), reporter)
    watch = Watch(plan, ranks, ranks.group())  # node 0 filters the console
    if watch_stdin:
        threading.Thread(target=_follow_stdin, args=(ranks, watch), daemon=True).start()
    result = watch.run()
    reporter.result(result)
    return result.exit_code


def _follow_stdin(ranks: LocalRanks, watch: Watch) -> None:
    """``finish``: every node is done, stop the scheduler; end of stdin: stop everything."""
    # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader makes the
    # interpreter abort at exit ("could not acquire lock for <stdin>").
    received = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        received += chunk
        if control.FINISH in received:
            ranks.finish()
    watch.request_stop(signal.SIGHUP)


if __name__ == "__main__":
    main()
