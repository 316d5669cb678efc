"""Warm spares (``launcher.run.spares``, ``parallel.hook.spare``) with real processes and plain-Python
scripts: what a spare runs before and after the go, that the attempt's group adopts it as one
of its own, and that nothing of it outlives the launch or is ended by another's teardown. The
"framework" a spare imports here is a module of the test's that notes its import (MindSpore's
own warm restarts are in ``tests/ranks/test_compile_cache.py`` and
``tests/ranks/test_last_words_ranks.py``); the rank hook's ``kept`` (may a spare stand in for
this script?) is read from real imports of MindSpore."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import REPO, assert_no_job_processes, run_launcher, wait_for

from launcher.plan.launch_plan import ProcessSpec, Role
from launcher.run.process import ProcessGroup
from launcher.run.spares import Spares
from launcher.run.strays import job_processes
from parallel import contract

BOOT = REPO / "parallel" / "_boot"
FRAMEWORK = """\
import os, time
with open(os.environ["IMPORTED_AT"], "w") as f:
    f.write(f"{os.getpid()} {time.time()}")
"""
SCRIPT = """\
import json, os, sys
print(json.dumps({"pid": os.getpid(), "restart": os.environ.get("NPU_LAUNCH_RESTART"),
                  "spare": os.environ.get("NPU_LAUNCH_SPARE"), "warm": "heavy" in sys.modules,
                  "argv": sys.argv[1:], "stdin": sys.stdin.read()}))
