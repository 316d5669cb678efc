"""``npu-launch run``'s options, and the ``--config`` YAML file under them, into a checked
``LaunchConfig``.

A flag given wins over the file's value (the file's value is still checked); ``env`` adds up,
the file's variables first. An error about a value that came from the file names its
``file:line``; an unknown option that landed in SCRIPT is named, with the closest known one.
"""
from __future__ import annotations

import contextlib
import datetime
import difflib
import os
import sys
from typing import Any, Iterator

import click
from click.core import ParameterSource

from launcher.cli.whole_numbers import WholeNumber
from launcher.config.config_file import FileSetting, check_known_keys, read_config_file
from launcher.config.devices import DeviceKind
from launcher.config.hostfile import path_shown
from launcher.config.launch_config import ConsoleFilter, LaunchConfig, check_env_name, parse_env_pairs
from launcher.errors import ConfigError, HostfileError
from launcher.limits import check_path_length, shell_words, shown
from parallel import contract
from parallel.config import ParallelConfig

_FILE_ONLY_KEYS = ("script", "script_args")


def build_config(ctx: click.Context, options: dict[str, Any]
                 ) -> tuple[LaunchConfig, dict[str, str]]:
    """Options (and the ``--config`` file under them) -> a checked ``LaunchConfig``, and the
    ``path:line`` of each option whose value came from the file."""
    section: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if options["config_file"] == "":  # as the other file options: not read as no file
        raise ConfigError("--config: empty path")
    if options["config_file"] is not None:
        check_path_length(f"--config {shown(options['config_file'])}", options["config_file"])
        options, section, origins = _apply_config_file(ctx, options, options["config_file"])
    script = options["script"] or ""
    if script.startswith("-") and script != "-":
        _refuse_unknown_option(ctx, script)
    with pointing_at(origins):
        return _launch_config(options, section), origins


@contextlib.contextmanager
def pointing_at(origins: dict[str, str]) -> Iterator[None]:
    """An error about an option whose value came from the config file names the file's line
    (errors name their option first: ``--cards 100: ...``; a hostfile's errors name the
    hostfile: ``hosts: cannot read the hostfile ...``)."""
    try:
        yield
    except (ConfigError, HostfileError, contract.BadInput) as e:
        said = e.message.split(" ", 1)[0].rstrip(":")
        if said not in origins:  # a hostfile's name may hold spaces
            said = e.message.split(": ", 1)[0]
        if said in origins:
            raise ConfigError(f"{origins[said]}: {e.message}") from None
        raise


def _launch_config(options: dict[str, Any], section: dict[str, Any]) -> LaunchConfig:
    return LaunchConfig(
        script=options["script"] or "",
        script_args=tuple(options["script_args"]),
        cards=options["cards"],
        device=DeviceKind(options["device"]),
        rank_table=options["rank_table"],
        master_addr=options["master_addr"],
        master_port=options["master_port"],
        log_dir=options["log_dir"],
        job_id=options["job_id"],
        console=ConsoleFilter.parse(options["console_ranks"]),
        runtime_logs=options["runtime_logs"], merge_lines=options["merge_lines"],
        kill_timeout=options["kill_timeout"],
        startup_timeout=options["startup_timeout"],
        debug=options["debug"],
        dry_run=options["dry_run"],
        json=options["as_json"],
        env=parse_env_pairs(options["env_pairs"]),
        python=sys.executable,
        workdir=working_dir(),
        checkpoint_collect=options["checkpoint_collect"],
        compile_cache=options["compile_cache"],
        hostfile=options["hostfile"],
        include=options["include"],
        exclude=options["exclude"],
        nnodes=options["nnodes"],
        node_rank=options["node_rank"],
        launcher=options["launcher_kind"],
        ssh_port=options["ssh_port"],
        ssh_options=tuple(options["ssh_options"]),
        launcher_args=shell_words("--launcher-args", options["launcher_args"] or ""),
        fanout=options["fanout"],
        preflight=not options["no_preflight"],
        sync_workdir=options["sync_workdir"],
        server_id=options["server_id"],
        hang_timeout=options["hang_timeout"],
        hang_grace=options["hang_grace"],
        hang_floor=options["hang_floor"],
        exit_timeout=options["exit_timeout"],
        max_restarts=options["max_restarts"],
        restart_backoff=options["restart_backoff"],
        restart_backoff_max=options["restart_backoff_max"],
        min_nodes=options["min_nodes"],
        card_free_timeout=options["card_free_timeout"],
        bind_cores=options["bind_cores"],
        bind_numa=options["bind_numa"],
        rank_table_timeout=options["rank_table_timeout"],
        parallel=_parallel_config(options, section),
    )


