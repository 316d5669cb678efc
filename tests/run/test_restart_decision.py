"""The restart decision (``launcher.run.restart_decision.decide``) as a table, without processes:
what an attempt's end, the budget, the hosts blamed so far and the card re-check make the
launcher do next. The same lines end to end: ``tests/run/test_restarts.py`` (one node),
``tests/multinode/test_restarts_hosts.py`` (a host left out), ``tests/cluster/test_card_health.py``
(a held card)."""
from __future__ import annotations

from typing import Optional

import pytest

from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.restart_decision import (
    CARDS_FIT,
    AttemptEnd,
    BlameHistory,
    CardVerdict,
    Decision,
    GoesOn,
    JobShape,
    RestartDecision,
    decide,
)
from launcher.run.restarts import BEFORE_ANY_PROGRESS, NO_PROGRESS_EXIT_CODE, FailurePoint, Policy

LINK_DOWN = "b card 1: link DOWN (hccn_tool -i 1 -link -g)"


def _failed(rank: int = 2, host: str = "b", outcome: Outcome = Outcome.FAILED) -> JobResult:
    code = {Outcome.FAILED: 1, Outcome.STALLED: 124, Outcome.SUCCEEDED: 0, Outcome.INTERRUPTED: 130}[outcome]
    cause = None if outcome is Outcome.SUCCEEDED else Cause(outcome, "rank", rank, host, 10, code,
                                                            "RuntimeError", "boom")
    word = {Outcome.FAILED: "failed", Outcome.STALLED: "stopped"}.get(outcome, outcome.value)
    return JobResult(outcome, code, f"npu-launch: job j {word}: rank {rank} on {host}", 5.0, cause)


def _end(attempt: int = 1, where: tuple[str, int] = ("step", 50), complete: Optional[int] = None,
         started_up: bool = True, result: Optional[JobResult] = None) -> AttemptEnd:
    result = result or _failed()
    return AttemptEnd(result, attempt, started_up, FailurePoint.of(result, where, complete))


def _history(*blamed: Optional[str], where: tuple[str, int] = ("step", 50),
             complete: Optional[int] = None) -> BlameHistory:
    """The hosts blamed before, the last failure rank 2's on b at ``where``."""
    return BlameHistory(blamed, FailurePoint.of(_failed(), where, complete) if blamed else None)


def _shape(hosts: tuple[str, ...] = ("a", "b"), batch: Optional[int] = 64,
           without: Optional[str] = "fits") -> JobShape:
    """Two ranks a host; ``without``: "fits" (the job goes on without a host), "layout" (its
    layout does not), None (no ``Job.without``)."""
    goes_on = {"fits": lambda host: GoesOn(len(hosts) - 1, 2 * (len(hosts) - 1)),
               "layout": lambda host: GoesOn(problem="the layout (mode semi, mp 2, pp 1) cannot go on")}
    return JobShape("j", hosts, 2 * len(hosts), {h: 2 for h in hosts}, batch,
                    goes_on[without] if without else None)


def _decided(end: AttemptEnd, policy: Policy, history: BlameHistory, shape: JobShape,
             cards: CardVerdict = CARDS_FIT) -> tuple[RestartDecision, RestartDecision]:
    """The decision before the card re-check, and the final one (the same when it stops)."""
    first = decide(end, policy, history, shape)
    if first.kind is not Decision.CHECK_CARDS:
        return first, first
    return first, decide(end, policy, history, shape, cards)


RESTARTS = Policy(max_restarts=3, backoff=1.0, backoff_max=60.0)
MIN_NODES = Policy(max_restarts=3, backoff=1.0, backoff_max=60.0, min_nodes=1)
THREE_HOSTS = _shape(hosts=("a", "b", "c"), batch=18)  # 6 ranks; 18 does not split over 4
LEAVING_B = ("npu-launch: leaving b out: its ranks caused the last 2 failures; 1 host(s) and 2 rank(s) go on "
             "(--min-nodes 1), the global batch kept")

