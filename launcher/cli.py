"""The ``npu-launch`` command: parse, build a frozen config, hand it to one function that acts.

``npu-launch [OPTIONS] SCRIPT [ARGS]...`` is the ``run`` subcommand; the other subcommands
(``rank-table``, ...) are named explicitly. This is the only module that exits.
"""
from __future__ import annotations

import os
import shlex
import sys
from typing import Any, Optional, Sequence

import click
from click.core import ParameterSource

from launcher import __version__
from launcher.config import (ConsoleFilter, FileSetting, LaunchConfig, check_known_keys,
                             parse_env_pairs, read_config_file)
from launcher.devices import DeviceKind
from launcher.errors import ConfigError
from launcher.report import report
from parallel.config import ParallelConfig
from rank_tables.cli import rank_table
from launcher.backends import TransportOptions
from launcher.hostfile import read_hostfile, select_hosts
from launcher.launch import launch
from launcher.preflight import render, run_preflight

_FILE_ONLY_KEYS = ("script", "script_args")


class LaunchGroup(click.Group):
    """A group whose default command is ``run``: ``npu-launch train.py`` is
    ``npu-launch run train.py``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        return super().parse_args(ctx, args)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        run_cmd = self.commands["run"]
        with click.Context(run_cmd, info_name=ctx.info_name, parent=None) as run_ctx:
            run_cmd.format_help(run_ctx, formatter)
        self.format_commands(ctx, formatter)


@click.group(cls=LaunchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="npu-launch")
def cli() -> None:
    """Start and supervise one MindSpore process per Ascend card."""


@cli.command("run", context_settings={"ignore_unknown_options": True,
                                      "allow_interspersed_args": False})
@click.option("--cards", type=int, help="Processes on this node, one per card [default: all "
              "cards found; 1 on CPU].")
@click.option("--device", type=click.Choice([k.value for k in DeviceKind]), default="auto",
              show_default=True, help="npu: Ascend cards (/dev/davinciN); cpu: CPU ranks; auto: "
              "npu when cards exist.")
@click.option("--rank-table", type=str, help="HCCL rank table, or 'auto' to generate this "
              "host's: start in rank-table mode (no scheduler).")
@click.option("--server-id", help="This host's server_id in the rank table [default: found by "
              "its addresses].")
@click.option("--master-addr", help="Address of the scheduler (MS_SCHED_HOST, MASTER_ADDR) "
              "[default: 127.0.0.1; with a hostfile, the first host].")
@click.option("--master-port", type=int, help="Scheduler port [default: a free port].")
@click.option("--log-dir", type=str, help="Logs go here [default: ./npu_launch_logs/<job id>].")
@click.option("--job-id", type=str, help="Name of this job [default: time and a random tag].")
@click.option("--console", "console_ranks", default="all", show_default=True,
              help="Ranks whose lines the console shows: all, none, or e.g. 0,3.")
@click.option("--kill-timeout", type=float, default=5.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping processes.")
@click.option("--startup-timeout", type=float, default=300.0, show_default=True,
              help="Stop the job when a rank has not initialised communication by then (0: "
              "never).")
@click.option("--hang-timeout", type=float, default=0.0, show_default=True,
              help="Stop the job when ranks report no step for this long, naming the rank that "
              "hangs (0: never).")
@click.option("--max-restarts", type=int, default=0, show_default=True,
              help="Restart the whole job after a failure, this many times at most (not after "
              "start-up errors).")
@click.option("--debug", is_flag=True, help="One card in the foreground with this terminal, for "
              "pdb; no communication.")
@click.option("--dry-run", is_flag=True, help="Print the plan (processes, env, commands); start "
              "nothing.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="Set a variable in every "
              "rank (repeatable).")
@click.option("--hostfile", type=str, help="Hosts to run on, one 'host slots=N' per line "
              "(DeepSpeed format).")
@click.option("--include", help="Only these hosts/cards, e.g. node1:0,2@node2.")
@click.option("--exclude", help="Not these hosts/cards, e.g. node3@node1:7.")
@click.option("--nnodes", type=int, help="Use the first N hosts; without a hostfile, the "
              "number of nodes of a job started by hand on each node.")
@click.option("--node-rank", type=int, help="This node's index in a job started by hand "
              "(with --nnodes, --master-addr, --master-port).")
@click.option("--launcher", "launcher_kind", type=click.Choice(["auto", "local", "ssh", "slurm",
              "mpi"]), default="auto", show_default=True, help="How node agents start: slurm "
              "inside an allocation, else ssh with a hostfile, else local.")
@click.option("--ssh-port", type=int, help="Port of sshd on the hosts.")
@click.option("--ssh-option", "ssh_options", multiple=True, help="Extra ssh arguments, e.g. "
              "'-F ~/.ssh/cluster_config' (repeatable).")
@click.option("--launcher-args", help="Extra arguments for srun or mpirun, one string.")
@click.option("--no-preflight", is_flag=True, help="Skip the host checks before a multi-node "
              "launch.")
@click.option("--parallel", "parallel_mode", type=click.Choice(["data", "semi", "auto"]),
              help="Parallel mode the ranks apply (parallel.init) [default: data].")
@click.option("--dp", type=int, help="Data-parallel size [default: world / (mp*pp)].")
@click.option("--mp", type=int, help="Model-parallel (tensor) size [default: 1].")
@click.option("--pp", type=int, help="Pipeline stages [default: 1].")
@click.option("--micro-batches", type=int, help="Pipeline micro-batches (>= pp).")
@click.option("--optimizer-shard/--no-optimizer-shard", default=None,
              help="Shard optimizer state across data-parallel ranks.")
@click.option("--gradients-mean/--no-gradients-mean", default=None,
              help="Average (not sum) gradients across ranks [default: mean].")
@click.option("--full-batch", is_flag=True, default=None, help="Every rank reads the whole "
              "batch (semi/auto modes).")
@click.option("--global-batch", type=int, help="Global batch size, checked to divide by "
              "dp*micro-batches.")
@click.option("--seed", type=int, help="Seed every rank alike [default: 1].")
@click.option("--config", "config_file", type=str, help="YAML file of these options; flags given "
              "here win.")
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_command(ctx: click.Context, **options: Any) -> int:
    """Run SCRIPT once per card and supervise it until the job ends."""
    config = build_config(ctx, options)
    return launch(config, os.environ, sys.stdout, sys.stderr)


@cli.command("preflight")
@click.option("--hostfile", required=True, help="Hosts to check (DeepSpeed format).")
@click.option("--include", help="Only these hosts/cards.")
@click.option("--exclude", help="Not these hosts/cards.")
@click.option("--nnodes", type=int, help="Check the first N hosts.")
@click.option("--device", type=click.Choice([k.value for k in DeviceKind]), default="auto",
              show_default=True, help="npu: each host needs a card per slot.")
@click.option("--master-port", type=int, help="Check this port is free on the first host.")
@click.option("--ssh-port", type=int, help="Port of sshd on the hosts.")
@click.option("--ssh-option", "ssh_options", multiple=True, help="Extra ssh arguments.")
def preflight_command(hostfile: str, include: Optional[str], exclude: Optional[str],
                      nnodes: Optional[int], device: str, master_port: Optional[int],
                      ssh_port: Optional[int], ssh_options: tuple[str, ...]) -> int:
    """Check every host of HOSTFILE in parallel and print one table; exit 1 if any fails."""
    hosts = select_hosts(read_hostfile(hostfile), include, exclude, nnodes)
    checks = run_preflight(hosts, TransportOptions(ssh_port, ssh_options), os.getcwd(),
                           DeviceKind(device), master_port)
    click.echo(render(checks))
    return 0 if all(c.ok for c in checks) else 1


cli.add_command(rank_table)
cli.add_command(report)


def build_config(ctx: click.Context, options: dict[str, Any]) -> LaunchConfig:
    """Options (and the ``--config`` file under them) -> a checked ``LaunchConfig``."""
    section: dict[str, Any] = {}
    if options["config_file"]:
        options, section = _apply_config_file(ctx, options, options["config_file"])
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
        kill_timeout=options["kill_timeout"],
        startup_timeout=options["startup_timeout"],
        debug=options["debug"],
        dry_run=options["dry_run"],
        json=options["as_json"],
        env=parse_env_pairs(options["env_pairs"]),
        python=sys.executable,
        workdir=os.getcwd(),
        hostfile=options["hostfile"],
        include=options["include"],
        exclude=options["exclude"],
        nnodes=options["nnodes"],
        node_rank=options["node_rank"],
        launcher=options["launcher_kind"],
        ssh_port=options["ssh_port"],
        ssh_options=tuple(options["ssh_options"]),
        launcher_args=tuple(shlex.split(options["launcher_args"] or "")),
        preflight=not options["no_preflight"],
        server_id=options["server_id"],
        hang_timeout=options["hang_timeout"],
        max_restarts=options["max_restarts"],
        parallel=_parallel_config(options, section),
    )


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


def _apply_config_file(ctx: click.Context, options: dict[str, Any],
                       path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Options under the file's values; also the file's ``parallel:`` section, if a mapping."""
    settings = read_config_file(path)
    section: dict[str, Any] = {}
    if isinstance(settings.get("parallel", FileSetting(None, 0)).value, dict):
        line = settings["parallel"].line
        section = settings.pop("parallel").value
        try:
            ParallelConfig.from_mapping(section)
        except ConfigError as e:
            raise ConfigError(f"{path}:{line}: {e.message}") from None
    by_key = {_file_key(p): p for p in ctx.command.params if p.name and p.name != "config_file"}
    check_known_keys(path, settings, by_key)
    merged = dict(options)
    for key, setting in settings.items():
        param = by_key[key]
        if ctx.get_parameter_source(param.name) in (ParameterSource.DEFAULT, None) or \
                (key in _FILE_ONLY_KEYS and not options[param.name]):
            merged[param.name] = _cast(ctx, param, setting, path, key)
    return merged, section


def _file_key(param: click.Parameter) -> str:
    """Config-file keys are the long option names: ``console`` for ``console_ranks``."""
    if isinstance(param, click.Option):
        return param.opts[-1].lstrip("-").replace("-", "_")
    return str(param.name)


def _cast(ctx: click.Context, param: click.Parameter, setting: FileSetting, path: str,
          key: str) -> Any:
    value = setting.value
    if key == "env" and isinstance(value, dict):
        value = [f"{k}={v}" for k, v in value.items()]
    if param.multiple or param.nargs == -1:
        value = value if isinstance(value, list) else [value]
        value = [str(v) for v in value] if key in ("env", "script_args") else value
    elif isinstance(param.type, click.types.StringParamType) and value is not None:
        value = str(value)
    try:
        return param.type_cast_value(ctx, value)
    except click.BadParameter as e:
        raise ConfigError(f"{path}:{setting.line}: {key}: {e.message}") from None


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point: every error is one line on stderr; exit code 2 for bad input."""
    try:
        code = cli.main(args=list(argv) if argv is not None else None, prog_name="npu-launch",
                        standalone_mode=False)
    except click.ClickException as e:
        click.echo(f"npu-launch: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
