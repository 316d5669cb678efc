"""scripts/train_digits.py for the last-words tests (issue 24 part 1).

--ckpt-at-steps N,M: periodic checkpoints of these steps too (what last words are compared with).
--kill-at-step N: in the first attempt, rank 1 SIGKILLs itself after step N.
--hang-at-step N: in attempt --hang-in-attempt (0, the first, unless given), rank 1 stops after
step N (sleeps: a hung rank).
"""
import argparse
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import train_digits  # noqa: E402

from parallel import contract  # noqa: E402
from parallel.trainer import Callback  # noqa: E402


class AtSteps(Callback):
    """A periodic checkpoint of each of ``steps``: the trainer saves after the step callbacks
    when its ``ckpt_every_steps`` divides the step, so it is 1 for just those steps."""

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps

    def on_fit_start(self, trainer):  # type: ignore[no-untyped-def]
        self.trainer = trainer

    def on_step_end(self, info):  # type: ignore[no-untyped-def]
        every = 1 if info.global_step in self.steps else None
        self.trainer.options = dataclasses.replace(self.trainer.options, ckpt_every_steps=every)


class FaultAtStep(Callback):
    def __init__(self, step: int, hang: bool) -> None:
        self.step, self.hang = step, hang

    def on_step_end(self, info):  # type: ignore[no-untyped-def]
        if info.global_step == self.step:
            if self.hang:
                time.sleep(3600)
            # MindSpore runs a step's graph after the Python call returns, so this rank may die
            # in the middle of step N's gradient exchange: rank 0 keeps step N - 1 or N, whole
            # (tests/rank_scripts/half_step.py proves the middle of an exchange on its own).
            os.kill(os.getpid(), signal.SIGKILL)


parser = argparse.ArgumentParser()
parser.add_argument("--ckpt-at-steps", default="")
parser.add_argument("--kill-at-step", type=int, default=-1)
parser.add_argument("--hang-at-step", type=int, default=-1)
parser.add_argument("--hang-in-attempt", type=int, default=0)
ours, rest = parser.parse_known_args()
rank = int(os.environ[contract.RANK_ID])
attempt = int(os.environ.get(contract.RESTART, "0"))
at = {int(step) for step in ours.ckpt_at_steps.split(",") if step}
callbacks: list[Callback] = [AtSteps(at)] if at else []
if rank == 1 and attempt == 0 and ours.kill_at_step >= 0:
    callbacks.append(FaultAtStep(ours.kill_at_step, hang=False))
if rank == 1 and attempt == ours.hang_in_attempt and ours.hang_at_step >= 0:
    callbacks.append(FaultAtStep(ours.hang_at_step, hang=True))
train_digits.main(rest, callbacks)
