"""scripts/train_digits.py with a fault injected, for the resume and replica tests.

--kill-at-step N: in the job's first attempt, rank 1 SIGKILLs itself after step N.
--wipe-checkpoints: ... having first deleted its host's checkpoint directory (a wiped host).
--perturb-rank R: rank R nudges one weight before training (a diverged replica).
--fail-on-host H --fail-at-step N: in every attempt, the ranks on host H (a bad server) raise
after step N.
"""
import argparse
import os
import shutil
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
import train_digits  # noqa: E402

from parallel import contract  # noqa: E402
from parallel.trainer import Callback  # noqa: E402


class KillAtStep(Callback):
    def __init__(self, step: int, wipe: bool) -> None:
        self.step = step
        self.wipe = wipe

    def on_step_end(self, info):  # type: ignore[no-untyped-def]
        if info.global_step == self.step:
            if self.wipe:
                shutil.rmtree(Path(os.environ[contract.LOG_DIR]) / "checkpoints")
            os.kill(os.getpid(), signal.SIGKILL)


class FailAtStep(Callback):
    """A bad host: its ranks fail at their first step at or past ``step`` in every attempt
    (a restart may resume from that very step: last words)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, info):  # type: ignore[no-untyped-def]
        if info.global_step >= self.step:
            raise RuntimeError(f"{os.environ[contract.HOST]} is a bad host: failing at step "
                               f"{self.step}")


class Perturb(Callback):
    def on_fit_start(self, trainer):  # type: ignore[no-untyped-def]
        weight = trainer.network.trainable_params()[0]
        weight.set_data(ms.Tensor(weight.asnumpy() + np.float32(0.01)))


parser = argparse.ArgumentParser()
parser.add_argument("--kill-at-step", type=int, default=-1)
parser.add_argument("--perturb-rank", type=int, default=-1)
parser.add_argument("--wipe-checkpoints", action="store_true")
parser.add_argument("--fail-on-host", default=None)
parser.add_argument("--fail-at-step", type=int, default=-1)
ours, rest = parser.parse_known_args()
rank = int(os.environ[contract.RANK_ID])
first_attempt = os.environ.get(contract.RESTART, "0") == "0"
callbacks = []
if rank == 1 and first_attempt and ours.kill_at_step >= 0:
    callbacks.append(KillAtStep(ours.kill_at_step, ours.wipe_checkpoints))
if os.environ.get(contract.HOST) == ours.fail_on_host:
    callbacks.append(FailAtStep(ours.fail_at_step))
if rank == ours.perturb_rank:
    callbacks.append(Perturb())
train_digits.main(rest, callbacks)
