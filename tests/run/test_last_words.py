"""Last words (issue 24 part 1), the parts that need no MindSpore: when a rank's state counts as
consistent (in this process), the ledger taking one replica's file as every rank's, and node 0's
request, wait and one line, with plain-Python ranks that speak the trainer's side of it
(``tests/rank_scripts/last_words_plain.py``). The MindSpore half is tests/test_last_words_ranks.py."""
from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from helpers import RANK_SCRIPTS, assert_no_job_processes, run_launcher

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.run.last_words import LastWordsRequest
from parallel.checkpoints import last_words
from parallel.checkpoints.last_words import Answer, Progress, Request
from parallel.checkpoints.manifest import DataPosition
from parallel.contract import Event

PLAIN = str(RANK_SCRIPTS / "last_words_plain.py")


class Recorder:
    """A ``last_words.Saver`` that keeps what it was asked, and can move the main thread on
    while the state is read (``moves``: how many saves see it move)."""

    def __init__(self, holder: dict[str, Progress], moves: int = 0) -> None:
        self.holder, self.moves = holder, moves
        self.calls: list[tuple[str, Any]] = []

    def save(self, step: int, position: DataPosition, held: Any) -> int:
        self.calls.append(("save", step))
        if self.moves:
            self.moves -= 1
            self.holder["now"] = self.holder["now"].begin()
        return step

    def publish(self, saved: int) -> None:
        self.calls.append(("publish", saved))

    def discard(self, saved: int) -> None:
        self.calls.append(("discard", saved))


def _quiet_since(seconds: float, done: int = 7, inside: bool = True) -> Progress:
    position = DataPosition(1, 3, done)
    return Progress(done + 1 if inside else done, done, position, time.monotonic() - seconds)


def test_a_rank_blocked_inside_the_next_step_saves_the_one_it_completed() -> None:
    holder = {"now": _quiet_since(1.0)}
    saver = Recorder(holder)
    said = last_words.answer(lambda: holder["now"], saver, wait=1.0, poll=0.001)
    assert said == Answer(step=7)
    assert saver.calls == [("save", 7), ("publish", 7)]


def test_a_state_read_while_the_main_thread_moved_is_discarded_and_read_again() -> None:
    holder = {"now": _quiet_since(1.0)}
    saver = Recorder(holder, moves=1)
    said = last_words.answer(lambda: holder["now"], saver, wait=1.0, poll=0.001)
    # It moved into step 8 (begun, not done): once quiet again, step 7 is still the last done.
    assert said == Answer(step=7)
    assert saver.calls == [("save", 7), ("discard", 7), ("save", 7), ("publish", 7)]


def test_quiet_from_before_the_loss_is_no_proof_the_step_will_not_complete() -> None:
    """Rank 0 had waited 1 s inside step 8's all-reduce for its lagging peer, which then sent
    its share and died. Asked at once, rank 0 must not save: its step 8 completes a moment
    later, and step 8 is what it saves once quiet inside step 9."""
    holder = {"now": _quiet_since(1.0)}
    saver = Recorder(holder)
    timer = threading.Timer(0.1, lambda: holder.update(
        now=holder["now"].complete(DataPosition(1, 4, 8), 0.01).begin()))
    timer.start()
    said = last_words.answer(lambda: holder["now"], saver, wait=2.0, poll=0.001,
                             since=time.monotonic())
    timer.join()
    assert said == Answer(step=8) and saver.calls == [("save", 8), ("publish", 8)]
    hung = {"now": _quiet_since(1.0)}  # a peer silent for 0.9 s by now: quiet since counts
    said = last_words.answer(lambda: hung["now"], Recorder(hung), wait=1.0, poll=0.001,
                             since=time.monotonic() - 0.9)
    assert said == Answer(step=7)


def test_a_rank_still_computing_is_not_quiet_though_no_step_was_seen() -> None:
    """On a loaded machine a step being applied can go longer than the quiet needed without a
    sign: its threads' CPU tells it from a main thread blocked in the all-reduce. Here another
    thread computes for 0.6 s (the step), then the step completes and the rank blocks."""
    holder = {"now": _quiet_since(1.0)}
    saver = Recorder(holder)
    stop = time.monotonic() + 0.6

    def apply_step() -> None:
        while time.monotonic() < stop:
            sum(range(1000))
        holder["now"] = holder["now"].complete(DataPosition(1, 4, 8), 0.01).begin()

    step = threading.Thread(target=apply_step)
    step.start()
    said = last_words.answer(lambda: holder["now"], saver, wait=3.0, poll=0.01,
                             since=time.monotonic() - 0.9)
    step.join()
    assert said == Answer(step=8) and saver.calls == [("save", 8), ("publish", 8)], \
        "step 7 was never saved while step 8 was being applied"
    busy = {"now": _quiet_since(1.0)}
    spinning = threading.Event()

    def spin() -> None:
        while not spinning.is_set():
            sum(range(1000))

    threading.Thread(target=spin, daemon=True).start()
    try:
        said = last_words.answer(lambda: busy["now"], Recorder(busy), wait=0.5, poll=0.01)
    finally:
        spinning.set()
    assert said.step is None and said.why.startswith("its threads still used ") \
        and said.why.endswith("of a core within 0.5 s (a step being applied is never saved)"), \
        said.why


