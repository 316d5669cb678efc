"""``{checkpoint}`` in the script's arguments: each rank's newest checkpoint, on every attempt.

``train.py --ckpt_path {checkpoint}`` runs, for each rank, with the path of the newest
checkpoint file the job's own saves completed for it (``launcher.checkpoints.script_saves``
chooses it); ``{checkpoint:-DEFAULT}`` gives DEFAULT while there is none. The same path is in
the rank's ``NPU_LAUNCH_CHECKPOINT`` (unset while there is none). The placeholder may stand
inside an argument (``--ckpt_path={checkpoint}``).

The spelling: braces keep it one word for every shell (no brace expansion without a comma, no
globbing), and no option parser gives braces a meaning. ``${checkpoint}`` (a shell's or an
OmegaConf/Hydra interpolation that reached the script quoted) is left alone: a ``$`` before
the brace is not ours. A bare ``{checkpoint}`` with no checkpoint yet is the empty string, the
argument kept: dropping it would leave ``--ckpt_path`` to swallow the next argument, and an
empty path is what such options' defaults are (mindcv, the model zoo: ``--ckpt_path ''``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional, Sequence

from launcher.checkpoints.script_saves import ScriptSaves
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec
from parallel import contract

PLACEHOLDER = "{checkpoint}"
_PATTERN = re.compile(r"(?<!\$)\{checkpoint(?::-([^}]*))?\}")


def has_placeholder(args: Sequence[str]) -> bool:
    return any(_PATTERN.search(arg) for arg in args)


def substitute(args: Sequence[str], path: Optional[str]) -> tuple[str, ...]:
    """``args`` with every placeholder replaced: ``path``, or its default when None."""
    return tuple(_PATTERN.sub(lambda m: path if path is not None else (m.group(1) or ""), arg)
                 for arg in args)


def newest_paths(plan: LaunchPlan, saves: ScriptSaves) -> dict[int, str]:
    """Each rank's newest checkpoint path, as ``saves`` chooses them for the plan's world."""
    return {rank: saved.path for rank, saved in saves.newest(plan.world_size).items()}


def with_checkpoints(plan: LaunchPlan, paths: Mapping[int, str]) -> LaunchPlan:
    """``plan`` with each rank's newest checkpoint (``paths``: rank -> path, none for a rank
    without) in its arguments and environment."""
    def given(spec: ProcessSpec) -> ProcessSpec:
        if spec.rank is None:
            return spec
        path = paths.get(spec.rank)
        env = {k: v for k, v in spec.env.items() if k != contract.CHECKPOINT}
        if path is not None:
            env[contract.CHECKPOINT] = path
        argv = substitute(plan.script_argv, path) if plan.script_argv else spec.argv
        return dataclasses.replace(spec, env=env, argv=argv)
    return dataclasses.replace(plan, ranks=tuple(map(given, plan.ranks)))


def dry_run_note(plan: LaunchPlan, paths: Mapping[int, str]) -> Optional[str]:
    """One line for ``--dry-run`` when the arguments hold the placeholder and no rank has a
    checkpoint yet (what each rank's would be is in its ``cmd``)."""
    if not plan.script_argv or paths:
        return None
    return (f"note: no checkpoint of this job's ranks in {plan.log_dir} yet: {PLACEHOLDER} is "
            "empty (or its default, {checkpoint:-DEFAULT}) until a rank saves one")
