"""Console and log files: prefixes, whole lines only, carriage-return progress kept. (Real
MindSpore's own log lines kept off the console: ``run/test_binding_ranks.py``'s MindSpore job.)"""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from helpers import (
    RANK_SCRIPTS,
    UNWRITABLE_STDOUTS,
    assert_no_job_processes,
    npu_launch_argv,
    per_rank,
    run_launcher,
    run_unwritable,
)

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



@pytest.mark.parametrize("stdout", UNWRITABLE_STDOUTS)
def test_a_console_that_cannot_be_written_leaves_the_job_and_its_logs_whole(weird_tmp: Path,
                                                                           stdout: str) -> None:
    """Only the console's copy of the rank lines is lost, said once on stderr."""
    logs = weird_tmp / "logs"
    argv = npu_launch_argv("--device", "cpu", "--cards", "2", "--job-id", "mute", "--log-dir",
                           str(logs), CHATTY, "--lines", "300")
    result = run_unwritable(argv, stdout)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    lost = [line for line in result.stderr.splitlines() if "cannot write rank lines" in line]
    assert len(lost) == 1 and lost[0].endswith("they go to the rank logs only"), result.stderr
    for rank in (0, 1):
        raw = (logs / f"rank_{rank}.log").read_bytes()
        assert raw.count(b"\n") == 300 and raw.endswith(b"\rprogress 100%"), raw[-80:]
    assert "finished: 2 rank(s) exited 0" in result.stderr
    assert_no_job_processes("mute")


def test_a_line_of_megabytes_is_shown_once_and_cut_and_its_log_keeps_all(tmp_path: Path) -> None:
    """A rank's 100 MB line was copied whole at every 64 KiB read and shown again each second
    (6.3 GB of console for one line, 97 s); the console now shows at most ``CONSOLE_LINE_MAX``
    bytes of a line once it ends, a progress bar's latest state, and the log all of it."""
    from launcher.run.output import CONSOLE_LINE_MAX, Pump

    read_end, write_end = os.pipe()
    shown: list[bytes] = []
    pump = Pump(read_end, str(tmp_path / "rank_0.log"), "vm:0", shown.append)
    pump.start()
    long_line = b"x" * (4 << 20)
    progress = b"".join(b"\rstep %d of 50000" % i for i in range(50000))  # 800 KB, no newline
    with os.fdopen(write_end, "wb") as w:
        for data in (b"first\n", long_line, b"-end\n", progress, b"\nlast"):
            w.write(data)
    pump.join(30)
    assert not pump.is_alive()
    assert (tmp_path / "rank_0.log").read_bytes() == b"first\n" + long_line + b"-end\n" + \
        progress + b"\nlast"
    ended = [line for line in shown if not line.startswith(b"step")]
    assert ended[0] == b"first" and ended[-1] == b"last"
    cut = [line for line in ended if line.startswith(b"xxx")]
    assert cut and all(len(line) < CONSOLE_LINE_MAX + 64 for line in cut)
    assert cut[-1].endswith(b" ...(%d bytes more in the rank's log)" % (len(long_line) + 4 -
                                                                        CONSOLE_LINE_MAX))
    assert b"step 49999 of 50000" in shown, "the progress bar's last state"
    assert sum(map(len, shown)) < 4 * CONSOLE_LINE_MAX


def test_a_ranks_terminal_codes_are_shown_not_obeyed_in_the_failure_block(weird_tmp: Path) -> None:
    """A failed rank's last line clearing the screen (``ESC[2J``) or setting the terminal's
    title ran when the block that names it was printed, and could wipe it."""
    script = weird_tmp / "wipes.py"
    script.write_text('import sys\nprint("\\x1b[2J\\x1b]0;pwned\\x07gone", flush=True)\n'
                      'raise RuntimeError("\\x1b[31mred\\x1b[0m")\n')
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "wipes", "--log-dir",
                          str(weird_tmp / "logs"), str(script))
    assert result.returncode == 1, result.stderr
    block = result.stderr[result.stderr.index("failed: rank"):]
    assert "\x1b" not in block and "\x07" not in block, block
    assert "RuntimeError: \\x1b[31mred\\x1b[0m" in block
    assert "| \\x1b[2J\\x1b]0;pwned\\x07gone" in block
    assert_no_job_processes("wipes")
