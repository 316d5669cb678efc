"""Console and log files: prefixes, whole lines only, carriage-return progress kept. (Real
MindSpore's own log lines kept off the console: ``run/test_binding_ranks.py``'s MindSpore job.)"""
from __future__ import annotations

import re
import socket
from pathlib import Path

from helpers import RANK_SCRIPTS, assert_no_job_processes, per_rank, run_launcher

CHATTY = str(RANK_SCRIPTS / "chatty.py")


def test_lines_are_prefixed_whole_and_progress_is_kept(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "chat", "--log-dir",
                          str(logs), CHATTY, "--lines", "300")
    assert result.returncode == 0, result.stderr
    host = socket.gethostname()
    pattern = re.compile(rf"\[{re.escape(host)}:(\d)\] rank(\d)-line(\d+)-x{{3000}}-end(\d+)$")
    seen = {0: 0, 1: 0}
    for line in result.stdout.splitlines():
        if "-line" not in line:
            continue
        m = pattern.match(line)
        assert m, f"torn or unprefixed line: {line[:80]}...{line[-40:]}"
        assert m.group(1) == m.group(2) and m.group(3) == m.group(4)
        seen[int(m.group(1))] += 1
    assert seen == {0: 300, 1: 300}
    for rank in (0, 1):
        assert f"[{host}:{rank}] progress 100%" in per_rank(result.stdout)
        raw = (logs / f"rank_{rank}.log").read_bytes()
        assert raw.endswith(b"\rprogress 10%\rprogress 50%\rprogress 100%"), raw[-80:]
    assert_no_job_processes("chat")


def test_console_filter_and_failing_exit_code(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--console", "1", "--log-dir",
                          str(logs), "--job-id", "filt", CHATTY, "--lines", "3", "--code", "7")
    assert result.returncode == 7, result.stderr
    host = socket.gethostname()
    assert f"[{host}:1] rank1-line0" in result.stdout
    assert f"[{host}:0]" not in result.stdout
    assert "rank0-line2" in (logs / "rank_0.log").read_text()
    assert "exited with code 7" in result.stderr
    assert_no_job_processes("filt")

