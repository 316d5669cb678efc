"""Write training data as MindRecord files for ``parallel.data.sharded_dataset``.

    python scripts/prepare_data.py digits OUT.mindrecord --files 4
    python scripts/prepare_data.py npz ARRAYS.npz OUT.mindrecord
    python scripts/prepare_data.py folder IMAGES/ OUT.mindrecord

``digits`` is scikit-learn's 8x8 handwritten digits (shipped inside the package, no download):
``image`` float32 (1, 8, 8) scaled to [0, 1] and ``label`` int32. ``npz`` writes one column per
array of an ``.npz`` file. ``folder`` writes an image-class tree as encoded ``image`` bytes and an
int32 ``label``. Each prints the files it wrote.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List

import click
import numpy as np

from parallel.data import write_mindrecord, write_mindrecord_from_folder

FILES = click.option("--files", "num_files", type=int, default=1, show_default=True,
                     help="How many MindRecord files to split the samples into.")
OVERWRITE = click.option("--overwrite", is_flag=True, help="Replace existing files.")


class PrepareError(click.ClickException):
    """Bad input data or an existing output: one line, no traceback."""


@click.group()
def main() -> None:
    """Write training data as MindRecord files."""


@main.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@FILES
@OVERWRITE
def digits(out: Path, num_files: int, overwrite: bool) -> None:
    """scikit-learn's 8x8 digits (1797 samples)."""
    _report(lambda: write_mindrecord(digits_arrays(), out, num_files, overwrite=overwrite))


@main.command()
@click.argument("arrays", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@FILES
@OVERWRITE
def npz(arrays: Path, out: Path, num_files: int, overwrite: bool) -> None:
    """Every array of an .npz file as one column (all the same length)."""
    with np.load(arrays) as loaded:
        columns = {name: loaded[name] for name in loaded.files}
    _report(lambda: write_mindrecord(columns, out, num_files, overwrite=overwrite))


@main.command()
@click.argument("images", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@FILES
@OVERWRITE
def folder(images: Path, out: Path, num_files: int, overwrite: bool) -> None:
    """An image folder with one sub-folder per class."""
    _report(lambda: write_mindrecord_from_folder(images, out, num_files, overwrite=overwrite))


def digits_arrays() -> Dict[str, np.ndarray]:
    """The digits as ``image`` (N, 1, 8, 8) float32 in [0, 1] and ``label`` (N,) int32."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return {"image": (bunch.images / 16.0).astype(np.float32)[:, None],
            "label": bunch.target.astype(np.int32)}


def _report(write: Callable[[], List[Path]]) -> None:
    try:
        files = write()
    except (ValueError, FileExistsError) as exc:
        raise PrepareError(str(exc)) from None
    for file in files:
        click.echo(str(file))


if __name__ == "__main__":
    main()
