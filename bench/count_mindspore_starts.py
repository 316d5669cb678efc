"""Count the MindSpore start-ups a command causes: every Python process that imports MindSpore.

    python bench/count_mindspore_starts.py -- python -m pytest -q -p no:cacheprovider tests

For the length of the command, a ``.pth`` file in this interpreter's site-packages makes every
Python process (the test process, npu-launch, its ranks and schedulers, on every test host,
which share the image) append one line to a log as it begins importing ``mindspore``: its pid
and command line. The file is removed afterwards, whatever happens. The count is of processes,
grouped by what they were (a scheduler, a rank script, the test process itself).

This changes nothing the command runs: the hook finds nothing itself and is a dictionary lookup
per import. It measures the suite for issue 23 ("at most 40 MindSpore start-ups").
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional

_CHILD_GRACE = 30.0
"""Seconds the command gets to end after the SIGTERM this script passes on, before SIGKILL."""

_HOOK = """\
import sys, os
class _NpuLaunchCount:
    def find_spec(self, name, path=None, target=None):
        if name == "mindspore":
            sys.meta_path.remove(self)
            try:
                with open({log!r}, "a") as f:
                    f.write(__import__("json").dumps([os.getpid(), sys.argv,
                        os.environ.get("PYTEST_CURRENT_TEST", "").split(" (")[0]]) + "\\n")
            except OSError:  # counting must never change what runs
                pass
        return None
sys.meta_path.insert(0, _NpuLaunchCount())
"""


def kind_of(argv: list[str]) -> str:
    """What a process that imported MindSpore was, from its ``sys.argv``: MindSpore's scheduler
    (one per MindSpore job and attempt), the test process itself, or a rank (its script)."""
    first = argv[0] if argv else ""
    if first.endswith(os.path.join("parallel", "scheduler.py")):
        return "scheduler (one per MindSpore job)"
    if first.endswith(os.path.join("pytest", "__main__.py")) or Path(first).name == "pytest":
        return "the test process (MindSpore imported in-process)"
    return f"rank: {Path(first).name if first.endswith('.py') else first or '?'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    parser.add_argument("--json", help="write the counts here too")
    parser.add_argument("--by-test", action="store_true",
                        help="also count by the test that was running (pytest commands)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # Not under /tmp: the multi-node tests' hosts each have a private /tmp, but share the rest.
    log = Path(tempfile.mkdtemp(prefix=".ms-starts-", dir=os.getcwd())) / "starts.jsonl"
    log.touch()
    os.chmod(log.parent, 0o777)
    os.chmod(log, 0o666)
    pth = Path(site.getsitepackages()[0]) / "zz_npu_launch_count_mindspore.pth"
    pth.write_text("import sys; exec(" + repr(_HOOK.format(log=str(log))) + ")\n")

    child: Optional[subprocess.Popen] = None
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        """Pass the stop on to the command (none of it runs on uncounted): its end returns
        the wait below. No wait here: the interrupted one holds the Popen's lock."""
        stopped.append(signum)
        if child is not None:
            child.terminate()
            killer = threading.Timer(_CHILD_GRACE, child.kill)
            killer.daemon = True
            killer.start()

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        child = subprocess.Popen(command)
        if stopped:  # before there was a command to pass it on to
            child.terminate()
        code = child.wait()
        if stopped:
            raise SystemExit(128 + stopped[0])  # so that the hook is removed below, as on Ctrl-C
    except BaseException:  # stopped: nothing to count, and no folder left in the checkout
        shutil.rmtree(log.parent, ignore_errors=True)
        raise
    finally:
        pth.unlink()
    starts = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    shutil.rmtree(log.parent)
    kinds = collections.Counter(kind_of(start[1]) for start in starts)
    print(f"MindSpore start-ups: {len(starts)} (command exited {code})")
    for kind, n in kinds.most_common():
        print(f"  {n:4d}  {kind}")
    if args.by_test:
        tests = collections.Counter(start[2] or "(not under a test's environment: over ssh, "
                                    "srun or mpirun)" for start in starts)
        print("By test (the test that was running, from PYTEST_CURRENT_TEST):")
        for test, n in tests.most_common():
            print(f"  {n:4d}  {test}")
    if args.json:
        Path(args.json).write_text(json.dumps({"total": len(starts), "by_kind": dict(kinds),
                                               "exit_code": code}, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
