"""Fixtures and hooks only; what tests share otherwise is in ``helpers.py``.

What runs without being asked (hooks and one autouse fixture):

* Under ``CI=true`` a skipped test fails: CI must run every test, and a skip there means a missing
  prerequisite (sshd, root, mpirun) that would otherwise pass unnoticed. The test is reported as
  failed (or as an error, when a fixture skipped) with the skip's reason.
* Before its first test marked ``mindspore``, the test process makes itself a lone rank with
  ``parallel.init()``, as a user's script starts (so in-process MindSpore tests run in the mode
  the product selects, GRAPH).
* A test module whose ``pytestmark`` carries a mark that the ``-m`` expression rejects is not
  imported at all, so ``-m "not mindspore"`` never imports MindSpore, not even to collect.
* Under pytest-xdist (``-n N --dist loadgroup``, as ``.ci/run`` runs) a test file runs on one
  worker (its tests may share job ids and module fixtures); every ``multinode`` test runs on one
  worker (the network namespaces and Slurm's controller are shared by the whole machine), and
  every test of ``tests/ranks`` on one worker (two real MindSpore jobs at once on 2 cores would
  stretch the timings those tests judge). Those two long groups go to the workers first, then the
  longest other files (``LONG_FILES``), then the rest, so that the workers end close together.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import pytest
from helpers import (
    RANK_SCRIPTS,
    checksums,
    launcher_variables,
    module_marks,
    rejects_marks,
    run_launcher,
    run_torchrun,
)

CI_SKIP = "skipped under CI=true, where every test must run"


@pytest.fixture
def weird_tmp(tmp_path: Path) -> Path:
    """A temporary folder whose path holds a space and both kinds of quote."""
    path = tmp_path / "dir with 'single' and \"double\" quotes"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def lone_rank() -> object:
    """This test process made a MindSpore rank by ``parallel.init()``, as a user's script does.

    With no launcher's variables in its environment it is a lone process started by hand: it
    joins no cluster and runs in the execution mode ``init()`` selects (GRAPH, unless asked
    otherwise). Returns the ``RankInfo``. Only MindSpore tests ask for it, so only they load it.
    """
    import parallel

    with pytest.MonkeyPatch.context() as env:
        for name in launcher_variables(os.environ):
            env.delenv(name)
        return parallel.init()


@pytest.fixture(autouse=True)
def _mindspore_tests_run_in_a_lone_rank(request: pytest.FixtureRequest) -> None:
    """Before the first test marked mindspore, this process becomes a rank (``lone_rank``).

    That is how a user's script starts, and MindSpore allows it only then: once any kernel ran,
    ``parallel.init()`` can no longer select the device. So whichever MindSpore test runs first
    (the order of files and ``-k`` decide), every later one finds the rank already made.
    """
    if request.node.get_closest_marker("mindspore") is not None:
        request.getfixturevalue("lone_rank")


# Reference results, computed once per test run ---------------------------------------------------

@pytest.fixture(scope="session")
def ms_job_checksum(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], str]:
    """``checksum(cards)``: what every rank of ``rank_scripts/ms_job.py --steps 3`` ends with on
    one node of ``cards`` CPU ranks, run here once per size and test run. It is the reference the
    engine, pod and multi-host tests compare their ranks with: a data-parallel job trains to the
    same parameters on 1 node x N ranks as on N nodes x 1 (docs/testing.md)."""
    known: dict[int, str] = {}

    def checksum(cards: int) -> str:
        if cards not in known:
            logs = tmp_path_factory.mktemp(f"ms-job-reference-{cards}") / "logs"
            result = run_launcher("--device", "cpu", "--cards", str(cards), "--log-dir",
                                  str(logs), str(RANK_SCRIPTS / "ms_job.py"), "--steps", "3")
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
            sums = checksums(result.stdout)
            assert len(sums) == cards and len(set(sums.values())) == 1, result.stdout[-2000:]
            known[cards] = next(iter(sums.values()))
        return known[cards]

    return checksum


@pytest.fixture(scope="session")
def torchrun_result(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """``rank_scripts/torch_ddp.py`` under torchrun, 2 ranks on this node, once per test run:
    the reference of the torch tests on one node and on the test hosts."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    result = run_torchrun(str(RANK_SCRIPTS / "torch_ddp.py"), tmp_path_factory.mktemp("torchrun"),
                          env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# CI=true: a skip is a failure ---------------------------------------------------------------------