CASES = [
    # (name, end, policy, history, shape, cards) -> (kind, host, exit code, fragment of a line or the message)
    ("the budget is spent", _end(attempt=3), RESTARTS, _history(), _shape(), CARDS_FIT,
     Decision.BUDGET_SPENT, None, 1, "job j failed: rank 2 on b"),
    ("a success is not restarted", _end(result=_failed(outcome=Outcome.SUCCEEDED)), RESTARTS, _history(), _shape(),
     CARDS_FIT, Decision.NOT_RESTARTABLE, None, 0, "job j succeeded"),
    ("a signal is not restarted", _end(result=_failed(outcome=Outcome.INTERRUPTED)), RESTARTS, _history(),
     _shape(), CARDS_FIT, Decision.NOT_RESTARTABLE, None, 130, "job j interrupted"),
    ("a hang is restarted like a failure", _end(result=_failed(outcome=Outcome.STALLED)), RESTARTS, _history(),
     _shape(), CARDS_FIT, Decision.RESTART, None, 124, ""),
    ("before start-up, without --min-nodes", _end(started_up=False), RESTARTS, _history(), _shape(), CARDS_FIT,
     Decision.NOT_STARTED_UP, None, 1,
     "npu-launch: not restarted: rank 2 failed before every rank had initialised communication (MindSpore's"),
    ("before start-up, with --min-nodes", _end(started_up=False), MIN_NODES, _history(), _shape(), CARDS_FIT,
     Decision.NOT_STARTED_UP, None, 1, "npu-launch: not restarted: rank 2 failed before it called init() ("),
    ("the first failure", _end(attempt=0), RESTARTS, _history(), _shape(), CARDS_FIT,
     Decision.RESTART, None, 1, ""),
    ("the same failure twice", _end(), RESTARTS, _history("b"), _shape(), CARDS_FIT,
     Decision.CANNOT_HELP, None, NO_PROGRESS_EXIT_CODE,
     "npu-launch: not restarting: the last two attempts failed at step 50 with the same root cause (rank 2, "
     "RuntimeError) and no complete checkpoint: a restart cannot help (exit 93)"),
    ("the same failure before any step twice", _end(where=BEFORE_ANY_PROGRESS), RESTARTS,
     _history("b", where=BEFORE_ANY_PROGRESS), _shape(), CARDS_FIT, Decision.CANNOT_HELP, None, 93,
     "failed before any step or progress with the same root cause"),
    ("the same failure twice but a newer checkpoint", _end(complete=40), RESTARTS, _history("b"), _shape(),
     CARDS_FIT, Decision.RESTART, None, 1, ""),
    ("twice at another step", _end(where=("step", 60)), RESTARTS, _history("b"), _shape(), CARDS_FIT,
     Decision.RESTART, None, 1, ""),
    ("a host blamed twice, enough hosts left", _end(), MIN_NODES, _history("b"), _shape(), CARDS_FIT,
     Decision.LEAVE_OUT, "b", 1, LEAVING_B),
    ("blamed twice, too few hosts left", _end(where=("step", 60)),
     Policy(3, 1.0, 60.0, min_nodes=2), _history("b"), _shape(), CARDS_FIT, Decision.RESTART, None, 1, ""),
    ("blamed twice, too few hosts left, the same failure", _end(),
     Policy(3, 1.0, 60.0, min_nodes=2), _history("b"), _shape(), CARDS_FIT, Decision.CANNOT_HELP, None, 93, ""),
    ("blamed twice, the batch does not split", _end(where=("step", 60)), MIN_NODES, _history("b"), THREE_HOSTS,
     CARDS_FIT, Decision.STAY, "b", 1,
     "npu-launch: b caused the last 2 failures but stays in the job: the global batch of 18 (over 6 ranks) "
     "does not split over 4 ranks"),
    ("blamed twice, it stays, the same failure", _end(), MIN_NODES, _history("b"), THREE_HOSTS, CARDS_FIT,
     Decision.CANNOT_HELP, None, 93, "npu-launch: b caused the last 2 failures but stays in the job: the global"),
    ("blamed twice, the layout cannot go on", _end(where=("step", 60)), MIN_NODES, _history("b"),
     _shape(without="layout"), CARDS_FIT, Decision.STAY, "b", 1,
     "npu-launch: b caused the last 2 failures but stays in the job: the layout (mode semi"),
    ("blamed twice, the layout cannot go on, the same failure", _end(), MIN_NODES, _history("b"),
     _shape(without="layout"), CARDS_FIT, Decision.CANNOT_HELP, None, 93, "a restart cannot help (exit 93)"),
    ("blamed twice, no Job.without", _end(where=("step", 60)), MIN_NODES, _history("b"), _shape(without=None),
     CARDS_FIT, Decision.RESTART, None, 1, ""),
    ("blamed twice, no Job.without, the same failure", _end(), MIN_NODES, _history("b"), _shape(without=None),
     CARDS_FIT, Decision.CANNOT_HELP, None, 93, "a restart cannot help (exit 93)"),
    ("blamed once each, two hosts", _end(where=("step", 60)), MIN_NODES, _history("a"), _shape(), CARDS_FIT,
     Decision.RESTART, None, 1, ""),
    ("a bad card, its host can leave", _end(attempt=0), MIN_NODES, _history(), _shape(),
     CardVerdict("b", LINK_DOWN), Decision.LEAVE_OUT, "b", 1,
     f"npu-launch: leaving b out: {LINK_DOWN}; 1 host(s) and 2 rank(s) go on (--min-nodes 1), the global batch kept"),
    ("a bad card, no --min-nodes", _end(attempt=0), RESTARTS, _history(), _shape(without=None),
     CardVerdict("b", LINK_DOWN), Decision.BAD_CARDS, "b", 1, f"npu-launch: job j not restarted: {LINK_DOWN}\n"),
    ("a bad card, too few hosts left", _end(attempt=0), Policy(3, 1.0, 60.0, min_nodes=2), _history(), _shape(),
     CardVerdict("b", LINK_DOWN), Decision.BAD_CARDS, "b", 1, f"npu-launch: job j not restarted: {LINK_DOWN}"),
    ("a bad card, the batch does not split", _end(attempt=0), MIN_NODES, _history(), THREE_HOSTS,
     CardVerdict("b", LINK_DOWN), Decision.BAD_CARDS, "b", 1,
     f"npu-launch: {LINK_DOWN} but stays in the job: the global batch of 18"),
]


