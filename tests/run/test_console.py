"""Console and log files: prefixes, whole lines only, carriage-return progress kept, a restart's
boundary on both. (Real MindSpore's own log lines kept off the console:
``run/test_binding_ranks.py``'s MindSpore job.)"""
from __future__ import annotations

import io
import os
import re
import socket
import subprocess
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
PLAIN_JOB = str(RANK_SCRIPTS / "plain_job.py")


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


def test_no_line_of_a_dead_attempt_follows_the_restart_line_unmarked(weird_tmp: Path) -> None:
    """Ranks that print without pause, and for a while as they die, restarted once: on the
    console (stdout and stderr in one pipe, in the order they were written) every line of
    attempt 0 after ``restart 1 of 1`` says ``attempt 0`` in its prefix (none may come: the
    lines waiting to be merged are shown before it), and none of attempt 1 comes before it. In
    each rank's log attempt 1 begins below its mark, and the lines of each attempt are on their
    side of it."""
    logs = weird_tmp / "logs"
    argv = npu_launch_argv("--device", "cpu", "--cards", "2", "--max-restarts", "1",
                           "--restart-backoff", "0", "--job-id", "flood", "--log-dir", str(logs),
                           PLAIN_JOB, "--chatter", "--steps", "4", "--step-time", "0.3",
                           "--fail-at-attempt", "0:1")
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("npu-launch: restart 1 of 1"))
    assert not [line for line in lines[:at] if "attempt 1" in line], "attempt 1 before its restart"
    assert any("attempt 0 line" in line for line in lines[:at])
    host = re.escape(socket.gethostname())
    tagged = re.compile(rf"\[{host}:[\d,-]+ attempt 0\] ")
    late = [line for line in lines[at + 1:] if re.search(r"attempt 0 (rank \d+ )?line", line)]
    assert all(tagged.match(line) for line in late), [line for line in late
                                                      if not tagged.match(line)][:5]
    assert not [line for line in lines[at + 1:] if " attempt 1] " in line]
    for rank in (0, 1):
        text = (logs / f"rank_{rank}.log").read_text()
        marks = re.findall(r"^==== npu-launch: job flood, attempt 1 \(restart 1\), [\d:\- ]+ ====$",
                           text, re.M)
        assert len(marks) == 1, text[-2000:]
        before, after = text.split(marks[0])
        assert "attempt 0 line" in before and "attempt 1" not in before
        assert "attempt 1 line" in after and "attempt 0" not in after
    assert_no_job_processes("flood")


def test_a_line_of_an_ended_attempt_says_which_and_is_merged_with_no_other() -> None:
    """The console's side of a restart, line by line: what waits to be merged leaves as the
    restart begins; later, a line of attempt 0 is tagged, one of attempt 1 is not, and alike
    lines of the two attempts are not merged."""
    from launcher.run.console_lines import RankLines
    from launcher.run.output import Console

    stream = io.BytesIO()
    console = Console(stream)
    console.show_rank_lines(RankLines(console.write_rank_line, 2, merge=True, runtime_logs=False,
                                      clock=lambda: 0.0))
    old0, old1 = console.rank_sink("vm", 0, 0), console.rank_sink("vm", 1, 0)
    old0(b"waits for rank 1")
    assert stream.getvalue() == b""
    console.begin_attempt(1)
    assert stream.getvalue() == b"[vm:0] waits for rank 1\n", "shown before the restart line"
    new0 = console.rank_sink("vm", 0, 1)
    old1(b"step 3")
    new0(b"step 3")
    old0(b"step 3")
    console.rank_line("vm", 1, b"step 3", 1)
    console.close()
    assert stream.getvalue().decode().splitlines()[1:] == [
        "[vm:0-1 attempt 0] step 3", "[vm:0-1] step 3"]
    plain = io.BytesIO()
    unmerged = Console(plain)
    unmerged.begin_attempt(2)
    unmerged.sink("a:agent", 1)(b"late")
    unmerged.rank_sink("a", 3, 2)(b"now")
    assert plain.getvalue() == b"[a:agent attempt 1] late\n[a:3] now\n"


def test_a_failure_block_reads_the_current_attempt_of_a_rank_log(tmp_path: Path) -> None:
    """A rank's log holds every attempt (appended): each after the first below its mark. The
    failure block's last lines and MindSpore error lines are the current attempt's alone."""
    from launcher.run.failures import error_lines, last_lines_block
    from launcher.run.output import mark_attempt, tail

    log = tmp_path / "rank_0.log"
    mark_attempt(str(log), "j", 1, 0.0)
    assert not log.exists() or log.read_bytes() == b"", "an empty log gets no mark"
    log.write_bytes(b"[ERROR] ME(1:2,MainProcess): attempt 0 broke\nold line\rprogress 9%")
    mark_attempt(str(log), "j", 1, 0.0)
    log.open("ab").write(b"new line\n")
    data = log.read_bytes().decode()
    assert re.search(r"progress 9%\n==== npu-launch: job j, attempt 1 \(restart 1\), .* ====\n"
                     r"new line\n$", data), data
    assert tail(str(log)) == ["new line"]
    assert error_lines(str(log)) == []
    assert "attempt 0 broke" not in "\n".join(last_lines_block(str(log), 20))
    mark_attempt(str(log), "j", 2, 0.0)
    assert tail(str(log)) == []
