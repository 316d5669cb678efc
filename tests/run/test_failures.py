"""Which failure is the root cause (``launcher.run.failures``), in-process: the earliest, by the
time the rank reported its exception, else the time its process ended; the block names it."""
from __future__ import annotations

import signal
from typing import Optional

from launcher.plan.launch_plan import ProcessSpec, Role
from launcher.run.failures import ErrorReport, Failure, describe_failure, root_cause


def _failure(rank: int, at: float, returncode: Optional[int] = 1,
             exception: Optional[str] = None) -> Failure:
    spec = ProcessSpec(role=Role.RANK, rank=rank, host="h", node_rank=0, local_rank=rank,
                       device_id=rank, log_path="/nowhere/rank.log", env={}, argv=("python",))
    report = ErrorReport(exception, f"boom on {rank}", "Traceback ...\n", at) if exception else None
    return Failure(spec, 100 + rank, returncode, report, at)


def test_the_earliest_failure_is_the_root_cause_not_its_victims() -> None:
    victim = _failure(0, at=12.0, exception="ConnectionError")
    cause = _failure(1, at=10.5, exception="ValueError")
    killed = _failure(2, at=11.0, returncode=-signal.SIGKILL)
    assert root_cause([victim, killed, cause]) is cause
    assert root_cause([victim, killed]) is killed
    assert root_cause([]) is None


def test_the_block_names_the_rank_how_it_failed_and_its_exception() -> None:
    text = describe_failure(_failure(1, at=1.0, returncode=None, exception="ValueError"), "j")
    assert text.splitlines()[:2] == ["npu-launch: job j failed: rank 1 on h (pid 101) raised ValueError",
                                     "  ValueError: boom on 1"]
    killed = describe_failure(_failure(2, at=1.0, returncode=-signal.SIGKILL), "j")
    assert killed.splitlines()[0] == "npu-launch: job j failed: rank 2 on h (pid 102) killed by SIGKILL"
