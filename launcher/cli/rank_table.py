"""``npu-launch rank-table``: generate, merge, validate, show and build HCCL rank tables.

Each command only parses options, builds a frozen config and calls one function. Bad input raises
a ``LaunchError`` (the library's ``BadInput`` becomes one too): exit code 2, one line; ``python -m
launcher.cli.rank_table`` runs the group on its own.
"""
from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import click

from launcher.cli.rank_table_cluster import ClusterConfig, cluster_table, parse_host_paths
from launcher.cli.standard_output import print_out
from launcher.errors import ConfigError, LaunchError
from launcher.limits import MAX_NODES, shown, whole_number
from parallel import contract
from parallel.contract import BadInput
from rank_tables.ascend import DEFAULT_DEVFS, DEFAULT_HCCN_CONF, AscendHost, this_host_ip
from rank_tables.bounded import display_name
from rank_tables.errors import RankTableError
from rank_tables.generate import GenerateConfig, GeneratedServer, generate_server, parse_assignments, parse_device_list
from rank_tables.host_devices import tool_path
from rank_tables.merge import merge_tables
from rank_tables.show import format_table
from rank_tables.table import InvalidRankTable, RankTable, load_rank_table
from rank_tables.validate import MAX_PORT

STDOUT = "-"


class WholeNumber(click.ParamType):
    """A number written in ASCII digits, at most ``maximum``: click's ``int`` takes ``"١٢"``,
    ``"1_000"`` and 4000 digits."""

    name = "integer"

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum

    def convert(self, value: object, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        if isinstance(value, int):
            return value
        number = whole_number(str(value))
        if number is None or number > self.maximum:
            self.fail(f"{shown(value)} is not a whole number within 0-{self.maximum}", param, ctx)
        return number


PORT = WholeNumber(MAX_PORT)


class _LibraryErrorsGroup(click.Group):
    """The rank-table library raises plain ``BadInput``; here they become click's errors, so
    the group says them in one line with exit code 2 however it is run."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BadInput as e:
            raise LaunchError(e.message) from None


@click.group(name="rank-table", cls=_LibraryErrorsGroup)
def rank_table() -> None:
    """HCCL rank tables for Ascend rank-table mode (RANK_TABLE_FILE)."""


@rank_table.command()
@click.option("--server-id", help="The server's id in the table. [default: this host's IP]")
@click.option("--devices", "devices_text", metavar="IDS",
              help="Logical device ids to use: 0-7, 0,2,4,6 or [0,8). [default: all visible]")
@click.option("--visible-devices", "visible_text", metavar="IDS",
              help="Physical ids of the visible devices, in logical order. [default: the davinciN nodes]")
@click.option("--format", "version", type=click.Choice(["1.0", "1.2"]), default="1.0", show_default=True,
              help="1.0: Ascend 910 / Atlas A2. 1.2: Atlas A3 SuperPoD.")
@click.option("--device-ip", "device_ips", multiple=True, metavar="N=IP",
              help="Physical device N's NIC address by hand (wins over hccn_tool and hccn.conf). Repeatable.")
@click.option("--hccn-conf", type=click.Path(path_type=Path), default=DEFAULT_HCCN_CONF, show_default=True,
              help="Read when hccn_tool gives no address.")
@click.option("--device-port", type=PORT, help="device_port of every device.")
@click.option("--host-port", type=PORT, metavar="BASE", help="host_port BASE, BASE+1, ... per device.")
@click.option("--host-ip", help="host_ip of the server.")
@click.option("--super-pod-id", help="1.2: the super pod id. [default: from npu-smi]")
@click.option("--super-device-id", "super_device_ids", multiple=True, metavar="N=SDID",
              help="1.2: physical device N's super_device_id. [default: from npu-smi]")
@click.option("--backup-device-ip", "backup_ips", multiple=True, metavar="N=IP",
              help="1.2: physical device N's backup IP.")
@click.option("--backup-device-port", type=PORT, help="1.2: backup_device_port of every device.")
@click.option("--devfs", type=click.Path(path_type=Path), envvar=contract.DEVFS, default=DEFAULT_DEVFS,
              show_default=True, help=f"Where the davinciN device nodes are (env {contract.DEVFS}).")
@click.option("-o", "--output", help="Output file, '-' for stdout. [default: hccl_{N}p_{ids}_{server_id}.json]")
def generate(server_id: Optional[str], devices_text: Optional[str], visible_text: Optional[str], version: str,
             device_ips: Sequence[str], hccn_conf: Path, device_port: Optional[int], host_port: Optional[int],
             host_ip: Optional[str], super_pod_id: Optional[str], super_device_ids: Sequence[str],
             backup_ips: Sequence[str], backup_device_port: Optional[int], devfs: Path,
             output: Optional[str]) -> None:
    """One server's table from this host's devices (like hccl_tools.py)."""
    config = GenerateConfig(
        server_id=this_host_ip() if server_id is None else _given("--server-id", server_id),
        version=version,
        devices=parse_device_list(devices_text) if devices_text else None,
        visible_devices=parse_device_list(visible_text, "--visible-devices") if visible_text else None,
        device_ips=parse_assignments(device_ips, "--device-ip"),
        device_port=device_port,
        host_port=host_port,
        host_ip=host_ip,
        super_pod_id=super_pod_id,
        super_device_ids=parse_assignments(super_device_ids, "--super-device-id", "3"),
        backup_device_ips=parse_assignments(backup_ips, "--backup-device-ip"),
        backup_device_port=backup_device_port,
    )
    host = AscendHost(devfs=devfs, tool_path=_tool_path(), hccn_conf=hccn_conf)
    generated = generate_server(config, host)
    _write(generated.table, output or generated.default_filename())
    _report_sources(generated)


@rank_table.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", help="Output file, '-' for stdout. [default: hccl_{S}s_{N}p.json]")
def merge(files: Sequence[Path], output: Optional[str]) -> None:
    """One cluster table from per-server tables, ranks following argument order."""
    merged = merge_tables([(str(f), load_rank_table(f)) for f in files])
    _write(merged, output or f"hccl_{len(merged.servers)}s_{merged.rank_count}p.json")


@rank_table.command(name="from-hostfile")
@click.argument("hostfile", type=click.Path(path_type=Path))
@click.option("--hccn-conf", "hccn_confs", multiple=True, metavar="HOST=PATH",
              help="A copy of HOST's /etc/hccn.conf. Repeatable; needed for every selected host for now.")
@click.option("--include", help="Hosts and cards to use: node1@node2:0,2")
@click.option("--exclude", help="Hosts and cards to leave out: node2:7")
@click.option("--nnodes", type=WholeNumber(MAX_NODES), help="Use only the first N hosts.")
@click.option("--device-port", type=PORT, help="device_port of every device.")
@click.option("-o", "--output", help="Output file, '-' for stdout. [default: hccl_{S}s_{N}p.json]")
def from_hostfile(hostfile: Path, hccn_confs: Sequence[str], include: Optional[str], exclude: Optional[str],
                  nnodes: Optional[int], device_port: Optional[int], output: Optional[str]) -> None:
    """The whole cluster's v1.0 table from a DeepSpeed-style hostfile."""
    config = ClusterConfig(hostfile=hostfile, hccn_confs=parse_host_paths(hccn_confs), include=include,
                           exclude=exclude, nnodes=nnodes, device_port=device_port)
    table = cluster_table(config)
    _write(table, output or f"hccl_{len(table.servers)}s_{table.rank_count}p.json")


@rank_table.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate(files: Sequence[Path]) -> None:
    """Check tables' structure and meaning; report every problem with its JSON path.

    A valid table gets one line on stdout. When there is more than one problem, every problem is
    listed on stdout and the error line gives the first and the count.
    """
    problems: list[str] = []
    for path in files:
        try:
            table = load_rank_table(path)
        except InvalidRankTable as exc:
            problems.extend(exc.lines)
            continue
        except RankTableError as exc:
            problems.append(exc.message)
            continue
        print_out(f"{path}: valid rank table v{table.version}, {len(table.servers)} server(s), "
                  f"{table.rank_count} rank(s)\n", "the result")
    if len(problems) > 1:
        print_out("\n".join(problems) + "\n", "the problems")
        raise RankTableError(f"{problems[0]} ({len(problems)} problems in all, listed above)")
    if problems:
        raise RankTableError(problems[0])


@rank_table.command()
@click.argument("file", type=click.Path(path_type=Path))
def show(file: Path) -> None:
    """Print a table of rank, server, device and device IP."""
    print_out(format_table(load_rank_table(file)), "the table")


def _given(option: str, value: str) -> str:
    """An option's value as given; an empty one is refused (it is not the option left out)."""
    if not value.strip():
        raise ConfigError(f"{option}: empty (leave the option out for its default)")
    return value


def _tool_path() -> str:
    return tool_path(os.environ)


def _write(table: RankTable, output: str) -> None:
    text = table.dumps()
    if output == STDOUT:
        print_out(text, "the table")
        return
    try:  # a FIFO nobody reads would block the open for ever: not blocking, it fails (ENXIO)
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
        os.set_blocking(fd, True)
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        why = "a pipe nobody reads" if exc.errno == errno.ENXIO else exc.strerror or exc
        raise ConfigError(f"{display_name(output)}: cannot write: {why}") from None
    click.echo(f"wrote {output}: {len(table.servers)} server(s), {table.rank_count} rank(s)", err=True)


def _report_sources(generated: GeneratedServer) -> None:
    sources: dict[str, list[str]] = {}
    for device, found in generated.device_ips.items():
        sources.setdefault(found.source, []).append(str(device))
    for source, devices in sources.items():
        click.echo(f"device IPs of device(s) {','.join(devices)} from {source}", err=True)


if __name__ == "__main__":
    sys.exit(rank_table.main(prog_name="npu-launch rank-table"))