"""


def _spec(tmp: Path, restart: int, **extra: str) -> ProcessSpec:
    (tmp / "heavy.py").write_text(FRAMEWORK)
    (tmp / "train.py").write_text(SCRIPT)
    env = {"PYTHONPATH": f"{BOOT}{os.pathsep}{tmp}", "IMPORTED_AT": str(tmp / "imported"),
           contract.EVENTS_FILE: str(tmp / "events.jsonl"), contract.ERROR_FILE: str(tmp / "error.json"),
           contract.RANK: "0", contract.JOB_ID: "spares", contract.NODE_RANK: "0",
           contract.RESTART: str(restart), **extra}
    return ProcessSpec(role=Role.RANK, rank=0, host="h", node_rank=0, local_rank=0, device_id=0,
                       log_path=str(tmp / "rank_0.log"), env=env,
                       argv=(sys.executable, "-u", str(tmp / "train.py"), "--lr", "0.1"),
                       events_path=str(tmp / "events.jsonl"), error_path=str(tmp / "error.json"))


def _base() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(contract.PREFIX)}


def _standing(tmp: Path, spares: Spares, **extra: str) -> int:
    """Stand a spare by for rank 0 and wait until it imported the framework; its pid."""
    spares.stand_by((_spec(tmp, 0, **extra),), "heavy")
    wait_for(lambda: (tmp / "imported").exists(), "the spare's import", timeout=60)
    return int((tmp / "imported").read_text().split()[0])


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_spare_imports_first_and_runs_the_script_as_the_next_attempt_once_adopted(
        tmp_path: Path) -> None:
    spares = Spares(_base(), str(tmp_path), 0)
    group = ProcessGroup("launch-token", _base(), str(tmp_path), 0)
    try:
        pid = _standing(tmp_path, spares)
        time.sleep(0.3)
        assert not (tmp_path / "rank_0.log").exists() and not (tmp_path / "events.jsonl").exists(), \
            "a spare writes nothing of the rank's before the go"
        next_attempt = _spec(tmp_path, 1)
        spare = spares.take(next_attempt)
        assert spare is not None and group.adopt(spare, next_attempt, None) == pid
        ended = wait_for(group.poll, "the adopted spare's exit", timeout=60)
        assert [e.returncode for e in ended] == [0]
        group.drain(next_attempt.label, 5.0)
        said = json.loads((tmp_path / "rank_0.log").read_text().splitlines()[-1])
        assert said == {"pid": pid, "restart": "1", "spare": None, "warm": True,
                        "argv": ["--lr", "0.1"], "stdin": ""}, said
        events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert [(e["event"], e.get("name"), e.get("warm")) for e in events[:2]] == [
            ("started", None, None), ("framework", "heavy", True)], events
        assert events[0]["process_start"] > float((tmp_path / "imported").read_text().split()[1]), \
            "an adopted spare's life as a rank starts at the go, not at its import"
    finally:
        group.close(1.0)
        spares.close()


def test_another_attempts_teardown_passes_spares_by_and_close_ends_them_unrun(
        tmp_path: Path) -> None:
    spares = Spares(_base(), str(tmp_path), 0)
    try:
        pid = _standing(tmp_path, spares)
        failed = ProcessGroup("launch-token", _base(), str(tmp_path), 0)
        failed.start(dataclasses.replace(_spec(tmp_path, 0), argv=(sys.executable, "-c", "pass"),
                                         log_path=str(tmp_path / "failed.log"),
                                         env={contract.TOKEN: "launch-token",
                                              contract.NODE_RANK: "0"}), None)
        failed.close(1.0)  # the teardown and its sweep of the launch's token on node 0
        assert not _gone(pid), "the failed attempt's sweep ended a spare"
        assert [p.pid for p in job_processes(spares._token, 0)] == [pid]
        spares.close()
        assert _gone(pid) and not job_processes(spares._token, 0)
        assert not (tmp_path / "rank_0.log").exists(), "a spare never taken ran the script"
    finally:
        spares.close()


def test_a_spare_for_another_command_or_environment_is_ended_not_adopted(tmp_path: Path) -> None:
    spares = Spares(_base(), str(tmp_path), 0)
    try:
        for other in (_spec(tmp_path, 1, GLOG_v="3"),
                      dataclasses.replace(_spec(tmp_path, 1), argv=(sys.executable, "other.py"))):
            (tmp_path / "imported").unlink(missing_ok=True)
            pid = _standing(tmp_path, spares)
            assert spares.take(other) is None and _gone(pid)
        spares.stand_by((_spec(tmp_path, 0),), "heavy")
        spare = spares.take(_spec(tmp_path, 2, **{contract.RESUME_STEP: "40"}))
        assert spare is not None, "the attempt's own variables may differ"
        spare.end()
    finally:
        spares.close()


def test_a_go_the_pipe_cannot_take_at_once_starts_the_process_anew(tmp_path: Path) -> None:
    spares = Spares(_base(), str(tmp_path), 0)
    group = ProcessGroup("launch-token", _base(), str(tmp_path), 0)
    try:
        padding = {"PADDING": "x" * 100_000}  # more than a pipe takes at once (64 KiB)
        pid = _standing(tmp_path, spares, **padding)
        huge = _spec(tmp_path, 1, **padding)
        spare = spares.take(huge)
        assert spare is not None and group.adopt(spare, huge, None) is None and _gone(pid)
        assert not group.running()
    finally:
        group.close(1.0)
        spares.close()


def test_a_spares_mark_in_the_launchers_environment_reaches_no_rank(tmp_path: Path) -> None:
    """``NPU_LAUNCH_SPARE`` left in the environment npu-launch runs in would make every rank a
    spare waiting on an empty stdin: the job would end 0 without running the script."""
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('ran', os.environ.get('NPU_LAUNCH_SPARE'))\n")
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "spare-mark",
                          "--log-dir", str(tmp_path / "logs"), str(script),
                          env={**os.environ, contract.SPARE: "json"}, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"rank_{rank}.log").read_text()
        assert "ran None" in log, log[-2000:]
    assert_no_job_processes("spare-mark")


KEPT_CASES = {
    "plain": "import mindspore\n",
    "own folder and module first": "import sys\nsys.path.insert(0, {lib!r})\nimport helper\n"
                                   "import numpy\nimport mindspore\n",
    "a compiled library first": "import psutil\nimport mindspore\n",
    "an environment variable": "import os\nos.environ['GLOG_v'] = '3'\nimport mindspore\n",
    "another mindspore first": "import sys\nsys.path.insert(0, {shadow!r})\nimport mindspore\n",
}


def test_the_hook_says_whether_a_spare_would_import_what_the_script_imports(tmp_path: Path) -> None:
    """``kept`` in the ``framework`` event: false once the script changed the environment or
    where MindSpore is found, or loaded another package's compiled library, before importing it
    (a spare imported it already)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("import json\n")
    (tmp_path / "shadow" / "mindspore").mkdir(parents=True)
    (tmp_path / "shadow" / "mindspore" / "__init__.py").write_text("")
    running = {}
    for name, text in KEPT_CASES.items():
        case = tmp_path / name.replace(" ", "_")
        case.mkdir()
        (case / "train.py").write_text(text.format(lib=str(tmp_path / "lib"),
                                                   shadow=str(tmp_path / "shadow")))
        env = {**_base(), "PYTHONPATH": str(BOOT), contract.EVENTS_FILE: str(case / "events.jsonl")}
        running[name] = (case, subprocess.Popen([sys.executable, str(case / "train.py")], env=env))
    kept = {}
    for name, (case, proc) in running.items():
        assert proc.wait(timeout=120) == 0, name
        events = [json.loads(line) for line in (case / "events.jsonl").read_text().splitlines()]
        kept[name] = next(e["kept"] for e in events if e["event"] == "framework")
    assert kept == {"plain": True, "own folder and module first": True,
                    "a compiled library first": False, "an environment variable": False,
                    "another mindspore first": False}


@pytest.fixture(autouse=True)
def _nothing_left(tmp_path: Path):
    yield
    left = [p for p in psutil.process_iter(["environ"])
            if (p.info["environ"] or {}).get("IMPORTED_AT", "").startswith(str(tmp_path))]
    assert not left, f"processes left: {left}"
