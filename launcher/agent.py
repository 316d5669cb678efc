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
from typing import Any, Mapping, Optional, Sequence

from launcher import control
from launcher.config import ConsoleFilter
from launcher.events import prepare_dirs
from launcher.limits import whole_number
from launcher.output import Console
from launcher.plan import LaunchPlan
from launcher.supervisor import JobResult, Supervisor, SupervisorSettings

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
    from_stdin = args.plan == "-"
    body = json.loads(_read_line(0) if from_stdin else Path(args.plan).read_bytes())
    plan = LaunchPlan.from_json(body["plan"])
    node_rank = args.node_rank if args.node_rank is not None else node_rank_from(os.environ)
    settings = SupervisorSettings.of(plan, ConsoleFilter())  # node 0 filters the console
    watch = args.stdin_control == "all" or (args.stdin_control == "node0" and node_rank == 0)
    sys.exit(run_agent(plan, settings, node_rank, watch))


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


def run_agent(plan: LaunchPlan, settings: SupervisorSettings, node_rank: int,
              watch_stdin: bool) -> int:
    specs = plan.on_node(node_rank)
    prepare_dirs(plan.log_dir, [path for spec in specs for path in spec.files])
    console = Console(sys.stdout.buffer)
    send = lambda kind, body: console.write_line(b"", control.encode(kind, body))  # noqa: E731
    supervisor = Supervisor(plan, settings, os.environ, node_rank, console,
                            on_event=lambda event: send(control.EVENT, event))
    if watch_stdin:
        threading.Thread(target=_follow_stdin, args=(supervisor,), daemon=True).start()
    result = supervisor.run()
    send(control.RESULT, result_record(result, specs[0].host if specs else "", node_rank))
    return result.exit_code


def _follow_stdin(supervisor: Supervisor) -> None:
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
            supervisor.finish()
    supervisor.request_stop(signal.SIGHUP)


def result_record(result: JobResult, host: str, node_rank: int) -> dict[str, Any]:
    cause = result.root_cause
    return {
        "host": host, "node_rank": node_rank, "outcome": result.outcome.value,
        "exit_code": result.exit_code, "message": result.message,
        "cause_time": cause.time if cause else result.ended_at,
        "cause_rank": cause.spec.rank if cause else None,
    }


if __name__ == "__main__":
    main()