def working_dir() -> str:
    """The directory the command was started in; a ``ConfigError`` if it was removed."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise ConfigError("the working directory no longer exists (it was removed after "
                          "this shell entered it)") from None


def _refuse_unknown_option(ctx: click.Context, word: str) -> None:
    """Unknown options land in SCRIPT (everything after it is the script's): name them."""
    name = word.split("=", 1)[0]
    known = [o for p in ctx.command.params if isinstance(p, click.Option)
             for o in (*p.opts, *p.secondary_opts)]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"a script of that name goes as ./{name}"
    raise ConfigError(f"no such option: {shown(name)} ({hint})")


_PARALLEL_OPTIONS = {"parallel_mode": "mode", "dp": "dp", "mp": "mp", "pp": "pp",
                     "micro_batches": "micro_batches", "optimizer_shard": "optimizer_shard",
                     "gradients_mean": "gradients_mean", "full_batch": "full_batch",
                     "global_batch": "global_batch", "seed": "seed"}


def _parallel_config(options: dict[str, Any], section: dict[str, Any]) -> ParallelConfig:
    """The config file's ``parallel:`` section, with the parallel flags given over it."""
    values = dict(section)
    values.update({field: options[name] for name, field in _PARALLEL_OPTIONS.items()
                   if options.get(name) is not None})
    return ParallelConfig.from_mapping(values)


def _apply_config_file(ctx: click.Context, options: dict[str, Any], path: str
                       ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Options under the file's values; the file's ``parallel:`` section, if a mapping; and
    ``path:line`` of each option the file set."""
    settings = read_config_file(path)
    section: dict[str, Any] = {}
    if isinstance(settings.get("parallel", FileSetting(None, 0)).value, dict):
        section = _parallel_section(path, settings.pop("parallel"))
    by_key = {_file_key(p): p for p in ctx.command.params if p.name and p.name != "config_file"}
    check_known_keys(path, settings, by_key)
    merged = dict(options)
    origins = {}
    for key, setting in settings.items():
        param = by_key[key]
        value = _cast(ctx, param, setting, path, key)  # checked even where a flag wins
        if ctx.get_parameter_source(param.name) in (ParameterSource.DEFAULT, None) or \
                (key in _FILE_ONLY_KEYS and not options[param.name]):
            merged[param.name] = value
            option = key.replace('_', '-')
            # A false flag's error names its off form (--no-checkpoint-collect: ...).
            for said in (f"--{option}", f"--no-{option}"):
                origins[said] = f"{path}:{setting.line}"
            if key == "hostfile":  # its own errors start with its name, not the option
                origins[path_shown(value)] = f"{path}:{setting.line}"
        elif param.name == "env_pairs":
            # Variables add up, as the parallel section's keys do: the file's first, so that a
            # flag's value for the same variable wins; none of the file's is dropped unsaid.
            merged[param.name] = (*value, *options[param.name])
    return merged, section, origins


def _parallel_section(path: str, setting: FileSetting) -> dict[str, Any]:
    """Each key checked alone first, so an error points at its line, then all together."""
    section = setting.value
    for key, value in section.items():
        try:
            ParallelConfig.from_mapping({key: value})
        except contract.BadInput as e:
            raise ConfigError(f"{path}:{setting.line_of(key)}: {e.message}") from None
    try:
        ParallelConfig.from_mapping(section)
    except contract.BadInput as e:
        raise ConfigError(f"{path}:{setting.line}: {e.message}") from None
    return section


def _file_key(param: click.Parameter) -> str:
    """Config-file keys are the long option names: ``console`` for ``console_ranks``."""
    if isinstance(param, click.Option):
        return param.opts[-1].lstrip("-").replace("-", "_")
    return str(param.name)


def _cast(ctx: click.Context, param: click.Parameter, setting: FileSetting, path: str,
          key: str) -> Any:
    """A file's value as the option would take it; a value of the wrong YAML type (a list
    for ``cards``, ``true`` or ``2.7`` for a count) is refused, naming ``path:line``."""
    value = _file_value(param, setting, path, key)
    try:
        result = param.type_cast_value(ctx, value)
        if key == "console":
            ConsoleFilter.parse(result)
        return result
    except click.BadParameter as e:
        raise ConfigError(f"{path}:{setting.line}: {key}: {e.message}") from None
    except ConfigError as e:
        raise ConfigError(f"{path}:{setting.line}: {e.message}") from None


_SCALARS = (str, int, float, datetime.date)
_LARGEST_FLOAT = 1.7976931348623157e308
"""A YAML integer past this (309 digits and more) cannot become a float."""


def _file_value(param: click.Parameter, setting: FileSetting, path: str, key: str) -> Any:
    value, where = setting.value, f"{path}:{setting.line}: {key}"
    if value is None:
        raise ConfigError(f"{where}: no value (leave the key out for the default)")
    if param.name == "env_pairs" and isinstance(value, dict):
        return [_env_pair(str(k), v, path, setting.line_of(k))
                for k, v in value.items()]
    if param.multiple or param.nargs == -1:
        items = value if isinstance(value, list) else [value]
        return [str(_scalar(v, where)) for v in items]
    if isinstance(param, click.Option) and param.is_flag:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {shown(value)}")
        return value
    if isinstance(param.type, WholeNumber) and not _is_int(value):
        raise ConfigError(f"{where}: expected a whole number, got {shown(value)}")
    if isinstance(param.type, click.types.FloatParamType) and not _is_number(value):
        raise ConfigError(f"{where}: expected a number of seconds, got {shown(value)}")
    if isinstance(param.type, click.types.FloatParamType) and abs(value) > _LARGEST_FLOAT:
        raise ConfigError(f"{where}: {shown(value)}: too large for a number of seconds")
    if isinstance(param.type, (click.Choice, click.types.StringParamType)):
        return str(_scalar(value, where))
    return value


def _env_pair(key: str, value: Any, path: str, line: int) -> str:
    where = f"{path}:{line}: env.{key}"
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {value} is a YAML boolean; quote it if you mean the text")
    check = _scalar(value, where)
    try:
        check_env_name(key)
    except ConfigError as e:
        raise ConfigError(f"{path}:{line}: {e.message}") from None
    return f"{key}={check}"


def _scalar(value: Any, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, _SCALARS):
        raise ConfigError(f"{where}: expected a single value, got {shown(value)}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
