"""What the launcher does once an attempt has ended: one pure function, ``decide``, from what the
attempt's end says, the restart policy, the hosts blamed so far, the card re-check's verdict and
the job's shape, to one ``RestartDecision`` that ``launch`` only carries out.

The rules, in the order they apply (``launcher.run.restarts`` holds each one):

* an outcome that is not a failure or a hang ends the job as it is (``NOT_RESTARTABLE``), and so
  does a failure once ``--max-restarts`` is spent (``BUDGET_SPENT``);
* a failure before start-up (``launch._started_up``) is not restarted, and one line says why
  (``NOT_STARTED_UP``, ``restarts.not_restarted``);
* the same failure twice in a row with nothing newer stops the job with exit 93
  (``CANNOT_HELP``, ``restarts.cannot_help``), unless the host that caused both leaves
  (``--min-nodes``: without it the next attempt differs, and may get further; one that must stay,
  its line says why, makes the same attempt again);
* otherwise the job restarts. The restart is announced and the blamed host's cards re-checked
  first (``CHECK_CARDS``): the re-check is a side effect (it waits up to ``--card-free-timeout``
  for a held card), so the launcher makes it and decides again with its verdict
  (``CardVerdict``). Cards not fit leave their host out if it can leave, else stop the job
  (``BAD_CARDS``); fit, the host whose ranks caused the last two failures leaves
  (``LEAVE_OUT``) if the job can go on without it, else it stays, and one line says why
  (``STAY``); or every host runs again (``RESTART``).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Mapping, Optional

from launcher.run.failures import Cause, JobResult, Outcome
from launcher.run.restarts import (
    BLAMED_IN_A_ROW,
    FailurePoint,
    Policy,
    blamed_host,
    cannot_help,
    host_to_leave_out,
    may_leave,
    not_restarted,
    shrink_problem,
    stop_restarting,
)

RESTARTABLE = (Outcome.FAILED, Outcome.STALLED)
"""The outcomes a restart may mend: a failure and a hang (not a success, a signal, bad input)."""


@dataclasses.dataclass(frozen=True)
class AttemptEnd:
    """What an attempt's end says, for the decision."""

    result: JobResult
    attempt: int
    """The attempt that ended (``LaunchPlan.restart``: 0 for the first)."""
    started_up: bool
    """Every rank had initialised communication (with ``--min-nodes``: the culprit had called
    ``init()``): ``launch._started_up``."""
    point: FailurePoint
    """Where and why it failed (``Attempt.failure_point``)."""
    likely: tuple[str, ...] = ()
    """The diagnosis's likely-cause lines of the result's message, told again under the restart
    line (``launcher.diagnose.LIKELY_CAUSE``)."""

    @property
    def blamed(self) -> Optional[str]:
        """The host whose process was the root cause, if one was."""
        return blamed_host(self.result)


@dataclasses.dataclass(frozen=True)
class BlameHistory:
    """What the attempts before this one leave to the decision: the hosts blamed for each failure
    since a host was last left out (None: no host's process), and the last failure's point."""

    blamed: tuple[Optional[str], ...] = ()
    last: Optional[FailurePoint] = None


@dataclasses.dataclass(frozen=True)
class GoesOn:
    """The job without one host (``Job.without``): the hosts and ranks that go on, or why it
    cannot go on (its layout does not fit fewer hosts)."""

    hosts: int = 0
    ranks: int = 0
    problem: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class JobShape:
    """The job as the decision sees it: its hosts, how many ranks each runs, the global batch its
    ranks' readers reported (None: none did), and the job without a host (None: it cannot run
    without one, no ``--min-nodes``), asked only of a host that is to leave."""

    job_id: str
    hosts: tuple[str, ...]
    world_size: int
    ranks_on: Mapping[str, int]
    global_batch: Optional[int] = None
    without: Optional[Callable[[str], GoesOn]] = None


@dataclasses.dataclass(frozen=True)
class CardVerdict:
    """What the card re-check before a restart said (``launcher.cluster.card_checks``
    ``recheck_before_restart``, which waits for a held card first): fit, or nothing to check
    (``CARDS_FIT``), or the host whose cards are not fit and why (each bad card, one line)."""

    host: Optional[str] = None
    why: str = ""

    def stopped(self, failed: JobResult, job_id: str) -> JobResult:
        """The job's end when the host cannot leave: the failure, and why it is not restarted."""
        return JobResult(Outcome.FAILED, failed.exit_code or 1,
                         f"npu-launch: job {job_id} not restarted: {self.why}\n{failed.message}",
                         failed.ended_at, failed.cause or Cause(Outcome.FAILED, host=self.host))


CARDS_FIT = CardVerdict()


class Decision(str, enum.Enum):
    """What the launcher does next. The first five end the job with the decision's result;
    ``CHECK_CARDS`` announces the restart, re-checks the blamed host's cards and decides again
    with the verdict; the last three start the next attempt."""

    NOT_RESTARTABLE = "not-restartable"
    BUDGET_SPENT = "budget-spent"
    NOT_STARTED_UP = "not-started-up"
    CANNOT_HELP = "cannot-help"
    BAD_CARDS = "bad-cards"
    CHECK_CARDS = "check-cards"
    RESTART = "restart"
    LEAVE_OUT = "leave-out"
    STAY = "stay"

    @property
    def stops(self) -> bool:
        return self in _STOPS


