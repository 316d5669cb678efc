"""The fast pass: one ``grep -F`` over every file at once for the knowledge base's literal
keys, then only the lines it names are read back and told apart by the full patterns.

Python's ``re`` tries every branch of an alternation at every byte (about 1 MB/s for this
knowledge base); GNU grep's fixed-string search of all keys at once runs at hundreds of MB/s,
in its own process (a 100 MB line costs its memory, not the launcher's). ``-o -b`` makes grep
print only the key and its byte offset, so its output stays small whatever the lines' length.
Where grep is missing, ``launcher.diagnose.scan`` reads the files in Python.
"""
from __future__ import annotations

import os
import resource
import shutil
import subprocess
import threading
import time
from typing import BinaryIO, Optional, Sequence

from launcher.diagnose.knowledge import Knowledge
from launcher.diagnose.scan import CONTEXT, Hit, Unreadable, add_hit, scan_file, sniff

MAX_CANDIDATES = 20_000
"""Candidate lines read back per file: a log that repeats a key a million times is named by
its first ones (its count is then a floor)."""


def scan_all(logs: Sequence[tuple[str, int]], knowledge: Knowledge,
             deadline: Optional[float] = None) -> dict[str, "list[Hit] | Unreadable"]:
    """Each file's hits from its start offset on, or why it was skipped. Files not reached by
    ``deadline`` (``time.monotonic()``) are left out of the answer."""
    results: dict[str, list[Hit] | Unreadable] = {}
    text = []
    for path, start in logs:
        try:
            sniff(path)
            text.append((path, start))
        except Unreadable as e:
            results[path] = e
    grep = shutil.which("grep")
    if grep is None:
        for path, start in text:
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                results[path] = scan_file(path, knowledge, start)
            except Unreadable as e:
                results[path] = e
        return results
    if text:
        results.update(_grep(grep, dict(text), knowledge, deadline))
    return results


WORKERS = 2
"""grep processes at once: the files (or, for one file, the keys) shared between them. One
grep with all the keys runs at about 150 MB/s here; two use both cores."""


def _grep(grep: str, starts: dict[str, int], knowledge: Knowledge,
          deadline: Optional[float]) -> dict[str, "list[Hit] | Unreadable"]:
    reader = _Reader(starts, knowledge, deadline)
    threads = [threading.Thread(target=reader.run, args=(_command(grep, keys), files), daemon=True)
               for keys, files in _shares(list(starts), knowledge.keys)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reader.close()
    return {path: list(hits.values()) for path, hits in reader.found.items()}


def _command(grep: str, keys: Sequence[str]) -> list[str]:
    args = [grep, "-a", "-F", "-n", "-b", "-o", "-H", "-Z"]
    for key in keys:
        args += ["-e", key]
    return args


def _shares(paths: list[str], keys: Sequence[str]) -> list[tuple[Sequence[str], list[str]]]:
    """What each grep reads: half the files each (by size), or, for one file, half the keys."""
    if len(paths) == 1:
        return [(keys[i::WORKERS], paths) for i in range(WORKERS)]
    shares: list[list[str]] = [[] for _ in range(WORKERS)]
    sizes = [0] * WORKERS
    for path in sorted(paths, key=_size, reverse=True):
        least = sizes.index(min(sizes))
        shares[least].append(path)
        sizes[least] += _size(path)
    return [(keys, share) for share in shares if share]


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class _Reader:
    """The lines grep names, read back and told apart (from several grep threads)."""

    def __init__(self, starts: dict[str, int], knowledge: Knowledge,
                 deadline: Optional[float]) -> None:
        self.starts, self.knowledge, self.deadline = starts, knowledge, deadline
        self.found: dict[str, dict[str, Hit]] = {path: {} for path in starts}
        self._files: dict[str, BinaryIO] = {}
        self._seen: dict[str, tuple[int, int]] = {}  # path -> (last line read, lines read)
        self._lock = threading.Lock()

    def run(self, command: list[str], paths: list[str]) -> None:
        proc = subprocess.Popen([*command, "--", *paths], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C"})
        _cap_memory(proc.pid)
        # A grep that finds nothing prints nothing: only a timer stops it at the deadline.
        timer = None if self.deadline is None else \
            threading.Timer(max(0.0, self.deadline - time.monotonic()), proc.kill)
        if timer is not None:
            timer.start()
        try:
            for raw in proc.stdout or ():
                if self.deadline is not None and time.monotonic() > self.deadline:
                    break
                with self._lock:
                    self._take(raw)
        finally:
            if timer is not None:
                timer.cancel()
            exhausted = proc.poll() == 2 or (proc.wait() == 2 and not self._late())
            proc.kill()
            proc.wait()
        if exhausted and not self._late():
            self._in_python(paths)

    def _late(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def _in_python(self, paths: list[str]) -> None:
        """grep gave up (a line longer than its memory cap): these files read in Python, in
        bounded blocks (slower, about 5 MB/s), their hits merged with grep's."""
        for path in paths:
            try:
                hits = scan_file(path, self.knowledge, self.starts.get(path, 0))
            except Unreadable:
                continue
            with self._lock:
                for hit in hits:
                    if hit.fault.id not in self.found[path]:
                        self.found[path][hit.fault.id] = hit

    def _take(self, raw: bytes) -> None:
        name, _, rest = raw.partition(b"\0")
        line_text, _, rest = rest.partition(b":")
        offset_text, _, _ = rest.partition(b":")
        path = os.fsdecode(name)
        line_no, offset = int(line_text), int(offset_text)
        last, read = self._seen.get(path, (0, 0))
        if offset < self.starts.get(path, 0) or line_no == last or read >= MAX_CANDIDATES:
            return
        self._seen[path] = (line_no, read + 1)
        line = _line_around(self._files, path, offset)
        fault = self.knowledge.classify(line)
        if fault is not None:
            add_hit(self.found[path], fault, path, line_no, line)

    def close(self) -> None:
        for f in self._files.values():
            f.close()


GREP_MEMORY = 64 << 20
"""Address space a grep may use: it holds a whole line, so a file of one 100 MB line would take
200 MB; over the cap grep stops ("memory exhausted") and its files are read in Python."""


def _cap_memory(pid: int) -> None:
    try:
        resource.prlimit(pid, resource.RLIMIT_AS, (GREP_MEMORY, GREP_MEMORY))
    except (OSError, ValueError):
        pass  # gone already, or not allowed: grep runs uncapped


def _line_around(files: dict[str, BinaryIO], path: str, offset: int) -> bytes:
    """The line holding byte ``offset`` of ``path``, at most ``CONTEXT`` bytes either side."""
    f = files.get(path)
    if f is None:
        f = files[path] = open(path, "rb")
    begin = max(0, offset - CONTEXT)
    f.seek(begin)
    data = f.read(2 * CONTEXT)
    at = offset - begin
    start = data.rfind(b"\n", 0, at) + 1
    end = data.find(b"\n", at)
    return data[start:len(data) if end < 0 else end]
