"""What the rank-table library raises: plain ``BadInput`` exceptions, so that it needs neither
click nor the launcher (which sits above it); the CLI says them in one line, exit code 2."""
from __future__ import annotations

from parallel.contract import BadInput


class RankTableError(BadInput):
    """A bad HCCL rank table; the message names the file and the JSON path."""


class TableInputError(BadInput):
    """A bad value for building a table: an option (``--devices``, ``--device-ip``), an
    ``hccn.conf`` or what ``npu-smi`` printed."""
