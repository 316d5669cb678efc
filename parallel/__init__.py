"""npu-launch, rank side: runs inside every rank; the only package that imports MindSpore.

Importing ``parallel`` itself imports nothing heavy: each submodule imports MindSpore when it is
used, so the launcher can read ``parallel.config`` without MindSpore installed.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """``parallel.init`` and ``parallel.RankInfo``, imported on first use (``init`` needs MindSpore)."""
    if name == "init":
        from parallel.mode.setup import init

        return init
    if name == "RankInfo":
        from parallel.mode.topology import RankInfo

        return RankInfo
    raise AttributeError(f"module 'parallel' has no attribute {name!r}")
