"""A checkpoint file an agent sends node 0 (``Upload``), as the payload server's wire names it,
and what receives it there (``UploadReceiver``: node 0's ledger). The transport itself is
``launcher.cluster.payload``; the sender, ``launcher.cluster.collect``."""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Protocol

MAX_DIGITS = 18
"""Rank, step and size fields: at most this many ASCII digits (below 2**63)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A collected file's name: one plain path component, never ``..`` or hidden."""


def digits(text: str) -> bool:
    """ASCII digits, at most ``MAX_DIGITS`` of them (below 2**63)."""
    return text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS


@dataclasses.dataclass(frozen=True)
class Upload:
    """One checkpoint file an agent sends node 0: whose, of which step, its name, size and
    sha256 as the rank's checkpoint event said."""

    rank: int
    step: int
    name: str
    size: int
    sha256: str

    def request(self) -> str:
        return f"upload {self.rank} {self.step} {self.size} {self.sha256} {self.name}"

    @classmethod
    def parse(cls, fields: list[str]) -> Optional["Upload"]:
        """The upload ``<rank> <step> <size> <sha256> <name>`` names; None unless every field
        is sane."""
        if len(fields) != 5:
            return None
        rank, step, size, sha256, name = fields
        if not all(digits(f) for f in (rank, step, size)) or not _SHA256.fullmatch(sha256) \
                or not FILE_NAME.fullmatch(name) or ".." in name:
            return None
        return cls(int(rank), int(step), name, int(size), sha256)


class UploadReceiver(Protocol):
    """Where uploads go (node 0's ledger, ``launcher.checkpoints.ledger``)."""

    @property
    def staging(self) -> str:
        """A folder for files still arriving, on the file system of their destination."""

    def accepts(self, upload: Upload) -> bool:
        """Whether this rank, step and size may be sent at all (before any byte is written)."""

    def received(self, upload: Upload, path: str, seconds: float) -> bool:
        """``path`` (in ``staging``) holds the upload's bytes, checked; move it into place.
        False when it is not wanted any more (the file is then left to the caller)."""