_STOPS = (Decision.NOT_RESTARTABLE, Decision.BUDGET_SPENT, Decision.NOT_STARTED_UP,
          Decision.CANNOT_HELP, Decision.BAD_CARDS)


@dataclasses.dataclass(frozen=True)
class RestartDecision:
    """One decision after an attempt: its kind; the result (a stop: the job's end, its message
    saying why; else the failure restarted after); the lines to print first; the host it is
    about (whose cards to check, who leaves, who stays); and for a restart its number, the
    backoff to wait and the blame history the next attempt's decision takes."""

    kind: Decision
    result: JobResult
    lines: tuple[str, ...] = ()
    host: Optional[str] = None
    attempt: int = 0
    wait_s: float = 0.0
    history: BlameHistory = dataclasses.field(default_factory=BlameHistory)

    @property
    def stops(self) -> bool:
        return self.kind.stops


def decide(end: AttemptEnd, policy: Policy, history: BlameHistory, shape: JobShape,
           cards: Optional[CardVerdict] = None) -> RestartDecision:
    """The one decision after ``end`` (see the module's docstring). ``cards``: the card
    re-check's verdict; None before it was made, when a restart is ``CHECK_CARDS``."""
    result = end.result
    if result.outcome not in RESTARTABLE:
        return RestartDecision(Decision.NOT_RESTARTABLE, result)
    again = end.attempt + 1
    if again > policy.max_restarts:
        return RestartDecision(Decision.BUDGET_SPENT, result)
    if not end.started_up:
        line = not_restarted(result, policy.min_nodes)
        return RestartDecision(Decision.NOT_STARTED_UP,
                               dataclasses.replace(result, message=f"{result.message}\n{line}".lstrip()))
    blamed = (*history.blamed, end.blamed)
    leaving = host_to_leave_out(blamed, shape.hosts, policy.min_nodes)
    going = RestartDecision(Decision.RESTART, result, attempt=again, wait_s=policy.wait_before(again),
                            history=BlameHistory(blamed, end.point))
    if history.last is not None and cannot_help(history.last, end.point):
        # Without the host that caused both failures the next attempt differs: it may help. A
        # host that cannot leave (the batch, the layout) makes the same attempt again: it cannot.
        left = _leave_out(going, leaving, None, shape, policy) if leaving and shape.without else None
        if left is None or left.kind is Decision.STAY:
            return RestartDecision(Decision.CANNOT_HELP, stop_restarting(result, end.point.told(history.last)),
                                   left.lines if left else ())
    if cards is None:
        return dataclasses.replace(going, kind=Decision.CHECK_CARDS, host=end.blamed,
                                   lines=(_restart_line(end, policy, going), *end.likely))
    if cards.host is not None:
        return _unfit(going, cards, shape, policy)
    if leaving is None or shape.without is None:
        return going
    return _leave_out(going, leaving, None, shape, policy)


def _restart_line(end: AttemptEnd, policy: Policy, going: RestartDecision) -> str:
    message = end.result.message
    first = message.splitlines()[0] if message else end.result.outcome.value
    waited = going.wait_s
    return (f"npu-launch: restart {going.attempt} of {policy.max_restarts}"
            f"{f' in {waited:g} s' if waited else ''} after: {first.removeprefix('npu-launch: ')}")


def _unfit(going: RestartDecision, cards: CardVerdict, shape: JobShape, policy: Policy) -> RestartDecision:
    """A restart after the re-check found ``cards`` not fit: without their host, or none."""
    host = cards.host
    left = None
    if host is not None and shape.without is not None and may_leave(host, shape.hosts, policy.min_nodes):
        left = _leave_out(going, host, cards.why, shape, policy)
        if left.kind is Decision.LEAVE_OUT:
            return left
    return RestartDecision(Decision.BAD_CARDS, cards.stopped(going.result, shape.job_id),
                           left.lines if left else (), host)


def _leave_out(going: RestartDecision, host: str, why: Optional[str], shape: JobShape,
               policy: Policy) -> RestartDecision:
    """The restart without ``host`` when the job can go on without it: the global batch splits
    over the ranks left and the layout fits (``shape.without``); else with it (``STAY``), and
    one line says why. ``why``: the reason to tell instead of the failures (a bad card)."""
    after = shape.world_size - shape.ranks_on.get(host, 0)
    problem = shrink_problem(shape.world_size, after, shape.global_batch)
    goes_on = None
    if problem is None and shape.without is not None:
        goes_on = shape.without(host)
        problem = goes_on.problem
    if goes_on is None or problem is not None:
        said = why or f"{host} caused the last {BLAMED_IN_A_ROW} failures"  # a card's why names its host
        return dataclasses.replace(going, kind=Decision.STAY, host=host,
                                   lines=(f"npu-launch: {said} but stays in the job: {problem}",))
    because = why or f"its ranks caused the last {BLAMED_IN_A_ROW} failures"
    line = (f"npu-launch: leaving {host} out: {because}; {goes_on.hosts} host(s) and {goes_on.ranks} "
            f"rank(s) go on (--min-nodes {policy.min_nodes}), the global batch kept")
    return dataclasses.replace(going, kind=Decision.LEAVE_OUT, host=host, lines=(line,),
                               history=BlameHistory((), going.history.last))
