"""``npu-launch msrun``: an msrun 2.10 command line, read by ``launcher.config.msrun_args``,
turned into the npu-launch job it means.

:func:`translate` maps msrun's options onto ``npu-launch run``'s, with one note for each given
option that behaves differently here. The CLI builds the ``LaunchConfig`` from those options
exactly as it does for ``npu-launch run``. Whatever npu-launch cannot do as asked is a
``ConfigError`` naming the msrun option (``in_msrun_words`` names it for errors found later).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, Optional

from launcher.config.msrun_args import SAID_BY_MSRUN, MsrunArgs
from launcher.errors import ConfigError, LaunchError
from parallel.contract import BadInput

_BINDING_SAID = {"--bind-cores": "--bind_core", "--bind-numa": "--bind_numa"}
"""npu-launch's binding options, named by msrun's in errors once an msrun ``--bind_*`` set
them (without one, an npu-launch ``--bind-cores LIST`` may be given)."""

@dataclasses.dataclass(frozen=True)
class Translation:
    """``npu-launch run``'s words for the same job, and what behaves differently."""

    run_args: tuple[str, ...]
    notes: tuple[str, ...]


# The same job, in npu-launch's words --------------------------------------------------------------

def translate(args: MsrunArgs) -> Translation:
    """``npu-launch run``'s options for the job ``args`` asks for, and the notes."""
    _refuse_simulation(args)
    _check_counts(args)
    # One node's share, always: inside a Slurm allocation too (``srun msrun ...`` per node).
    run = ["--launcher", "local", "--cards", str(args.local_worker_num), *_node_options(args)]
    if args.log_dir:
        run += ["--log-dir", args.log_dir]
    run += ["--startup-timeout", str(max(args.cluster_time_out, 0))]
    if args.rank_table_file:  # a path, even one named "auto" (which npu-launch would generate)
        table = args.rank_table_file
        run += ["--rank-table", f"./{table}" if table == "auto" else table]
    if "--tail_worker_log" in args.given:
        run += ["--console", _console(args)]
    run += [*_binding_options(args), *args.own, args.script, *args.script_args]
    notes = (_NOTES[option](args) for option in args.given if option in _NOTES)
    return Translation(tuple(run), tuple(note for note in notes if note))


def _refuse_simulation(args: MsrunArgs) -> None:
    for option in ("--sim_level", "--sim_rank_id"):
        if option in args.given:
            raise ConfigError(
                f"{option}: refused: npu-launch has no simulation (dry-run compile) mode, and "
                "MindSpore's simulation refuses CPU for a distributed job ('Dryrun is not "
                "supported on CPU device for a distributed job'); run msrun for it, or "
                "npu-launch msrun --dry-run to see the plan")


def _check_counts(args: MsrunArgs) -> None:
    """What msrun itself refuses, and what npu-launch cannot start."""
    if args.worker_num < 1:
        raise ConfigError(f"{args.said('--worker_num')}: expected at least 1")
    if args.local_worker_num < 1:
        raise ConfigError(f"{args.said('--local_worker_num')}: npu-launch starts at least one "
                          "rank on each node (node 0 runs the scheduler beside its ranks)")
    if args.local_worker_num > args.worker_num:
        raise ConfigError(f"{args.said('--local_worker_num')}: more than "
                          f"{args.said('--worker_num')}")


def _node_options(args: MsrunArgs) -> list[str]:
    """One node: the scheduler's address and port if given. Several: this node's share of a
    job started by hand on each node. In rank-table mode the table says the share."""
    if args.rank_table_file:
        return []
    if args.worker_num == args.local_worker_num:
        return [*(["--master-addr", args.master_addr] if "--master_addr" in args.given else []),
                *(["--master-port", str(args.master_port)] if "--master_port" in args.given
                  else [])]
    _check_nodes(args)
    return ["--nnodes", str(args.nodes), "--node-rank", str(args.node_rank),
            "--master-addr", args.master_addr, "--master-port", str(args.master_port)]


def _check_nodes(args: MsrunArgs) -> None:
    several = f"{args.said('--worker_num')} > {args.said('--local_worker_num')}"
    if args.node_rank == -1:
        raise ConfigError(f"--node_rank: needed with {several}: a job of several nodes started "
                          "on each node (msrun would let MindSpore number the ranks; npu-launch "
                          "numbers them by node)")
    if args.worker_num % args.local_worker_num:
        raise ConfigError(f"--worker_num {args.worker_num}: not a multiple of "
                          f"{args.said('--local_worker_num')} (every node runs as many ranks)")
    if not 0 <= args.node_rank < args.nodes:
        raise ConfigError(f"--node_rank {args.node_rank}: expected 0-{args.nodes - 1} "
                          f"({args.nodes} nodes of {args.local_worker_num} ranks)")


