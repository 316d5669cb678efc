"""An msrun 2.10 command line read as msrun's own parser reads it
(``mindspore/parallel/cluster/run.py``): the same names, types, defaults and boolean spelling,
``--opt=value`` and ``--opt value``, with npu-launch's own options among msrun's. Whatever
msrun would refuse is a ``ConfigError`` naming the msrun option. ``launcher.config.msrun_compat``
turns the result into the npu-launch job it means.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import re
from typing import Any, Callable, Mapping, Sequence

from launcher.config.msrun_values import bind_numa_value, bind_value
from launcher.errors import ConfigError
from launcher.limits import shown, whole_number

SAID_BY_MSRUN = {
    "--cards": "--local_worker_num", "--nnodes": "--worker_num", "--node-rank": "--node_rank",
    "--master-addr": "--master_addr", "--master-port": "--master_port", "--log-dir": "--log_dir",
    "--startup-timeout": "--cluster_time_out", "--rank-table": "--rank_table_file",
    "--console": "--tail_worker_log",
}
"""npu-launch options an msrun option sets here: given after ``msrun``, they are refused (the
msrun spelling says it), and an error about one names the msrun option first."""

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
