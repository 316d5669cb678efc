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
from parallel.contract import Event, shown

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


HOOK = "hook"
"""A ``framework`` event's field, ``False`` on one npu-launch made for a rank found running
MindSpore without the rank hook (``launcher.run.hookless``)."""


class FrameworkNote:
    """Says once, when the first rank imports torch, which given options it will not apply;
    and once, when a rank was found running MindSpore without the rank hook
    (``launcher.run.hookless``), what that costs."""

    def __init__(self, options: tuple[str, ...], err: TextIO) -> None:
        self._options = options
        self._err = err
        self._said = not options
        self._hookless_said = False

    def see(self, event: Event) -> None:
        if event.kind != contract.EVENT_FRAMEWORK:
            return
        if event.flag(HOOK) is False and not self._hookless_said:
            self._hookless_said = True
            self._say(f"npu-launch: note: rank {event.rank} runs MindSpore without npu-launch's "
                      f"rank hook (its Python, {shown(event.text('python') or '?')}, ignored "
                      "PYTHONPATH or could not load it): MindSpore's scheduler was started "
                      "when it was found; its exceptions, hangs and steps are not reported")
        if self._said or event.name != "torch":
            return
        self._said = True
        self._say(f"npu-launch: note: rank {event.rank} uses torch: {', '.join(self._options)} "
                  "only change(s) MindSpore ranks (the parallel package, MindSpore's rank-table "
                  "start, its logs)")

    def _say(self, line: str) -> None:
        self._err.write(line + "\n")
        self._err.flush()