def _binding_options(args: MsrunArgs) -> list[str]:
    """``True`` is npu-launch's ``auto`` (msrun's own auto pick, per card or by local rank);
    a per-card map or a binding file has no npu-launch equivalent."""
    run = []
    for option, value, words in (("--bind_core", args.bind_core, ["--bind-cores", "auto"]),
                                 ("--bind_numa", args.bind_numa, ["--bind-numa"])):
        if value is False:
            continue
        if value is not True:
            raise ConfigError(f"{option}: a per-card map or binding file is not supported: "
                              f"{option}=True binds each rank as npu-launch's --bind-cores auto "
                              "does, or give the cores as --bind-cores LIST (split by local rank)")
        if any(w.split("=", 1)[0] == words[0] for w in args.own):
            raise ConfigError(f"{option}: give it or npu-launch's {words[0]}, not both")
        run += words
    return run


def _console(args: MsrunArgs) -> str:
    return "all" if args.tail_worker_log == "-1" else args.tail_worker_log


# What behaves differently, one line per given option -----------------------------------------------

def _join_note(args: MsrunArgs) -> str:
    if args.join:
        return "--join True: npu-launch always waits for the job and ends with its exit code"
    return ("--join False: ignored: npu-launch always waits for the job (msrun would return once "
            "it started the processes) and ends with its exit code")


def _log_dir_note(args: MsrunArgs) -> str:
    if not args.log_dir:
        return "--log_dir '': logs go to npu-launch's default folder, npu_launch_logs/<job id>"
    return (f"--log_dir {args.log_dir}: becomes --log-dir; ranks log to rank_N.log (msrun: "
            "worker_N.log), beside npu-launch's events/ and summary.json")


def _timeout_note(args: MsrunArgs) -> str:
    if args.cluster_time_out <= 0:
        return (f"--cluster_time_out {args.cluster_time_out}: becomes --startup-timeout 0: "
                "no limit on start-up")
    return (f"--cluster_time_out {args.cluster_time_out}: becomes --startup-timeout "
            f"{args.cluster_time_out}: a rank not initialised by then stops the job, named")


def _bind_core_note(args: MsrunArgs) -> Optional[str]:
    if args.bind_core is False:
        return None
    return ("--bind_core True: becomes --bind-cores auto: each card's CPU affinity from npu-smi, "
            "else this host's allowed cores split by local rank (the cores may differ from "
            "msrun's pick)")


def _bind_numa_note(args: MsrunArgs) -> Optional[str]:
    if args.bind_numa is False:
        return None
    return ("--bind_numa True: becomes --bind-numa: each rank's memory on the NUMA nodes of its "
            "cores, which are bound too (as --bind-cores auto unless given)")


def _node_rank_note(args: MsrunArgs) -> Optional[str]:
    if args.rank_table_file:
        return None  # said by the rank table's note
    if args.worker_num == args.local_worker_num:
        if args.node_rank in (0, -1):
            return None
        return (f"--node_rank {args.node_rank}: ignored: all {args.worker_num} ranks run on this "
                "node (as in msrun)")
    return (f"--node_rank {args.node_rank}: node {args.node_rank} of {args.nodes}: npu-launch "
            "runs the scheduler on node 0, so start node 0 on the --master_addr host (msrun: "
            "whichever host owns that address)")


def _rank_table_note(args: MsrunArgs) -> str:
    text = (f"--rank_table_file {args.rank_table_file}: becomes --rank-table: rank-table mode "
            "(RANK_TABLE_FILE, RANK_ID and DEVICE_ID from the table, no scheduler; msrun keeps "
            "its scheduler and only exports RANK_TABLE_FILE)")
    if args.worker_num > args.local_worker_num:
        text += "; this server's share is found in the table by its addresses, not --node_rank"
    return text


_NOTES: dict[str, Callable[[MsrunArgs], Optional[str]]] = {
    "--join": _join_note,
    "--log_dir": _log_dir_note,
    "--cluster_time_out": _timeout_note,
    "--tail_worker_log": lambda a: f"--tail_worker_log {a.tail_worker_log}: becomes --console "
                                   f"{_console(a)}",
    "--worker_log_name": lambda a: "--worker_log_name: ignored, logs are rank_N.log",
    "--bind_core": _bind_core_note,
    "--bind_numa": _bind_numa_note,
    "--node_rank": _node_rank_note,
    "--rank_table_file": _rank_table_note,
}


@contextlib.contextmanager
def in_msrun_words(args: MsrunArgs) -> Iterator[None]:
    """An error about an npu-launch option that an msrun option set names the msrun option
    first: ``--local_worker_num: --cards 100: expected 1-64 ...``; so does one about the rank
    table's file."""
    try:
        yield
    except (LaunchError, BadInput) as e:
        option = e.message.split(" ", 1)[0].rstrip(":")
        said = {**SAID_BY_MSRUN, **_BINDING_SAID} if args.bind_core or args.bind_numa \
            else SAID_BY_MSRUN
        if option in said:
            raise ConfigError(f"{said[option]}: {e.message}") from None
        if args.rank_table_file and option == args.rank_table_file:
            raise ConfigError(f"--rank_table_file: {e.message}") from None
        raise
