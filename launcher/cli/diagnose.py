"""``npu-launch diagnose PATH...``: the likely cause in any log directory or files."""
from __future__ import annotations

import json

import click

from launcher.diagnose import diagnose_paths


@click.command("diagnose")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def diagnose_command(paths: tuple[str, ...], as_json: bool) -> int:
    """Match the logs under PATHS (npu-launch's, msrun's worker_N.log, torchrun's log dir,
    Slurm output, CANN plog folders) against npu-launch's knowledge of Ascend faults.

    Exit 0: nothing known found; 1: a fault was named; 2: nothing could be read."""
    diagnosis = diagnose_paths(list(paths))
    if as_json:
        click.echo(json.dumps({"diagnosis": diagnosis.to_json(), "notes": list(diagnosis.notes),
                               "files_read": diagnosis.files_read}, indent=2))
    else:
        for note in diagnosis.notes:
            click.echo(f"npu-launch: note: {note}", err=True)
        lines = diagnosis.block()
        if diagnosis.files_read == 0:
            click.echo(f"npu-launch: error: no readable log file in {' '.join(paths)}", err=True)
        else:
            click.echo("\n".join(lines) if lines else
                       f"npu-launch: no known fault in {diagnosis.files_read} file(s)")
    if diagnosis.files_read == 0:
        return 2
    return 1 if diagnosis.named else 0
