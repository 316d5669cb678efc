"""``npu-launch msrun``: an msrun 2.10 command line, spelled as msrun spells it, turned into the
npu-launch job it means.

Two steps, both pure: :func:`parse` reads the words as msrun's own parser would
(``mindspore/parallel/cluster/run.py``: the same names, types, defaults and boolean spelling,
``--opt=value`` and ``--opt value``), and :func:`translate` maps them onto ``npu-launch run``'s
options, with one note for each given option that behaves differently here. The CLI builds the
``LaunchConfig`` from those options exactly as it does for ``npu-launch run``. Whatever msrun
would refuse, or npu-launch cannot do as asked, is a ``ConfigError`` naming the msrun option.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import re
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from launcher.config.msrun_values import bind_numa_value, bind_value
from launcher.errors import ConfigError, LaunchError
from launcher.limits import shown, whole_number
from parallel.contract import BadInput

SAID_BY_MSRUN = {
    "--cards": "--local_worker_num", "--nnodes": "--worker_num", "--node-rank": "--node_rank",
    "--master-addr": "--master_addr", "--master-port": "--master_port", "--log-dir": "--log_dir",
    "--startup-timeout": "--cluster_time_out", "--rank-table": "--rank_table_file",
    "--console": "--tail_worker_log",
}
"""npu-launch options an msrun option sets here: given after ``msrun``, they are refused (the
msrun spelling says it), and an error about one names the msrun option first."""

_BINDING_SAID = {"--bind-cores": "--bind_core", "--bind-numa": "--bind_numa"}
"""npu-launch's binding options, named by msrun's in errors once an msrun ``--bind_*`` set
them (without one, an npu-launch ``--bind-cores LIST`` may be given)."""

NOT_WITH_MSRUN = ("--hostfile", "--include", "--exclude", "--launcher", "--ssh-port",
                  "--ssh-option", "--launcher-args", "--sync-workdir", "--no-preflight",
                  "--fanout")
"""Options of a job node 0 starts on every host: an msrun command line starts one node's share."""

USAGE = "npu-launch msrun [MSRUN OPTIONS] [NPU-LAUNCH OPTIONS] SCRIPT [ARGS]..."

HELP = f"""Usage: {USAGE}

  Run an msrun 2.10 command line the npu-launch way: msrun's options as msrun spells them
  (--opt=value or --opt value, booleans as True/False), msrun's defaults, and one line before
  the start for each given option that behaves differently here.

  --worker_num N          the job's ranks (default 8)
  --local_worker_num N    --cards N (default 8); N < --worker_num: --nnodes worker/local
  --node_rank R           --node-rank R of a job started by hand on each node (needed then)
  --master_addr A         --master-addr A (default 127.0.0.1)
  --master_port P         --master-port P (default 8118 across nodes; one node: a free port)
  --log_dir D             --log-dir D (logs are rank_N.log)
  --cluster_time_out S    --startup-timeout S (default 600; negative: 0, no limit)
  --rank_table_file F     --rank-table F (rank-table mode)
  --tail_worker_log R     --console R (-1: all)
  --join B                always: npu-launch waits and ends with the job's exit code
  --worker_log_name X     ignored: logs are rank_N.log
  --bind_core True        --bind-cores auto (a per-card map: refused; --bind-cores LIST)
  --bind_numa True        --bind-numa (a per-card map or binding file: refused)
  --sim_level, --sim_rank_id  refused: npu-launch has no simulation mode

  npu-launch's own options that msrun has no word for go after msrun with their dashes, e.g.
  --dry-run [--json], --device, --env K=V, --job-id, --hang-timeout, --max-restarts, --dp.
"""


@dataclasses.dataclass(frozen=True)
class MsrunArgs:
    """An msrun command line as msrun's parser reads it: every option (msrun's default where
    not given), the raw text of those given (in order), npu-launch's own options given after
    ``msrun``, and the script with its arguments."""

    worker_num: int = 8
    local_worker_num: int = 8
    master_addr: str = "127.0.0.1"
    master_port: int = 8118
    node_rank: int = -1
    log_dir: str = ""
    join: bool = False
    cluster_time_out: int = 600
    bind_core: Any = False
    bind_numa: Any = False
    sim_level: int = -1
    sim_rank_id: int = -1
    rank_table_file: str = ""
    worker_log_name: str = ""
    tail_worker_log: str = "-1"
    script: str = ""
    script_args: tuple[str, ...] = ()
    given: Mapping[str, str] = dataclasses.field(default_factory=dict)
    own: tuple[str, ...] = ()
    help: bool = False

    @property
    def nodes(self) -> int:
        return self.worker_num // self.local_worker_num

    def said(self, option: str) -> str:
        """How an option's value reads in a message: ``--worker_num 8 (msrun's default)``."""
        value = getattr(self, option.lstrip("-"))
        return f"{option} {value}" + ("" if option in self.given else " (msrun's default)")


@dataclasses.dataclass(frozen=True)
class Translation:
    """``npu-launch run``'s words for the same job, and what behaves differently."""

    run_args: tuple[str, ...]
    notes: tuple[str, ...]


# Reading the words, as msrun's argparse parser does ----------------------------------------------

_INTEGER = re.compile(r"[-+]?[0-9]{1,9}")
_NEGATIVE = re.compile(r"-[0-9]+")


