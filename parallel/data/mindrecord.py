"""Write MindRecord files from NumPy arrays or an image folder (for ``scripts/prepare_data.py``).

MindRecord stores numbers as int32, int64, float32 or float64 only, so narrower types are widened
on the way in (uint8 -> int32, float16 -> float32); a reader gets the widened type back.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Sequence, Tuple

import numpy as np

_NARROW = {np.dtype(t): name for t, name in [
    (np.bool_, "int32"), (np.int8, "int32"), (np.uint8, "int32"), (np.int16, "int32"),
    (np.uint16, "int32"), (np.int32, "int32"), (np.uint32, "int64"), (np.int64, "int64"),
    (np.float16, "float32"), (np.float32, "float32"), (np.float64, "float64")]}
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff")
_CHUNK = 1024


def write_mindrecord(arrays: Mapping[str, np.ndarray], path: os.PathLike | str, num_files: int = 1,
                     *, overwrite: bool = False) -> List[Path]:
    """Write one sample per row of ``arrays`` (all the same length) into ``num_files`` files.

    Returns the files written; pass any of them (or the list) to ``sharded_dataset``.
    """
    length = _common_length(arrays)
    schema = {name: _field_schema(name, array) for name, array in arrays.items()}
    rows = (_row(arrays, schema, index) for index in range(length))
    return _write(Path(path), num_files, schema, rows, length, overwrite)


def write_mindrecord_from_folder(folder: os.PathLike | str, path: os.PathLike | str,
                                 num_files: int = 1, *, extensions: Sequence[str] = IMAGE_EXTENSIONS,
                                 overwrite: bool = False) -> List[Path]:
    """Write an ``ImageFolderDataset``-style tree (one sub-folder per class) as encoded images.

    Columns: ``image`` (the file's bytes, still encoded: decode with ``vision.Decode``) and
    ``label`` (int32, the class folder's index in sorted order, as ``ImageFolderDataset`` numbers it).
    """
    files = list(_image_files(Path(folder), tuple(e.lower() for e in extensions)))
    if not files:
        raise ValueError(f"{folder}: no images with extensions {', '.join(extensions)} in class folders")
    schema = {"image": {"type": "bytes"}, "label": {"type": "int32"}}
    rows = ({"image": file.read_bytes(), "label": label} for file, label in files)
    return _write(Path(path), num_files, schema, rows, len(files), overwrite)


def mindrecord_files(path: os.PathLike | str, num_files: int) -> List[Path]:
    """The file names ``FileWriter`` gives ``num_files`` shards of ``path``."""
    base = Path(path)
    return [base] if num_files == 1 else [Path(f"{base}{index}") for index in range(num_files)]


def _write(path: Path, num_files: int, schema: Dict[str, Any], rows: Iterable[Dict[str, Any]],
           length: int, overwrite: bool) -> List[Path]:
    from mindspore.mindrecord import FileWriter

    if not 1 <= num_files <= length:
        raise ValueError(f"num_files must be between 1 and the {length} samples, got {num_files}")
    existing = [f for f in mindrecord_files(path, num_files) if f.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{existing[0]} already exists (overwrite replaces it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = FileWriter(str(path), num_files, overwrite=overwrite)
    writer.add_schema(schema, path.stem or "samples")
    for chunk in _chunks(rows, _CHUNK):
        writer.write_raw_data(chunk)
    writer.commit()
    return mindrecord_files(path, num_files)


def _common_length(arrays: Mapping[str, np.ndarray]) -> int:
    if not arrays:
        raise ValueError("write_mindrecord needs at least one array")
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"arrays must have one length, got {lengths}")
    return next(iter(lengths.values()))


def _field_schema(name: str, array: np.ndarray) -> Dict[str, Any]:
    array = np.asarray(array)
    if array.dtype.kind in "SO":
        return {"type": "bytes"}
    if array.dtype.kind == "U":
        return {"type": "string"}
    if array.dtype not in _NARROW:
        raise ValueError(f"column {name!r}: dtype {array.dtype} cannot be stored in MindRecord")
    field: Dict[str, Any] = {"type": _NARROW[array.dtype]}
    if array.ndim > 1:
        field["shape"] = list(array.shape[1:])
    return field


def _row(arrays: Mapping[str, np.ndarray], schema: Dict[str, Any], index: int) -> Dict[str, Any]:
    return {name: _value(np.asarray(array)[index], schema[name]["type"])
            for name, array in arrays.items()}


def _value(value: Any, kind: str) -> Any:
    if kind == "bytes":
        return bytes(value)
    if kind == "string":
        return str(value)
    array = np.asarray(value, dtype=kind)
    return array.item() if array.ndim == 0 else array


def _image_files(folder: Path, extensions: Tuple[str, ...]) -> Iterator[Tuple[Path, int]]:
    classes = sorted(entry.name for entry in folder.iterdir() if entry.is_dir())
    for label, name in enumerate(classes):
        for file in sorted((folder / name).iterdir()):
            if file.is_file() and file.suffix.lower() in extensions:
                yield file, label


def _chunks(rows: Iterable[Dict[str, Any]], size: int) -> Iterator[List[Dict[str, Any]]]:
    chunk: List[Dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