def test_a_main_thread_that_never_settles_gives_no_state_and_says_why() -> None:
    holder = {"now": _quiet_since(0.0)}
    saver = Recorder(holder)

    def moving() -> Progress:
        holder["now"] = holder["now"].begin()  # a step being applied, again and again
        return holder["now"]

    said = last_words.answer(moving, saver, wait=0.3, poll=0.001)
    assert said.step is None and saver.calls == []
    assert said.why.startswith("the trainer was still inside step 8, not quiet for 0.25 s "
                               "within 0.3 s"), said.why


def test_the_quiet_needed_grows_with_the_steps_seen_and_a_compiling_step_is_not_one() -> None:
    progress = Progress.start(DataPosition())
    assert progress.quiet_needed() == last_words.SETTLE
    progress = progress.begin().complete(DataPosition(0, 1, 1), None)  # compiled: not counted
    assert progress.quiet_needed() == last_words.SETTLE
    progress = progress.begin().complete(DataPosition(0, 2, 2), 0.2)
    assert progress.quiet_needed() == pytest.approx(1.0)


def test_nothing_is_saved_before_a_first_step() -> None:
    holder = {"now": _quiet_since(1.0, done=0, inside=False)}
    saver = Recorder(holder)
    said = last_words.answer(lambda: holder["now"], saver, wait=1.0, poll=0.001)
    assert said == Answer(why="no step completed yet") and saver.calls == []


def test_a_request_names_the_rank_the_attempt_and_since_when(tmp_path: Path) -> None:
    path = tmp_path / "last_words_request"
    assert Request.read(str(path)) is None
    path.write_text("1 2 1700000000.250\n")
    assert Request.read(str(path)) == Request(1, 2, 1700000000.25)
    for partial in ("1", "1 2", "1 2 nan", "1 2 x"):  # being written, or not ours
        path.write_text(partial)
        assert Request.read(str(path)) is None, partial
    asked = Request(0, 0, time.time() - 10.0)
    assert asked.since_monotonic() == pytest.approx(time.monotonic() - 10.0, abs=0.1)
    assert Request.read(str(tmp_path / "x")) is None


def _checkpoint(rank: int, step: int, path: Path, last: bool) -> Event:
    event = Event.parse({"event": "checkpoint", "rank": rank, "host": "h", "time": 1.0,
                         "step": step, "path": str(path), "name": path.name, "size": 10,
                         "sha256": "ab" * 32, "world_size": 2, "last_words": last,
                         "position": {"epoch": 1, "batch_in_epoch": 3, "global_step": step}})
    assert event is not None
    return event


def test_the_ledger_takes_last_words_as_every_ranks_file(tmp_path: Path) -> None:
    ledger = CheckpointLedger(str(tmp_path), 2, data_parallel=True)
    file = tmp_path / "checkpoints" / "step_50" / "rank_0.ckpt"
    assert ledger.record(_checkpoint(0, 49, file.with_name("x.ckpt"), last=False)) is None
    manifest = ledger.record(_checkpoint(0, 50, file, last=True))
    assert manifest is not None and manifest.step == 50
    assert [(f.rank, f.name) for f in manifest.files] == [(0, "rank_0.ckpt"), (1, "rank_0.ckpt")]
    point = ledger.resume_point()
    assert point is not None and point.step == 50 and dict(point.paths) == {0: str(file),
                                                                          1: str(file)}
    written = json.loads((tmp_path / "checkpoint_ledger" / "step_50" / "manifest.json").read_text())
    assert written["step"] == 50


def _launch(tmp: Path, *args: str, restarts: bool = True) -> Any:
    logs = tmp / "logs"
    again = ("--max-restarts", "1", "--restart-backoff", "0") if restarts else ()
    result = run_launcher("--device", "cpu", "--cards", "2", "--console", "none", "--job-id",
                          "last-words", *again, "--log-dir", str(logs), *args, timeout=120)
    assert_no_job_processes("last-words")
    return result, logs


