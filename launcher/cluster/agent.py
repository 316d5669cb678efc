"""A node agent: npu-launch on one host of a multi-node job, supervising that host's ranks.

Node 0 starts one per host (over ssh, srun or mpirun) with the whole job's plan; the agent runs
its node's share exactly as a one-node launch does, sends every rank line to its stdout as
``[host:rank] line``, and adds control lines (``launcher.cluster.control``) for events and its result.
Fed over stdin, it takes the end of stdin as node 0's order to stop (or node 0's death).

    python -m launcher.cluster.agent --plan - --node-rank 1          # payload on stdin (ssh)
    python -m launcher.cluster.agent --plan tcp://HOST:PORT           # fetched from the launcher
                                                              # (srun, mpirun; node rank from
                                                              # Slurm or OpenMPI)

After the payload, stdin carries ``finish`` once every node's ranks are done (the scheduler's
node may then stop it) and, by its end, the order to stop. On a restart, before its ranks start,
the agent puts the resume step's manifest beside their files and fetches from node 0 any file
its host lacks (``launcher.checkpoints.ledger``). As it forwards its ranks' checkpoint events, it sends
the files node 0 collects (the plan's ``collect_ranks``) to the launcher from a thread of its
own, unless its host sees the launcher's log directory (``launcher.cluster.collect``).
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Mapping, Optional, Sequence

from launcher.checkpoints.resume import MissingCheckpoint, place_for_resume
from launcher.checkpoints.uploads import Upload
from launcher.cluster import control, payload
from launcher.cluster.collect import Uploader, shares_storage
from launcher.cluster.payload import PayloadServer
from launcher.config.launch_config import ConsoleFilter
from launcher.errors import LaunchError
from launcher.hangs.stalls import Stall
from launcher.limits import whole_number
from launcher.plan.host_binding import bind_node
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec
from launcher.run import last_words
from launcher.run.events import prepare_dirs
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.output import Console
from launcher.run.process import ProcessGroup
from launcher.run.strays import become_subreaper
from launcher.run.supervisor import LocalRanks
from launcher.run.watch import Watch
from parallel import contract
from parallel.checkpoints.manifest import atomic_save, atomic_write_bytes
from parallel.contract import Event

NODE_RANK_SOURCES = ("SLURM_NODEID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
AGENT_INTERVAL = 0.1
"""Seconds between an agent's checks of its ranks (node 0's loop: 0.02 s). An idle agent costs
a fifth of what it did at 0.02 s (2 ms of CPU a second), and a rank's exit is seen 0.1 s later
at most: node 0's own check and the teardown after it take longer."""
_PLAN_COMPRESSION = 6


def payload_for(plan: LaunchPlan, served: PayloadServer) -> bytes:
    """What node 0 sends every agent: one JSON line, the plan (compressed: every agent gets the
    whole plan, 2.7 KB a rank, which zlib makes about 30 times smaller; node 0 sends it once
    per host, and at 1024 hosts of 16 ranks that is 45 GB against 1.5) and where to fetch
    more."""
    packed = base64.b64encode(zlib.compress(plan.to_json().encode(), _PLAN_COMPRESSION))
    body = {"plan_zlib": packed.decode(), "server": {"address": served.address, "key": served.key}}
    return json.dumps(body).encode() + b"\n"


def _plan_of(body: dict) -> LaunchPlan:
    return LaunchPlan.from_json(zlib.decompress(base64.b64decode(body["plan_zlib"])).decode())


