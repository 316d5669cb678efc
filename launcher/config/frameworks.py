"""Which framework a job's ranks use, as they say it (the rank hook's ``framework`` events),
and what npu-launch then tells the user: the options given that only MindSpore ranks apply.

The launcher cannot know beforehand: the same command starts a MindSpore script or a torch one
(``launcher.run.supervisor`` starts MindSpore's scheduler only once a rank imports MindSpore).
"""
from __future__ import annotations

from typing import TextIO

from launcher.config.launch_config import LaunchConfig
from parallel import contract
from parallel.config import ParallelConfig
from parallel.contract import Event

_PARALLEL_OPTIONS = {"mode": "--parallel", "dp": "--dp", "mp": "--mp", "pp": "--pp",
                     "micro_batches": "--micro-batches", "optimizer_shard": "--optimizer-shard",
                     "gradients_mean": "--no-gradients-mean", "full_batch": "--full-batch",
                     "global_batch": "--global-batch", "seed": "--seed",
                     "shard_policy": "parallel.shard_policy"}


def mindspore_only(config: LaunchConfig) -> tuple[str, ...]:
    """The options of ``config`` that only a MindSpore rank applies: the parallel layout
    (``parallel.init()`` and the trainer apply it), ``--rank-table`` (MindSpore's HCCL mode),
    ``--runtime-logs`` (MindSpore's own log lines)."""
    default = ParallelConfig()
    given = [option for field, option in _PARALLEL_OPTIONS.items()
             if getattr(config.parallel, field) != getattr(default, field)]
    if config.rank_table:
        given.append("--rank-table")
    if config.runtime_logs:
        given.append("--runtime-logs")
    return tuple(given)


class FrameworkNote:
    """Says once, when the first rank imports torch, which given options it will not apply."""

    def __init__(self, options: tuple[str, ...], err: TextIO) -> None:
        self._options = options
        self._err = err
        self._said = not options

    def see(self, event: Event) -> None:
        if self._said or event.kind != contract.EVENT_FRAMEWORK or event.name != "torch":
            return
        self._said = True
        self._err.write(f"npu-launch: note: rank {event.rank} uses torch: "
                        f"{', '.join(self._options)} only change(s) MindSpore ranks (the "
                        "parallel package, MindSpore's rank-table start, its logs)\n")
        self._err.flush()
