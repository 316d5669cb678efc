"""One live job per log directory (``launcher.observe.joblock``), in-process and across a process.

The lock is the kernel's ``flock``: a second holder is refused naming the live one's pid, a
released or dead holder frees it, and a log directory that cannot be made is refused first."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.observe.joblock import LOCK_NAME, LogDirLock, check_log_dir


def test_a_second_lock_is_refused_naming_the_holder_and_free_once_released(tmp_path: Path) -> None:
    first = LogDirLock(str(tmp_path / "logs"), "nightly").acquire()
    assert (tmp_path / "logs" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(ConfigError, match=rf"job nightly: log directory .* is in use by a live "
                                          rf"job \(npu-launch pid {os.getpid()}\)"):
        LogDirLock(str(tmp_path / "logs"), "nightly").acquire()
    first.release()
    first.release()  # idempotent
    LogDirLock(str(tmp_path / "logs"), "nightly").acquire().release()


def test_a_dead_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = ("import sys; from launcher.observe.joblock import LogDirLock; "
            "LogDirLock(sys.argv[1], 'j').acquire(); print('held', flush=True); "
            "import os; os._exit(9)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout == "held\n" and done.returncode == 9
    LogDirLock(str(tmp_path), "j").acquire().release()


def test_a_log_dir_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="lies under .*file, a file, not a folder"):
        check_log_dir(str(tmp_path / "file" / "logs"))
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_log_dir(str(tmp_path / "file"))
    check_log_dir(str(tmp_path / "new" / "deeper"))
