"""Reading what ranks report: each rank appends JSON lines to its own events file, which
``EventTail`` parses into ``contract.Event`` values as they arrive."""
from __future__ import annotations

import json
import os
from typing import BinaryIO, Iterable, Iterator, Optional

from parallel.contract import Event


class EventTail:
    """Follows one events file, returning only complete new lines on each ``read``.

    The file stays open once it exists, and a poll with nothing new costs one ``fstat``: the
    supervisor polls every rank's file 50 times a second.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: Optional[BinaryIO] = None
        self._offset = 0
        self._partial = b""

    def read(self) -> list[Event]:
        if self._file is None:
            try:
                self._file = open(self.path, "rb")
            except FileNotFoundError:
                return []
        if os.fstat(self._file.fileno()).st_size == self._offset:
            return []
        data = self._file.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return list(parse_events(lines))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def parse_events(lines: Iterable[bytes]) -> Iterator[Event]:
    """The events among ``lines``, skipping lines that are not one."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and (event := Event.parse(record)) is not None:
            yield event


def prepare_dirs(log_dir: str, paths: Iterable[str] = ()) -> None:
    """Make the job's log dir and the folder of every file the processes will write."""
    for folder in {log_dir, *(os.path.dirname(p) for p in paths if p)}:
        os.makedirs(folder, exist_ok=True)
