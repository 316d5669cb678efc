"""``npu-launch --help`` in groups, with defaults shown, and one example per command.

The ``run`` command's options are listed under the headings of ``OPTION_GROUPS`` (click's own
help sections, as ``Options`` is one), each with its default. Every command gets an ``Example``
section from ``EXAMPLES``, keyed by its path below ``npu-launch``; commands registered on a
``HelpGroup`` get theirs as they are added, from whichever module defines them.
"""
from __future__ import annotations

from typing import Iterable, Optional

import click

OPTION_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("The job", ("--cards", "--device", "--config", "--env", "--dry-run", "--json", "--debug")),
    ("Hosts", ("--hostfile", "--include", "--exclude", "--nnodes", "--node-rank", "--master-addr",
               "--master-port", "--launcher", "--ssh-port", "--ssh-option", "--launcher-args",
               "--fanout", "--no-preflight", "--sync-workdir", "--rank-table", "--server-id",
               "--rank-table-timeout")),
    ("Failures and restarts", ("--kill-timeout", "--max-restarts", "--restart-backoff",
                               "--restart-backoff-max", "--min-nodes", "--card-free-timeout",
                               "--checkpoint-collect", "--compile-cache")),
    ("Hangs", ("--startup-timeout", "--hang-timeout", "--hang-grace", "--hang-floor",
               "--exit-timeout")),
    ("Logs and console", ("--log-dir", "--job-id", "--console", "--runtime-logs",
                          "--merge-lines")),
    ("Binding", ("--bind-cores", "--bind-numa")),
    ("Parallel layout", ("--parallel", "--dp", "--mp", "--pp", "--micro-batches",
                         "--optimizer-shard", "--gradients-mean", "--full-batch",
                         "--global-batch", "--seed")),
)
"""The run command's option groups, in the order ``--help`` shows them; an option is named by
its first long name. Options in no group (``--help``) come last, under ``Other options``."""

OTHER_OPTIONS = "Other options"

EXAMPLES: dict[str, str] = {
    "run": "npu-launch --cards 8 train.py --lr 0.1",
    "preflight": "npu-launch preflight --hostfile hosts",
    "report": "npu-launch report npu_launch_logs/20261201-165259-1a6e",
    "diagnose": "npu-launch diagnose npu_launch_logs/20261201-165259-1a6e ~/ascend/log/debug/plog",
    "rank-table": "npu-launch rank-table generate --devices 0-7",
    "rank-table generate": "npu-launch rank-table generate --devices 0-7 -o hccl_8p.json",
    "rank-table merge": "npu-launch rank-table merge node1.json node2.json -o cluster.json",
    "rank-table from-hostfile": "npu-launch rank-table from-hostfile hosts "
                                "--hccn-conf node1=node1.hccn.conf --hccn-conf node2=node2.hccn.conf",
    "rank-table validate": "npu-launch rank-table validate cluster.json",
    "rank-table show": "npu-launch rank-table show cluster.json",
    "msrun": "npu-launch msrun --worker_num=2 --local_worker_num=2 --join=True train.py",
}
"""One example command line per command, keyed by the command's path below ``npu-launch``."""


def group_of(option: click.Option) -> str:
    """The heading an option is listed under."""
    name = next((o for o in option.opts if o.startswith("--")), option.opts[0])
    return next((title for title, names in OPTION_GROUPS if name in names), OTHER_OPTIONS)


def example_epilog(path: str) -> Optional[str]:
    """The ``Example`` section of the command at ``path``, kept as written (``\\b``)."""
    example = EXAMPLES.get(path)
    return None if example is None else f"Example:\n\n\b\n  {example}"


def give_examples(command: click.Command, path: str) -> None:
    """Set the example of ``command`` and of every command below it, unless one is set."""
    if command.epilog is None:
        command.epilog = example_epilog(path)
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            give_examples(sub, f"{path} {name}")


class GroupedCommand(click.Command):
    """A command whose options ``--help`` lists in the sections of ``OPTION_GROUPS``, each
    with its default (options whose default is computed say it in their help)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown_before, ctx.show_default = ctx.show_default, True
        try:
            for title, rows in self._sections(ctx):
                with formatter.section(title):
                    formatter.write_dl(rows)
        finally:
            ctx.show_default = shown_before

    def _sections(self, ctx: click.Context) -> Iterable[tuple[str, list[tuple[str, str]]]]:
        rows: dict[str, list[tuple[str, str]]] = {}
        options = [p for p in self.get_params(ctx) if isinstance(p, click.Option)]
        for option in sorted(options, key=_place):
            record = option.get_help_record(ctx)
            if record is not None:
                rows.setdefault(group_of(option), []).append(record)
        titles = [title for title, _ in OPTION_GROUPS] + [OTHER_OPTIONS]
        return [(title, rows[title]) for title in titles if title in rows]


_ORDER = {name: i for i, name in enumerate(n for _, names in OPTION_GROUPS for n in names)}


def _place(option: click.Option) -> int:
    """Where an option comes in its group: the order of ``OPTION_GROUPS``, the rest last."""
    return min((_ORDER.get(name, len(_ORDER)) for name in option.opts), default=len(_ORDER))


class HelpGroup(click.Group):
    """A group whose commands, however they are added, get their example from ``EXAMPLES``."""

    def add_command(self, cmd: click.Command, name: Optional[str] = None) -> None:
        super().add_command(cmd, name)
        give_examples(cmd, name or cmd.name or "")
