"""The ``npu-launch`` command: parse, build a frozen config, hand it to one function that acts.

``npu-launch [OPTIONS] SCRIPT [ARGS]...`` is the ``run`` subcommand; the other subcommands
(``rank-table``, ...) are named explicitly. This is the only module that exits.
"""
from __future__ import annotations

import io
import os
import sys
from typing import Any, Optional, Sequence

import click

from launcher import __version__
from launcher.cli.diagnose import diagnose_command
from launcher.cli.help_groups import EXAMPLES, GroupedCommand, HelpGroup
from launcher.cli.rank_table import rank_table
from launcher.cli.run_config import build_config, pointing_at, working_dir
from launcher.cli.standard_output import console_stream, hold_standard_fds, print_out
from launcher.cli.whole_numbers import WHOLE_NUMBER
from launcher.cluster.backends import LauncherKind, TransportOptions
from launcher.cluster.preflight import render, run_preflight
from launcher.config import msrun_args, msrun_compat
from launcher.config.devices import DeviceKind
from launcher.config.hostfile import read_hostfile, select_hosts
from launcher.config.launch_config import LaunchConfig, fanout_in_force
from launcher.job import make_job
from launcher.launch import launch
from launcher.observe.report import report
from parallel import contract


class LaunchGroup(HelpGroup):
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


@cli.command("run", cls=GroupedCommand, context_settings={"ignore_unknown_options": True,
                                      "allow_interspersed_args": False})
