"""Console and log files: prefixes, whole lines only, carriage-return progress kept."""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, TESTS, assert_no_job_processes, per_rank, run_launcher

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


PLAIN = str(TESTS / "plain_scripts" / "plain_loop.py")


REPLAY = ("import os, sys\n"
          "path = sys.argv[1].replace('RANK', os.environ['RANK_ID'])\n"
          "sys.stdout.write(open(path, encoding='utf-8', errors='replace').read())\n")
"""A rank that prints again, line for line, what a rank of an earlier job wrote to its log."""


@pytest.mark.mindspore
def test_runtime_chatter_stays_in_the_logs_and_alike_lines_are_shown_once(weird_tmp: Path) -> None:
    """Real MindSpore ranks: its INFO/WARNING lines (``[WARNING] DISTRIBUTED(pid,...``) reach the
    rank logs only; the checksum line both ranks print alike is shown once as [host:0-1]. With
    ``--runtime-logs --no-merge-lines`` the same real lines, printed again by plain ranks from
    the first job's logs (``REPLAY``: no second MindSpore job), are all shown."""
    host = socket.gethostname()
    logs = weird_tmp / "default"
    result = run_launcher("--device", "cpu", "--cards", "2", "--log-dir", str(logs), PLAIN,
                          "--steps", "4", env={**os.environ, "GLOG_v": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    shown, log = result.stdout, (logs / "rank_0.log").read_text()
    chatter = [line for line in log.splitlines() if line.startswith(("[INFO] ", "[WARNING] "))]
    assert chatter, "MindSpore said something at INFO (GLOG_v=1) in the rank's log"
    assert not any(c in shown for c in chatter[:50]), "...and none of it on the console"
    assert shown.count(" checksum ") == 1 and f"[{host}:0-1] checksum " in shown, shown[-2000:]
    (weird_tmp / "replay.py").write_text(REPLAY)
    again = run_launcher("--device", "cpu", "--cards", "2", "--log-dir", str(weird_tmp / "all"),
                         "--runtime-logs", "--no-merge-lines", str(weird_tmp / "replay.py"),
                         str(logs / "rank_RANK.log"))
    assert again.returncode == 0, again.stderr[-3000:]
    everything = again.stdout
    assert any(line.startswith((f"[{host}:0] [INFO] ", f"[{host}:1] [WARNING] ",
                                f"[{host}:0] [WARNING] ", f"[{host}:1] [INFO] "))
               for line in everything.splitlines()), "--runtime-logs shows them"
    assert f"[{host}:0] checksum" in everything and f"[{host}:1] checksum" in everything
    assert f"[{host}:0] {chatter[0]}" in everything, "line for line"
