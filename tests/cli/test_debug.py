"""--debug: one rank in the foreground with the terminal, so pdb works."""
from __future__ import annotations

import sys
from pathlib import Path

import pexpect
from helpers import REPO, assert_no_job_processes


def test_breakpoint_in_debug_mode(weird_tmp: Path) -> None:
    script = weird_tmp / "bp.py"
    script.write_text("import os\nvalue = 6\nbreakpoint()\n"
                      "print('rank', os.environ['RANK_ID'], 'debug', os.environ['NPU_LAUNCH_DEBUG'],"
                      " 'after', value)\n")
    child = pexpect.spawn(sys.executable, ["-m", "launcher.cli", "--debug", "--device", "cpu",
                                           "--job-id", "dbg", "--log-dir", str(weird_tmp / "l"),
                                           str(script)],
                          cwd=str(REPO), encoding="utf-8", timeout=60)
    child.expect(r"\(Pdb\) ")
    child.sendline("p 6*7")
    child.expect("42")
    child.expect(r"\(Pdb\) ")
    child.sendline("c")
    child.expect("rank 0 debug 1 after 6")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert_no_job_processes("dbg")


def test_debug_mode_reports_exception(weird_tmp: Path) -> None:
    script = weird_tmp / "bad.py"
    script.write_text("def f():\n    raise KeyError('missing-key')\nf()\n")
    child = pexpect.spawn(sys.executable, ["-m", "launcher.cli", "--debug", "--device", "cpu",
                                           "--log-dir", str(weird_tmp / "l"), str(script)],
                          encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert "failed: rank 0" in child.before and "KeyError: 'missing-key'" in child.before