@click.option("--cards", type=WHOLE_NUMBER, help="Processes on this node, one per card [default: all "
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
@click.option("--master-port", type=WHOLE_NUMBER, help="Scheduler port [default: a free port].")
@click.option("--log-dir", type=str, help="Logs go here [default: ./npu_launch_logs/<job id>].")
@click.option("--job-id", type=str, help="Name of this job [default: time and a random tag; in a "
              "Slurm batch script slurm-<SLURM_JOB_ID>-<command digits>, found again on requeue].")
@click.option("--console", "console_ranks", default="all", show_default=True,
              help="Ranks whose lines the console shows: all, none, or e.g. 0,3.")
@click.option("--runtime-logs", is_flag=True,
              help="Show MindSpore's own INFO and WARNING log lines on the console too (they "
              "always go to the rank logs).")
@click.option("--merge-lines/--no-merge-lines", default=True, show_default=True,
              help="Show a line that several ranks print alike once, as [host:0-7] line.")
@click.option("--kill-timeout", type=float, default=10.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping processes; on a stop "
              "signal, also the time trainer ranks get to save a checkpoint and exit first.")
@click.option("--startup-timeout", type=float, default=300.0, show_default=True,
              help="Stop the job when a rank has not initialised communication by then (0: "
              "never).")
@click.option("--hang-timeout", type=float,
              help="Stop the job when ranks make no progress for this long, naming the rank "
              "that hangs (0: never) [default: learnt from the job: a rank is hung once it is "
              "frozen, with no progress, CPU, I/O or child process, for 5 x the longest interval "
              "between steps, at least --hang-floor, while the others wait; 600 until one "
              "interval was seen].")
@click.option("--hang-grace", type=float, default=1800.0, show_default=True,
              help="The same, before a rank's first training step, after a checkpoint load and "
              "while MindSpore compiles a graph.")
@click.option("--hang-floor", type=float, default=10.0, show_default=True,
              help="The least the learnt hang limit is, in seconds.")
@click.option("--exit-timeout", type=float, default=60.0, show_default=True,
              help="Once every rank's script ended cleanly, stop the ranks still in their exit "
              "handlers after this many seconds, counted as exited 0 (0: wait without a "
              "limit).")
@click.option("--max-restarts", type=WHOLE_NUMBER, default=0, show_default=True,
              help="Restart the whole job after a failure or a hang, this many times at most "
              "in all (one budget for every node; not after start-up errors).")
@click.option("--restart-backoff", type=float, help="Seconds to wait before the first restart, "
              "doubled before each next one [default: the first at once, then 1].")
@click.option("--restart-backoff-max", type=float, help="The longest wait between two attempts "
              "[default: 60].")
@click.option("--min-nodes", type=WHOLE_NUMBER, help="Leave a host whose ranks caused the last two "
              "failures out of the next attempt, while at least this many hosts remain "
              "(data parallelism: the global batch is kept).")
@click.option("--card-free-timeout", type=float, default=60.0, show_default=True,
              help="Before a restart, seconds to wait until no process holds the cards of the "
              "hosts whose ranks failed; then their health is checked again.")
@click.option("--bind-cores", metavar="auto|none|LIST", help="Bind each rank to CPU cores: "
              "auto (each card's CPU affinity from npu-smi, else this host's allowed cores "
              "split by local rank), none, or cores to split, e.g. 0-15 [default: none; auto "
              "with --bind-numa].")
@click.option("--bind-numa", is_flag=True, help="Also bind each rank's memory to the NUMA "
              "nodes of its cores (needs numactl).")
@click.option("--rank-table-timeout", type=float, help="In an operator's Kubernetes pod: "
              "seconds to wait for its rank table to read completed (0: no limit) [default: "
              "300].")
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
@click.option("--nnodes", type=WHOLE_NUMBER, help="Use the first N hosts; without a hostfile, the "
              "number of nodes of a job started by hand on each node.")
@click.option("--node-rank", type=WHOLE_NUMBER, help="This node's index in a job started by hand "
              "(with --nnodes, --master-addr, --master-port).")
@click.option("--launcher", "launcher_kind", type=click.Choice([k.value for k in LauncherKind]),
              default="auto", show_default=True, help="How node agents start: slurm "
              "inside an allocation, else ssh with a hostfile, else local (in an operator's "
              "Kubernetes pod: this pod's share; an explicit value turns that off).")
@click.option("--ssh-port", type=WHOLE_NUMBER, help="Port of sshd on the hosts.")
@click.option("--ssh-option", "ssh_options", multiple=True, help="Extra ssh arguments, e.g. "
              "'-F ~/.ssh/cluster_config' (repeatable).")
@click.option("--launcher-args", help="Extra arguments for srun or mpirun, one string.")
@click.option("--fanout", type=WHOLE_NUMBER, help="At most this many ssh connections being set up at "
              "once: preflight, --sync-workdir, and the node agents until each has started "
              "(ssh; srun starts a Slurm job's nodes itself) [default: 32].")
@click.option("--no-preflight", is_flag=True, help="Skip the host checks before a multi-node "
              "launch.")
@click.option("--sync-workdir", is_flag=True, help="Copy the launch directory (logs left out, "
              "100 MiB at most) over ssh to the hosts that lack it or where preflight finds its "
              "files different.")
@click.option("--checkpoint-collect/--no-checkpoint-collect", default=True, show_default=True,
              help="Without shared storage, send node 0 what a restart needs (every slice of a "
              "model- or pipeline-parallel checkpoint, one data-parallel replica if node 0 runs "
              "no rank); --no-checkpoint-collect keeps files on their hosts (a wiped host then "
              "fails a restart).")
@click.option("--compile-cache/--no-compile-cache", default=True, show_default=True,
              help="Keep MindSpore's compile cache in the log dir, so that a restart loads its "
              "graphs instead of compiling them (unless MS_COMPILER_CACHE_ENABLE or "
              "MS_COMPILER_CACHE_PATH is set).")
@click.option("--parallel", "parallel_mode", type=click.Choice(["data", "semi", "auto"]),
              help="Parallel mode the ranks apply (parallel.init) [default: data].")
@click.option("--dp", type=WHOLE_NUMBER, help="Data-parallel size [default: world / (mp*pp)].")
@click.option("--mp", type=WHOLE_NUMBER, help="Model-parallel (tensor) size [default: 1].")
@click.option("--pp", type=WHOLE_NUMBER, help="Pipeline stages [default: 1].")
@click.option("--micro-batches", type=WHOLE_NUMBER, help="Pipeline micro-batches (>= pp).")
@click.option("--optimizer-shard/--no-optimizer-shard", default=None,
              help="Shard optimizer state across data-parallel ranks.")
@click.option("--gradients-mean/--no-gradients-mean", default=None,
              help="Average (not sum) gradients across ranks [default: mean].")
@click.option("--full-batch", is_flag=True, default=None, help="Every rank reads the whole "
              "batch (semi/auto modes).")
@click.option("--global-batch", type=WHOLE_NUMBER, help="Global batch size, checked to divide by "
              "dp*micro-batches.")
@click.option("--seed", type=WHOLE_NUMBER, help="Seed every rank alike [default: 1].")
@click.option("--config", "config_file", type=str, help="YAML file of these options; flags given "
              "here win.")
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_command(ctx: click.Context, **options: Any) -> int:
    """Run SCRIPT once per card and supervise it until the job ends."""
    config, origins = build_config(ctx, options)
    with pointing_at(origins):
        return _launch(config)


@cli.command("preflight")
@click.option("--hostfile", required=True, help="Hosts to check (DeepSpeed format).")
@click.option("--include", help="Only these hosts/cards.")
@click.option("--exclude", help="Not these hosts/cards.")
@click.option("--nnodes", type=WHOLE_NUMBER, help="Check the first N hosts.")
@click.option("--device", type=click.Choice([k.value for k in DeviceKind]), default="auto",
              show_default=True, help="npu: each host needs a card per slot.")
@click.option("--master-port", type=WHOLE_NUMBER, help="Check this port is free on the first host.")
@click.option("--ssh-port", type=WHOLE_NUMBER, help="Port of sshd on the hosts.")
@click.option("--ssh-option", "ssh_options", multiple=True, help="Extra ssh arguments.")
@click.option("--fanout", type=WHOLE_NUMBER, help="At most this many hosts being asked at once "
              "[default: 32].")
def preflight_command(hostfile: str, include: Optional[str], exclude: Optional[str],
                      nnodes: Optional[int], device: str, master_port: Optional[int],
                      ssh_port: Optional[int], ssh_options: tuple[str, ...],
                      fanout: Optional[int]) -> int:
    """Check every host of HOSTFILE in parallel and print one table; exit 1 if any fails."""
    options = TransportOptions(ssh_port, ssh_options, fanout=fanout_in_force(fanout))
    hosts = select_hosts(read_hostfile(hostfile), include, exclude, nnodes)
    checks = run_preflight(hosts, options, working_dir(), DeviceKind(device), master_port)
    click.echo(render(checks))
    return 0 if all(c.ok for c in checks) else 1


cli.add_command(rank_table)
cli.add_command(report)
cli.add_command(diagnose_command)


@cli.command("msrun", add_help_option=False, context_settings={
    "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def msrun_command(argv: tuple[str, ...]) -> int:
    """Run an msrun command line (msrun 2.10's options, as msrun spells them) the npu-launch
    way; see npu-launch msrun --help."""
    parsed = msrun_args.parse(argv, run_option_arity())
    if parsed.help:
        click.echo(msrun_args.HELP, nl=False)
        click.echo(f"\nExample:\n  {EXAMPLES['msrun']}")
        return 0
    config, translation = msrun_config(parsed)
    with msrun_compat.in_msrun_words(parsed):
        # Every check the launch makes, before the notes: a bad value stays one line.
        make_job(config, os.environ, io.StringIO())
        for note in translation.notes:
            click.echo(f"npu-launch msrun: {note}", err=True)
        return _launch(config)


def _launch(config: LaunchConfig) -> int:
    """``launch``, with standard output closed, full or a pipe nobody reads: a plan that
    cannot be written is an error, rank lines that cannot are left to the rank logs."""
    if not config.dry_run:
        return launch(config, os.environ, console_stream(), sys.stderr)
    plan = io.StringIO()
    code = launch(config, os.environ, plan, sys.stderr)
    print_out(plan.getvalue(), "the plan")
    return code


def msrun_config(parsed: msrun_args.MsrunArgs
                 ) -> tuple[LaunchConfig, msrun_compat.Translation]:
    """The ``LaunchConfig`` ``npu-launch run`` builds from the msrun command line's translation."""
    translation = msrun_compat.translate(parsed)
    with msrun_compat.in_msrun_words(parsed), \
            run_command.make_context("npu-launch msrun", list(translation.run_args)) as ctx:
        config, _ = build_config(ctx, ctx.params)
    return config, translation


def run_option_arity() -> dict[str, bool]:
    """``run``'s long options, each with whether it takes a value."""
    return {name: not p.is_flag for p in run_command.params if isinstance(p, click.Option)
            for name in (*p.opts, *p.secondary_opts) if name.startswith("--")}


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point, and the one place errors become exits: bad input is one line and exit 2;
    an exception of any other kind is a bug in npu-launch, said in one line with exit 1."""
    hold_standard_fds()
    try:
        code = cli.main(args=list(argv) if argv is not None else None, prog_name="npu-launch",
                        standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        # A command without what it needs (``npu-launch``, ``npu-launch rank-table``): its help,
        # as click itself shows it (on stderr, exit 2), not squeezed into one error line.
        e.show()
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"npu-launch: error: {one_line(e.format_message())}", err=True)
        sys.exit(e.exit_code)
    except contract.BadInput as e:  # from the rank side's pure modules (a parallel layout)
        click.echo(f"npu-launch: error: {one_line(e.message)}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the last line of defence, and it says so
        if os.environ.get(contract.TRACEBACK):
            raise
        click.echo(f"npu-launch: internal error: {type(e).__name__}: {one_line(str(e))} (a bug "
                   f"in npu-launch; {contract.TRACEBACK}=1 shows where)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


_MESSAGE_CHARS = 500


def one_line(message: str) -> str:
    """A message as one bounded line: control characters escaped, the middle cut if long."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message.strip())
    if len(text) <= _MESSAGE_CHARS:
        return text
    half = _MESSAGE_CHARS // 2
    return f"{text[:half]} ...({len(text) - 2 * half} chars)... {text[-half:]}"


if __name__ == "__main__":
    main()