def _rank_lines(logs: Path) -> list[str]:
    return [(logs / f"rank_{r}.log").read_text().strip().splitlines()[-1] for r in (0, 1)]


def test_a_failed_rank_leaves_the_healthy_replicas_last_step_and_the_restart_resumes_it(
        weird_tmp: Path) -> None:
    result, logs = _launch(weird_tmp, PLAIN, "--at", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "last words" in line]
    assert len(said) == 1 and said[0].startswith(
        "npu-launch: last words: rank 0 saved step 3 for every rank before the job was stopped ("), said
    assert _rank_lines(logs) == ["rank 0 resumes from step 3 with ['rank_0.ckpt', 'rank_0.ckpt']",
                                 "rank 1 resumes from step 3 with ['rank_0.ckpt', 'rank_0.ckpt']"]
    summary = json.loads((logs / "summary.json").read_text())
    assert 3 in summary["complete_steps"]


def test_a_replica_that_never_settles_saves_nothing_and_one_line_says_so(weird_tmp: Path) -> None:
    result, logs = _launch(weird_tmp, PLAIN, "--at", "3", "--rank0", "busy")
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "last words" in line]
    assert said == ["npu-launch: no last words: rank 0: the trainer was still inside step 4, not "
                    "quiet for 0.25 s within 2 s (a step being applied is never saved); a restart "
                    "resumes from the start (no complete checkpoint)"], said
    assert _rank_lines(logs) == ["rank 0 resumes from step none with []",
                                 "rank 1 resumes from step none with []"]
    assert not (logs / "checkpoints").exists() or not list((logs / "checkpoints").rglob("*.ckpt"))


def test_a_sliced_layout_has_no_replica_and_is_not_asked(weird_tmp: Path) -> None:
    result, logs = _launch(weird_tmp, "--parallel", "semi", "--mp", "2", PLAIN, "--at", "3",
                           restarts=False)
    assert result.returncode == 3, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "last words" in line]
    assert said == ["npu-launch: no last words: the layout is sliced (model or pipeline "
                    "parallel), no rank holds another's state; a restart resumes from the start "
                    "(no complete checkpoint)"], said
    assert not (logs / "last_words_request").exists()


class FakeAsker:
    """An ``Asker`` over agents, in this process: which ranks it says are lost or cannot be
    asked, and the answer it relays."""

    def __init__(self, lost: set[int], deaf: set[int], answer: str = "") -> None:
        self._lost, self._deaf, self._answer = lost, deaf, answer
        self.asked: list[tuple[int, float]] = []

    def lost(self, ranks: Any) -> set[int]:
        return self._lost

    def unreachable(self, ranks: Any) -> tuple[set[int], str]:
        return self._deaf, "mpirun passes node 0's requests to the first host's agent only"

    def ask(self, group: Any, rank: int, spec: Any, since: float, wait: float) -> str:
        assert spec.rank == rank
        self.asked.append((rank, since))
        return self._answer


def _request(asker: FakeAsker, exited: set[int]) -> tuple[Any, io.StringIO]:
    specs = [SimpleNamespace(rank=r, host=f"h{r // 2}", node_rank=r // 2) for r in range(4)]
    plan = SimpleNamespace(ranks=specs, replicated=True, log_dir="/nonexistent", restart=0)
    attempt = SimpleNamespace(savers={0, 1, 2, 3}, exited=exited, ledger=None)
    err = io.StringIO()
    return LastWordsRequest(cast(Any, plan), cast(Any, attempt), err, cast(Any, asker)), err


def test_node_0_asks_the_lowest_rank_its_agents_can_reach_and_says_what_it_saved() -> None:
    """4 ranks on 2 hosts; rank 0 exited, rank 1 is on the host whose agent reported (lost):
    rank 2 is asked, with the time of the loss."""
    asker = FakeAsker(lost={1}, deaf=set(), answer="saved 7")
    hook, err = _request(asker, exited={0})
    before = time.time()
    hook(cast(Any, None), None)
    assert [rank for rank, _ in asker.asked] == [2] and asker.asked[0][1] >= before
    assert err.getvalue().startswith("npu-launch: last words: rank 2 saved step 7 for every rank")


def test_healthy_ranks_that_cannot_be_asked_are_not_waited_for() -> None:
    asker = FakeAsker(lost={0, 1}, deaf={2, 3})
    hook, err = _request(asker, exited={0})
    hook(cast(Any, None), None)
    assert asker.asked == []
    assert err.getvalue() == (
        "npu-launch: no last words: no healthy rank can be asked: mpirun passes node 0's requests "
        "to the first host's agent only; a restart resumes from the start (no complete "
        "checkpoint)\n")
