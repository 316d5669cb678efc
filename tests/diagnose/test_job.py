"""A failed attempt's block and its diagnosis, without starting processes."""
from __future__ import annotations

import time
from types import SimpleNamespace

from launcher.diagnose import LIKELY_CAUSE, diagnose_attempt, diagnosed, diagnosis_last
from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.output import ATTEMPT_MARK


def _plan(tmp_path, logs):
    specs = []
    for rank, text in logs.items():
        path = tmp_path / f"rank_{rank}.log"
        path.write_bytes(text)
        specs.append(SimpleNamespace(log_path=str(path), rank=rank, host="node2"))
    return SimpleNamespace(processes=specs, log_dir=str(tmp_path))


def test_only_this_attempts_lines_count(tmp_path):
    earlier = b"EL0004: Failed to allocate memory.\n"
    plan = _plan(tmp_path, {0: earlier + ATTEMPT_MARK + b"20261204 attempt 1 ====\nall fine\n"})
    assert not diagnose_attempt(plan, 0, time.time() - 5).named


def test_the_block_ends_with_the_diagnosis_and_the_blamed_rank_leads(tmp_path):
    plan = _plan(tmp_path, {0: b"EI0006: Getting socket times out.\n",
                            1: b"x\n" * 9 + b"EJ0001: Failed to initialize the HCCP process.\n"})
    failed = JobResult(Outcome.FAILED, 1, "npu-launch: job j failed: rank 0 on node2 exited with "
                       "code 1\nnpu-launch: where the time went", time.time(),
                       Cause(Outcome.FAILED, "rank", 0, "node2"))
    result = diagnosis_last(diagnosed(failed, plan, time.time() - 5))
    lines = result.message.splitlines()
    assert lines[0].startswith("npu-launch: job j failed")
    assert lines[-4].startswith(f"{LIKELY_CAUSE} rank 1 on node2 could not start HCCP")
    assert "(EJ0001, rank_1.log:10); rank 0 on node2 timed out connecting" in lines[-4]
    assert [d["consequence_of"] for d in result.diagnosis] == [None, 1]


def test_a_success_or_an_unknown_error_is_left_as_it_was(tmp_path):
    plan = _plan(tmp_path, {0: b"KeyError: 'batch_size'\n"})
    failed = JobResult(Outcome.FAILED, 1, "npu-launch: job j failed", time.time())
    assert diagnosed(failed, plan, time.time()) == failed
    done = JobResult(Outcome.SUCCEEDED, 0, "", time.time())
    assert diagnosed(done, plan, time.time()) == done