@dataclasses.dataclass(frozen=True)
class NodeZero:
    """The launcher's server, as an agent reaches it (``launcher.cluster.payload``)."""

    address: str
    key: str

    def fetch_replica(self, rank: int, path: str) -> None:
        """Write node 0's stand-in for ``rank``'s checkpoint file to ``path``, atomically (the
        one atomic writer, ``parallel.checkpoints.manifest.atomic_save``)."""

        def fetch(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                payload.fetch_into(self.address, self.key, f"replica {rank}", f.write,
                                   limit=1 << 62)
        atomic_save(path, fetch)

    def upload(self, upload: Upload, path: str) -> None:
        """Send node 0 a checkpoint file it collects (``launcher.cluster.collect``)."""
        payload.upload_file(self.address, self.key, upload, path)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m launcher.cluster.agent")
    parser.add_argument("--plan", required=True, help="payload file, or - for stdin")
    parser.add_argument("--node-rank", type=int, default=None)
    parser.add_argument("--stdin-control", choices=("all", "node0", "none"), default="all",
                        help="which agents take stdin as node 0's control channel (mpirun feeds "
                        "only the first)")
    args = parser.parse_args(argv)
    become_subreaper()  # what its ranks leave is its to end (``launcher.run.strays``)
    Console(sys.stdout.buffer).write_line(b"", control.agent_up_line())
    try:
        body = json.loads(_payload(args.plan))
        plan = _plan_of(body)
    except (ValueError, KeyError, zlib.error):  # also an empty one
        raise SystemExit("npu-launch agent: the plan did not arrive whole (node 0 stopped the "
                         "job while this agent was connecting)") from None
    server = NodeZero(**body["server"])
    node_rank = args.node_rank if args.node_rank is not None else node_rank_from(os.environ)
    watch = args.stdin_control == "all" or (args.stdin_control == "node0" and node_rank == 0)
    sys.exit(run_agent(plan, node_rank, watch, server))


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
    """An agent's news for node 0: control lines in its stdout, among its ranks' lines; the
    checkpoint files node 0 collects go to ``uploader`` as their events pass."""

    def __init__(self, console: Console, uploader: Optional[Uploader] = None) -> None:
        self._console = console
        self._uploader = uploader

    def event(self, event: Event) -> None:
        self._console.write_line(b"", control.event_line(event))
        if self._uploader is not None:
            self._uploader.offer(event)

    def ranks_done(self, node_rank: int) -> None:
        self._console.write_line(b"", control.node_done_line(node_rank))

    def tick(self) -> Optional[Stall]:
        return None  # node 0 sees every node's events and judges who fell behind

    def exits_overdue(self) -> bool:
        return False  # node 0 alone knows when every rank's script ended

    def result(self, result: JobResult) -> None:
        self._console.write_line(b"", control.result_line(result))


def run_agent(plan: LaunchPlan, node_rank: int, watch_stdin: bool, server: NodeZero) -> int:
    specs = plan.on_node(node_rank)
    prepare_dirs(plan.log_dir, [path for spec in specs for path in spec.files])
    console = Console(sys.stdout.buffer)
    plan, unbound = _bind_here(plan, node_rank, console)
    missing = unbound or _place_for_resume(plan, specs, server, console)
    if missing is not None:
        ControlReporter(console).result(missing)
        return missing.exit_code
    uploader = _uploader(plan, specs, server, console)
    reporter = ControlReporter(console, uploader)
    last_words.clear(plan.log_dir)  # an earlier attempt's answer is not this one's
    ranks = LocalRanks(plan, os.environ, node_rank, console, ConsoleFilter(), reporter)
    group = ranks.group()
    stop = AgentStop(plan)
    watch = Watch(plan, ranks, group, interval=AGENT_INTERVAL,  # node 0 filters the console
                  on_stop=stop)
    if watch_stdin:
        words = AgentWords(plan.log_dir, specs, group, console)
        threading.Thread(target=_follow_stdin, args=(ranks, watch, stop, words),
                         daemon=True).start()
    result = watch.run()
    if result.outcome is Outcome.INTERRUPTED and watch.stop_requested_at is not None:
        result = ranks.failed_before(watch.stop_requested_at) or result
    # The last checkpoint's files go before the result: node 0 stops serving once every
    # agent has reported. After a failure they get the time teardown gives processes.
    uploader.close(None if result.outcome is Outcome.SUCCEEDED else plan.timeouts.kill)
    reporter.result(result)
    return result.exit_code


def _uploader(plan: LaunchPlan, specs: Sequence[ProcessSpec], server: NodeZero,
              console: Console) -> Uploader:
    """What this node sends node 0: its ranks among the plan's ``collect_ranks``, and any of its
    ranks' last words, unless the host shares the launcher's storage."""
    mine = frozenset(s.rank for s in specs if s.rank is not None and s.rank in plan.collect_ranks)
    shared = shares_storage(plan.log_dir, plan.token)
    if mine and shared:
        console.write_line(b"", b"checkpoints: this host sees the launcher's log directory "
                           b"(shared storage): its ranks' files stay where they are, none is "
                           b"sent to node 0")
        mine = frozenset()
    return Uploader(server.upload, mine, lambda line: console.write_line(b"", line.encode()),
                    last_words=plan.replicated and not shared)


def _place_for_resume(plan: LaunchPlan, specs: Sequence[ProcessSpec], server: NodeZero,
                      console: Console) -> Optional[JobResult]:
    """On a restart, this node's ranks' files of the resume step, fetched from node 0 where
    this host lacks them; the failed result when one cannot be had (nothing is started)."""
    if plan.resume is None:
        return None
    host = specs[0].host if specs else "?"
    ranks = [s.rank for s in specs if s.rank is not None]
    try:
        for note in place_for_resume(plan.resume, ranks, host, server.fetch_replica,
                                     exact=not plan.replicated):
            console.write_line(b"", f"resume: {note}".encode())  # node 0 shows it as [host:agent]
    except (MissingCheckpoint, LaunchError, OSError) as e:
        message = f"npu-launch: job {plan.job_id} failed before restart {plan.restart}: {e}"
        rank = e.rank if isinstance(e, MissingCheckpoint) else None
        return JobResult(Outcome.FAILED, 1, message, time.time(),
                         Cause(Outcome.FAILED, "rank", rank, host, time=time.time()))
    return None


def _bind_here(plan: LaunchPlan, node_rank: int,
               console: Console) -> tuple[LaunchPlan, Optional[JobResult]]:
    """``--bind-cores``: this node's ranks' cores, found on this host (node 0 cannot see its
    cpuset or cards: ``launcher.plan.binding``); the failed result when they cannot be had (a core
    this host does not allow, numactl missing): nothing is started."""
    try:
        plan, notes = bind_node(plan, node_rank)
    except LaunchError as e:
        host = next((s.host for s in plan.on_node(node_rank)), "?")
        message = f"npu-launch: job {plan.job_id}: {host}: {e.message}"
        return plan, JobResult(Outcome.FAILED, e.exit_code, message, time.time(),
                               Cause(Outcome.FAILED, "agent", None, host, time=time.time()))
    for note in notes:
        console.write_line(b"", note.encode())  # node 0 shows it as [host:agent]
    return plan, None


class AgentStop:
    """What a stop signal to this agent does first (``launcher.run.watch.StopHook``). Node 0
    decides the step every rank saves (``attempt.StopRequest``) and sends it on the agents'
    stdin; ``save`` writes it into this host's log directory, where the trainer looks once a
    step, and the ranks save it and exit on their own. A signal to the agent itself (Slurm
    signals every task of a job step on preemption) waits ``WORD_WAIT`` s for node 0's word
    and then gives the ranks ``--kill-timeout``; without it, or when stdin ends (node 0's
    order to stop now), the ranks are stopped at once."""

    WORD_WAIT = 0.5

    def __init__(self, plan: LaunchPlan) -> None:
        self._path = os.path.join(plan.log_dir, contract.STOP_REQUEST_FILE)
        self._kill = plan.timeouts.kill
        self._word = threading.Event()

    def save(self, step: int) -> None:
        try:
            atomic_write_bytes(self._path, f"{step}\n".encode())
        except OSError:
            return
        self._word.set()

    def __call__(self, signum: int) -> float:
        if signum == signal.SIGHUP or not self._word.wait(self.WORD_WAIT):
            return 0.0
        return self._kill

    def ranks_stopped(self) -> bool:
        return False  # the ranks' source ends the loop once they all exited


class AgentWords:
    """Node 0's ``words`` request (``control.WORDS``) for a rank of this host: asked through
    the files in this host's log directory, as node 0 asks the ranks of a job run on its own
    (``launcher.run.last_words.ask_here``), and its answer relayed to node 0."""

    WAIT = last_words.WAIT - 0.5
    """Seconds the rank gets: node 0 waits ``last_words.WAIT``, and the answer must reach it."""

    def __init__(self, log_dir: str, specs: Sequence[ProcessSpec], group: ProcessGroup,
                 console: Console) -> None:
        self._log_dir = log_dir
        self._specs = {s.rank: s for s in specs if s.rank is not None}
        self._group = group
        self._console = console

    def __call__(self, request: control.WordsRequest) -> None:
        spec = self._specs.get(request.rank)
        if spec is not None:  # another host's rank: its agent answers
            threading.Thread(target=self._relay, args=(spec, request), daemon=True).start()

    def _relay(self, spec: ProcessSpec, request: control.WordsRequest) -> None:
        pid = self._group.pids.get(spec.label)
        answer = last_words.ask_here(self._log_dir, request.rank, request.attempt,
                                     time.time() - request.age,
                                     lambda: pid is not None and last_words.child_alive(pid),
                                     self.WAIT)
        self._console.write_line(b"", control.last_words_line(request.rank, answer))


def _follow_stdin(ranks: LocalRanks, watch: Watch, stop: AgentStop, words: AgentWords) -> None:
    """``finish``: every node is done, stop the scheduler; ``save <step>``: every rank saves
    that step and exits; ``words ...``: ask a rank of this host for its last words; end of
    stdin: stop everything."""
    # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader makes the
    # interpreter abort at exit ("could not acquire lock for <stdin>").
    pending = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line + b"\n" == control.FINISH:
                ranks.finish()
            step = control.saved_step(line)
            if step is not None:
                stop.save(step)
            request = control.words_request(line)
            if request is not None:
                words(request)
    watch.request_stop(signal.SIGHUP)


if __name__ == "__main__":
    main()