def _integer(option: str, text: str) -> int:
    if not _INTEGER.fullmatch(text.strip()):
        raise ConfigError(f"{option} {shown(text)}: expected a whole number")
    return int(text)


def _text(option: str, text: str) -> str:
    if "\0" in text:
        raise ConfigError(f"{option} {shown(text)}: contains a NUL byte")
    return text


def _literal_bool(option: str, text: str) -> bool:
    """msrun reads ``--join`` with ``ast.literal_eval`` and the choices True, False (so 1 and 0
    pass too, and ``true`` does not)."""
    try:
        value = ast.literal_eval(text) if len(text) <= 16 else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = None
    if isinstance(value, (bool, int, float)) and value in (True, False):
        return bool(value)
    raise ConfigError(f"{option} {shown(text)}: expected True or False (msrun's spelling)")


def _sim_level(option: str, text: str) -> int:
    level = _integer(option, text)
    if level not in (0, 1, 2, 3):
        raise ConfigError(f"{option} {level}: expected 0, 1, 2 or 3")
    return level


def _tail_ranks(option: str, text: str) -> str:
    """``-1`` (every rank) or ranks like ``0,3``: what msrun's ``int()`` of each part takes."""
    if text.strip() == "-1":
        return "-1"
    ranks = [whole_number(part.strip()) for part in text.split(",")]
    if not ranks or None in ranks:
        raise ConfigError(f"{option} {shown(text)}: expected -1 (every rank) or ranks like 0,3")
    return ",".join(str(r) for r in ranks)


_OPTIONS: dict[str, Callable[[str, str], Any]] = {
    "--worker_num": _integer, "--local_worker_num": _integer, "--master_addr": _text,
    "--master_port": _integer, "--node_rank": _integer, "--log_dir": _text,
    "--join": _literal_bool, "--cluster_time_out": _integer, "--bind_core": bind_value,
    "--bind_numa": bind_numa_value, "--sim_level": _sim_level, "--sim_rank_id": _integer,
    "--rank_table_file": _text, "--worker_log_name": _text, "--tail_worker_log": _tail_ranks,
}


def parse(argv: Sequence[str], own_options: Mapping[str, bool]) -> MsrunArgs:
    """msrun's options, then the script and its arguments. ``own_options`` are npu-launch's
    (long names, each with whether it takes a value); they may stand among msrun's."""
    words, values, given, own = list(argv), {}, {}, []
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        word = words[i]
        if word in ("-h", "--help"):
            return MsrunArgs(help=True)
        name, eq, text = word.partition("=")
        if name in _OPTIONS:
            if not eq:
                i, text = i + 1, _value_after(words, i, name)
            values[name.lstrip("-")] = _OPTIONS[name](name, text)
            given[name] = text
        elif name in own_options:
            takes_value = own_options[name] and not eq
            own.extend(words[i:i + 2] if takes_value else [word])
            i += _check_own(name, takes_value, words, i)
        else:
            _refuse_unknown(name, own_options)
        i += 1
    if i < len(words) and words[i] == "--":
        i += 1
    script, script_args = _script(words[i:])
    return MsrunArgs(**values, script=script, script_args=script_args, given=given,
                     own=tuple(own))


def _value_after(words: list[str], i: int, option: str) -> str:
    """``--opt value``: the next word, unless it is another option (a negative number is a
    value, as in argparse)."""
    if i + 1 >= len(words) or (words[i + 1].startswith("-") and
                               not _NEGATIVE.fullmatch(words[i + 1])):
        raise ConfigError(f"{option}: expected a value ({option}=VALUE or {option} VALUE)")
    return words[i + 1]


def _check_own(name: str, takes_value: bool, words: list[str], i: int) -> int:
    """An npu-launch option after ``msrun``: refused where an msrun option says it or where it
    belongs to a job started on every host; returns the words its value took."""
    if name in SAID_BY_MSRUN:
        raise ConfigError(f"{name}: with npu-launch msrun, say it as {SAID_BY_MSRUN[name]}")
    if name in NOT_WITH_MSRUN or name in ("--config", "--debug"):
        raise ConfigError(f"{name}: not with npu-launch msrun (an msrun command line is one "
                          "node's share of the whole job; use npu-launch without msrun)")
    if takes_value and i + 1 >= len(words):
        raise ConfigError(f"{name}: expected a value")
    return 1 if takes_value else 0


def _refuse_unknown(name: str, own_options: Mapping[str, bool]) -> None:
    close = difflib.get_close_matches(name, [*_OPTIONS, *own_options], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(f"no such msrun option: {shown(name)}{hint}")


def _script(rest: list[str]) -> tuple[str, tuple[str, ...]]:
    """msrun runs ``SCRIPT ARGS`` with ``python``, and ``python SCRIPT ARGS`` as given; here
    both run SCRIPT with npu-launch's own interpreter."""
    if rest and rest[0] == "pytest":
        raise ConfigError("pytest: npu-launch msrun runs a Python script; msrun's 'pytest ...' "
                          "form is not supported")
    if rest and rest[0] in ("python", "python3"):
        rest = rest[1:]
        if rest and rest[0].startswith("-"):
            raise ConfigError(f"python {shown(rest[0])}: npu-launch msrun runs a script file; "
                              "give its path (interpreter options and -m are not supported)")
    if not rest:
        raise ConfigError(f"no script given: {USAGE}")
    return rest[0], tuple(rest[1:])


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