@pytest.mark.parametrize("name, end, policy, history, shape, cards, kind, host, code, said", CASES,
                         ids=[case[0] for case in CASES])
def test_the_decision(name: str, end: AttemptEnd, policy: Policy, history: BlameHistory, shape: JobShape,
                      cards: CardVerdict, kind: Decision, host: Optional[str], code: int, said: str) -> None:
    _, decision = _decided(end, policy, history, shape, cards)
    assert (decision.kind, decision.stops) == (kind, kind.stops)
    assert decision.result.exit_code == code
    assert decision.host == host
    told = "\n".join((*decision.lines, decision.result.message))
    assert said in told, told


def test_a_restart_is_said_before_the_cards_are_checked_and_waits_the_backoff() -> None:
    result = JobResult(Outcome.FAILED, 1, "npu-launch: job j failed: rank 2 on b\n"
                       "npu-launch: likely cause: a card fell off the bus (faults.yaml: x)\nmore", 5.0,
                       Cause(Outcome.FAILED, "rank", 2, "b", 10, 1, "RuntimeError", "boom"))
    end = AttemptEnd(result, 1, True, FailurePoint.of(result, ("step", 7), None),
                     ("npu-launch: likely cause: a card fell off the bus (faults.yaml: x)",))
    first = decide(end, RESTARTS, _history("a"), _shape())
    assert (first.kind, first.host, first.attempt, first.wait_s, first.stops) == (
        Decision.CHECK_CARDS, "b", 2, 2.0, False)
    assert first.lines == ("npu-launch: restart 2 of 3 in 2 s after: job j failed: rank 2 on b",
                           "npu-launch: likely cause: a card fell off the bus (faults.yaml: x)")
    at_once = decide(_end(attempt=0), Policy(3, 1.0, 60.0, first_at_once=True), _history(), _shape())
    assert at_once.lines == ("npu-launch: restart 1 of 3 after: job j failed: rank 2 on b",)
    then = decide(end, RESTARTS, _history("a"), _shape(), CARDS_FIT)
    assert (then.kind, then.lines, then.attempt, then.wait_s) == (Decision.RESTART, (), 2, 2.0)
    assert then.history == BlameHistory(("a", "b"), end.point), "the next attempt's history"


def test_leaving_a_host_out_starts_a_new_blame_history_and_asks_the_job_without_it_once() -> None:
    asked: list[str] = []

    def without(host: str) -> GoesOn:
        asked.append(host)
        return GoesOn(1, 2)
    shape = JobShape("j", ("a", "b"), 4, {"a": 2, "b": 2}, 64, without)
    end = _end(where=("step", 60))  # not the same failure: the job without b is not needed yet
    first = decide(end, MIN_NODES, _history("b"), shape)
    assert first.kind is Decision.CHECK_CARDS and asked == [], "asked only once the cards are known"
    left = decide(end, MIN_NODES, _history("b"), shape, CARDS_FIT)
    assert (left.kind, left.host, left.lines) == (Decision.LEAVE_OUT, "b", (LEAVING_B,)) and asked == ["b"]
    assert left.history == BlameHistory((), end.point)
    _, stayed = _decided(end, MIN_NODES, _history("b"), THREE_HOSTS)
    assert stayed.kind is Decision.STAY and stayed.history.blamed == ("b", "b"), "it may leave later"


def test_a_bad_card_stops_the_job_with_its_failure_and_cause() -> None:
    anonymous = JobResult(Outcome.FAILED, 0, "npu-launch: job j failed", 5.0, None)
    end = AttemptEnd(anonymous, 0, True, FailurePoint.of(anonymous, None, None))
    _, stopped = _decided(end, RESTARTS, _history(), _shape(without=None), CardVerdict("b", LINK_DOWN))
    assert stopped.kind is Decision.BAD_CARDS and stopped.result.exit_code == 1, "never 0"
    assert stopped.result.message == f"npu-launch: job j not restarted: {LINK_DOWN}\nnpu-launch: job j failed"
    assert stopped.result.cause == Cause(Outcome.FAILED, host="b") and stopped.result.ended_at == 5.0