def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def _skip_reason(report: Union[pytest.TestReport, pytest.CollectReport]) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        path, line, reason = longrepr
        return f"{reason.removeprefix('Skipped: ')} ({path}:{line})"
    return str(longrepr)


def _fail_if_ci(report: Union[pytest.TestReport, pytest.CollectReport]) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and _in_ci():
        report.longrepr = f"{CI_SKIP}: {_skip_reason(report)}"
        report.outcome = "failed"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    _fail_if_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    report = yield
    _fail_if_ci(report)
    return report


# pytest-xdist: one worker per file, one worker for every multi-node test ------------------------

LONG_FILES = ("tests/ranks/test_toolkits.py", "tests/hangs/test_busy_alone.py",
              "tests/hangs/test_hang_limits.py",
              "tests/cli/test_cli_properties.py", "tests/parallel/trainer/test_trainer.py", "tests/run/test_supervision.py",
              "tests/cli/test_bad_input.py", "tests/plan/test_pods.py",
              "tests/parallel/mode/test_parallel_setup.py", "tests/cli/test_last_bad_inputs.py")
"""The files outside the two long groups that took 18-75 s each in CI (2026-12-03), longest
first: handed out right after those groups, so that no long file is left for the end, when the
other worker may have nothing left to do. Only the order depends on it, never a result."""


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--dist loadgroup`` the controller hands the groups out in the order the workers
    collected them (``pytest_collection_modifyitems`` below), not sorted by their number of tests
    (xdist's ``--loadscope-reorder``, on by default: it put the long groups behind files of many
    quick tests, and the worker that got ``tests/ranks`` late ended a minute after the other)."""
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its worker group, before xdist's own hook reads the marks into the
    test ids (it runs first otherwise, and the marks were ignored: every test was a group of
    its own). The two long groups go first, then ``LONG_FILES``, so that the scheduler, which
    hands out groups in order, gives the long groups to different workers at the start and the
    rest fill in around them."""
    if not config.getoption("loadgroup", False):
        return  # xdist sets it on its workers under --dist loadgroup; they collect, not the controller
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    first = {"ranks": 0, "multinode": 1, **{path: 2 + n for n, path in enumerate(LONG_FILES)}}
    items.sort(key=lambda item: first.get(_worker_group(item), len(first) + 2))


def _worker_group(item: pytest.Item) -> str:
    """The tests that must run on one worker together: see the module docstring."""
    if item.get_closest_marker("multinode"):
        return "multinode"
    path = item.nodeid.split("::")[0]
    return "ranks" if path.startswith("tests/ranks/") and path not in BESIDE_RANKS else path


BESIDE_RANKS = ("tests/ranks/test_toolkits.py",)
"""Real-rank files that judge no timing (losses step for step, a resume's file), so they run on
the other worker beside ``tests/ranks``, as the multi-node tests' MindSpore jobs do: the
toolkit's two tests and their shared run (114 s in CI) made that worker the suite's end."""


# -m: a module whose marks the expression rejects is not imported ----------------------------------

def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> Optional[bool]:
    markexpr = config.getoption("markexpr")
    if not markexpr or not (collection_path.name.startswith("test_")
                            and collection_path.suffix == ".py"):
        return None
    marks = module_marks(collection_path)
    return True if marks and rejects_marks(markexpr, marks) else None
