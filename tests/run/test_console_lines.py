"""Node 0's view of rank lines (``launcher.run.console_lines``), on a fake clock: merging keeps each
rank's order, waits at most the window, and leaves at once when every rank said the line."""
from __future__ import annotations

from launcher.ranks.ranges import label
from launcher.run.console_lines import WINDOW, RankLines, is_runtime_chatter, without_runtime_chatter


class Screen:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, label: str, attempt: int, line: bytes) -> None:
        self.lines.append(f"[{label}] {line.decode()}")


def test_alike_lines_leave_once_complete_and_in_first_come_order() -> None:
    now = [0.0]
    screen = Screen()
    view = RankLines(screen.write, 3, merge=True, runtime_logs=False, clock=lambda: now[0])
    view.show("vm", 0, b"epoch 1")
    view.show("vm", 0, b"only rank 0")
    view.show("vm", 1, b"epoch 1")
    assert screen.lines == [], "epoch 1 waits for rank 2; what came after it waits behind it"
    view.show("vm", 2, b"epoch 1")
    assert screen.lines == ["[vm:0-2] epoch 1"]
    now[0] = WINDOW + 0.01
    view.show("vm", 1, b"later")
    assert screen.lines == ["[vm:0-2] epoch 1", "[vm:0] only rank 0"]
    view.close()
    assert screen.lines[-1] == "[vm:1] later"
    view.show("vm", 2, b"after close")
    assert screen.lines[-1] == "[vm:2] after close", "shown at once once closed"


def test_a_rank_saying_the_same_twice_is_two_lines_and_hosts_are_grouped() -> None:
    now = [0.0]
    screen = Screen()
    view = RankLines(screen.write, 4, merge=True, runtime_logs=False, clock=lambda: now[0])
    for rank, host in ((0, "a"), (0, "a"), (1, "a"), (3, "b")):
        view.show(host, rank, b"...")
    view.close()
    assert screen.lines == ["[a:0-1 b:3] ...", "[a:0] ..."]
    assert label({0: "a", 1: "a", 3: "a", 4: "b", 5: "b"}) == "a:0-1,3 b:4-5"


def test_runtime_chatter_is_told_apart_and_unmerged_lines_pass_at_once() -> None:
    assert is_runtime_chatter(b"[WARNING] DISTRIBUTED(20481,7f12877fe6c0,python3.11):2026-12-01"
                              b"-16:15:27.504.479 [mindspore/ccsrc/cluster/topology] retry(1/3600)")
    assert is_runtime_chatter(b"[INFO] ME(18850:140221033847680,MainProcess):2026-12-01 [x] y")
    assert not is_runtime_chatter(b"[ERROR] ME(18850:140221033847680,MainProcess):2026 boom")
    assert not is_runtime_chatter(b"[INFO] my own script's line")
    screen = Screen()
    view = RankLines(screen.write, 2, merge=False, runtime_logs=False)
    view.show("vm", 1, b"[INFO] ME(1:2,MainProcess):x")
    view.show("vm", 1, b"[ERROR] ME(1:2,MainProcess):x")
    view.show("vm", 0, b"hello")
    assert screen.lines == ["[vm:1] [ERROR] ME(1:2,MainProcess):x", "[vm:0] hello"]


COMPILE_CACHE = (b"[WARNING] PIPELINE(8757,7f220ac3eb80,python):2026-12-04-16:48:38.809.636 [mindspore/"
                 b"ccsrc/frontend/jit/ps/resource.cc:751] GetCompileCacheResource] Check the consistency"
                 b" of dependency files hash failed. Execute all the compilation actions.")
"""MindSpore 2.10's compile-cache line as a rank's log holds it (a job run twice into one
--log-dir: the cache is npu-launch's default), once or more per rank and graph."""


def test_the_compile_cache_line_is_chatter_alone_or_glued_to_a_ranks_unended_line() -> None:
    """Its real form (read in rank logs) starts with ``[WARNING] PIPELINE(pid,thread,...``; a rank
    whose stdout had an unended line (``print("compiling ... ", end="")``) gets it glued on, as
    stdout and stderr share one pipe: the console shows the rank's part only, and with
    ``--runtime-logs`` all of it."""
    assert is_runtime_chatter(COMPILE_CACHE)
    glued = b"compiling ... " + COMPILE_CACHE
    assert without_runtime_chatter(COMPILE_CACHE) is None
    assert without_runtime_chatter(glued) == b"compiling ... "
    assert without_runtime_chatter(b"   " + COMPILE_CACHE) is None
    error = b"epoch 1 [ERROR] PIPELINE(8757,7f22,python):2026 [x] boom"
    assert without_runtime_chatter(error) == error
    screen = Screen()
    view = RankLines(screen.write, 2, merge=False, runtime_logs=False)
    for line in (COMPILE_CACHE, glued, b"done"):
        view.show("vm", 0, line)
    assert screen.lines == ["[vm:0] compiling ... ", "[vm:0] done"]
    shown = Screen()
    everything = RankLines(shown.write, 2, merge=False, runtime_logs=True)
    everything.show("vm", 0, glued)
    assert shown.lines == ["[vm:0] " + glued.decode()]
