"""One rank's record in one attempt, folded once from its events: ``RankRecord``.

Every reader takes its facts from here: the supervisor (``run.supervisor.LocalRanks``: the main
thread, the frameworks, who began ``init()`` and who finished it, who exited), each node's stall
watch and node 0's hang check (``hangs``: progress on the launcher's clock), the phases
(``observe.startup``: the marks on the rank's clock), the monitor (``observe.job_state``) and
node 0's attempt (``attempt``: each rank's last step, whether it saves on a stop).

Last progress is one rule, kept on two clocks: ``since`` is node 0's (or the supervisor's)
clock when the event arrived, what the hang check compares with its limits (clock skew between
hosts can neither fake nor hide a stall); ``last_progress`` is the rank's own clock, where the
phases end training. A rank made progress when it

* said ``initialised`` (its first report of it; a second one repeats it),
* ended its first step (``first-step``) or a trainer step (``step``), or ``finished``,
* sent a ``progress`` event whose count rose, whose loads rose (a checkpoint load), or whose
  section began or ended (a save, an evaluation); one without a count, not the rank hook's, is
  taken at its word.

Entering a call is not progress (a ``progress`` event that only turns ``busy`` on): a rank that
hangs inside its next step made its last progress when the step before it ended.

The hang check's grace (``in_grace``: from ``initialised`` until the rank's first training
step, and again from a checkpoint load), whether it compiles a graph now (``compiling``), the
quiet intervals it learns from (``longest``, ``intervals``: steps and counts outside grace,
sections and compilations, busy spells included; ``section_longest``: each kind of section) and the supervisors'
readings that a quiet rank is not frozen (``alive`` events: ``alive_at``, ``life``) are folded
here too, from the same events.

A training step is a top-level call of a Cell in training mode (the hook's ``trained``), or a
trainer ``step``: a toolkit's warm-up collectives and evaluation cells before training end no
grace. A rank that calls no Cell at all (a loop of dataset batches around a ``@jit`` function)
leaves its grace once its count is 2 higher; its compilations are ``compiling`` all the same.
"""
from __future__ import annotations

import copy
import dataclasses
import signal
from typing import Callable, Optional

from parallel import contract
from parallel.contract import Event

PHASES = ("process", "imports", "init", "first_step", "training", "exit")
"""A rank's life in six phases, each from one mark to the next (``RankRecord.phases``)."""
FAULTS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE})
"""The signals of a process's own fault: a rank killed by one after a clean end of its script
died in its exit handlers (``RankRecord.teardown_crash``)."""
FRAMEWORK_STOP = signal.SIGTERM
"""What MindSpore's cluster kills a rank with once its scheduler says a node timed out, or
cannot be reached (``cluster/init.cc``: "Kill this process with SIGTERM."), whatever the rank
is doing: in the exit handlers of a rank whose script ended cleanly, after a peer left the
cluster first, it is no failure (``RankRecord.teardown_crash``) unless npu-launch sent it."""


_DAY = 86400.0
_RECENT = 16
"""Intervals a record keeps for its readers, who look twice a second at ranks that send at most
two progress and two step events a second."""


@dataclasses.dataclass
class RankRecord:
    """One rank in one attempt, as its events arrive (``observe``); a restart begins a new one.

    What the rank said: ``main_thread``, ``frameworks`` (``framework`` events' names),
    ``calling_init`` (``init-started``), ``initialised``, ``step`` (the last trainer step),
    ``saves_on_stop`` and ``answers_last_words`` (said in a fit's first step: a
    ``Model.train`` rank saves on a stop only), ``finished``, ``ended_cleanly`` (its exit
    handlers began after a clean end of the script: ``exiting``); and its supervisor: ``exited``
    with ``exit_code`` (a signal's negative, as Popen reports it), ``stopped`` (it exited once
    npu-launch had begun stopping the ranks). ``script_ended_at``: when its script ended
    (``exiting``, else its exit), on the folder's clock.

    Marks, on the rank's clock (seconds since the epoch): ``spawned`` (the kernel's start of the
    process), ``started_time``, ``init_started_time``, ``initialised_time``, ``first_step_time``,
    ``last_progress``, ``exited_time``.

    Progress, on the clock of whoever folds it (see the module's docstring): ``since`` (last
    progress), ``count``, ``busy``, ``loads``, ``in_grace``, ``section`` (``save`` or ``eval``
    while inside one, else ""), ``section_since``, ``sections``,
    ``grace_count``, ``trained``, ``compiling``, ``longest``, ``intervals``, ``section_longest``;
    and its supervisor's readings: ``alive_at``, ``alive_how``, ``quiet_written``."""

    main_thread: str = ""
    frameworks: frozenset[str] = frozenset()
    kept: frozenset[str] = frozenset()
    """The frameworks the script began importing with the environment and ``sys.path`` it was
    started with (``contract.EVENT_FRAMEWORK``'s ``kept``): a warm spare would run it the same."""
    calling_init: bool = False
    initialised: bool = False
    step: Optional[int] = None
    saves_on_stop: Optional[bool] = None
    answers_last_words: bool = True
    finished: bool = False
    ended_cleanly: Optional[bool] = None
    exited: bool = False
    exit_code: Optional[int] = None
    stopped: bool = False
    script_ended_at: Optional[float] = None

    spawned: Optional[float] = None
    started_time: Optional[float] = None
    init_started_time: Optional[float] = None
    initialised_time: Optional[float] = None
    first_step_time: Optional[float] = None
    last_progress: Optional[float] = None
    exited_time: Optional[float] = None

    since: Optional[float] = None
    count: int = 0
    busy: bool = False
    loads: int = 0
    in_grace: bool = True
    section: str = ""
    section_since: float = 0.0
    sections: int = 0
    grace_count: int = 0
    """The count when the grace began: a rank that made no Cell call leaves it once the count is
    2 higher (a first batch is fetched before the step that compiles)."""
    trained: int = 0
    grace_trained: int = 0
    """``trained`` when the grace began: it lasts until a training step completes."""
    called: bool = False
    """A top-level call completed (``first-step``): the grace waits for a training one."""
    compiling: bool = False
    compiled: bool = False
    """A compilation came since the last step: that interval teaches the limit nothing."""
    ran_since: Optional[float] = None
    """When the current top-level call began to run: its start, or its compilation's end."""
    first_run: Optional[float] = None
    """Seconds the training step that ended the grace ran (``ran_since`` to its end)."""
    alive_at: Optional[float] = None
    """When its supervisor last read that it moved (``alive``), on the folder's clock."""
    alive_how: str = ""
    quiet_written: int = 0
    """Bytes it (and its child processes) wrote since its last progress, as read."""
    longest: float = 0.0
    """The longest quiet interval ended by a step or a count, outside grace and sections."""
    recent: tuple[tuple[float, float], ...] = ()
    """The last ``_RECENT`` such intervals, (when it ended, seconds), for ``Lessons``."""
    intervals: int = 0
    section_longest: tuple[tuple[str, float], ...] = ()

    def copy(self) -> "RankRecord":
        """A copy for another thread to read."""
        return copy.copy(self)

    def observe(self, event: Event, now: Optional[float] = None) -> None:
        """Fold one event in; ``now``: the folder's clock when it arrived (None: the event's
        own time, as when ``metrics.jsonl`` is read back)."""
        fold = _FOLDS.get(event.kind)
        if fold is not None:
            fold(self, event, event.time if now is None else now)

    @property
    def script_ended(self) -> bool:
        """Its script has ended (its exit handlers began, or its process is gone): no progress
        is to come from it, whatever its exit handlers wait for."""
        return self.ended_cleanly is not None or self.exited

    @property
    def life(self) -> Optional[float]:
        """The last moment it was seen not frozen: its last progress, or, outside a framework
        call (where only progress tells), its supervisor's last reading that it moved."""
        if self.since is None or self.busy or self.alive_at is None:
            return self.since
        return max(self.since, self.alive_at)

    @property
    def ended_well(self) -> bool:
        """Its script ended cleanly (``exiting``), or its process exited 0."""
        return bool(self.ended_cleanly) or (self.exited and self.exit_code == 0)

    def teardown_crash(self) -> Optional[str]:
        """The signal's name when the rank's exit says it died of one in its exit handlers,
        after its script ended cleanly, its work done: a fault (MindSpore's teardown races its
        own threads) or a SIGTERM that npu-launch did not send (``FRAMEWORK_STOP``). None
        otherwise: a signal before the end of the script is a failure, whoever sent it."""
        code = self.exit_code
        if not self.ended_cleanly or code is None or code >= 0:
            return None
        if -code in FAULTS or (-code == FRAMEWORK_STOP and not self.stopped):
            return signal.Signals(-code).name
        return None

    def phases(self) -> dict[str, Optional[float]]:
        """Seconds per phase (``PHASES``); None where a mark is missing. Training ends at the
        last progress after the first step."""
        trained = None if self.first_step_time is None \
            else max(self.first_step_time, self.last_progress or self.first_step_time)
        bounds = (self.spawned, self.started_time, self.init_started_time, self.initialised_time,
                  self.first_step_time, trained, self.exited_time)
        return {name: (round(max(end - start, 0.0), 3)
                       if start is not None and end is not None else None)
                for name, start, end in zip(PHASES, bounds, bounds[1:])}

    def _progressed(self, event: Event, now: Optional[float]) -> None:
        """The rank made progress (the rule in the module's docstring), at ``now`` on the
        folder's clock and at the event's time on its own."""
        if now is not None:
            self.since = now
        if event.time is not None:
            self.last_progress = event.time
        self.quiet_written, self.alive_how = 0, ""

    def _stepped(self, event: Event, now: Optional[float]) -> None:
        """A step or a higher count outside grace and sections: ends a quiet interval. The step
        that ends the grace measures its own run (``first_run``), from its call's start or its
        compilation's end: after the first training step the limit is learnt from it (a sink of
        many steps in one call is judged by its own pace, not by the floor)."""
        if now is not None:
            if self.in_grace and self.ran_since is not None:
                self.first_run = now - self.ran_since
            # An interval that held a compilation says nothing of the steps' pace.
            elif not self.in_grace and self.since is not None and not self.compiled:
                self._learn(now, now - self.since)
        self._progressed(event, now)
        self.in_grace = self.compiled = False

    def _learn(self, now: float, seconds: float) -> None:
        self.longest = max(self.longest, seconds)
        self.intervals += 1
        self.recent = (*self.recent[-(_RECENT - 1):], (now, seconds))

    def _section(self, event: Event, now: Optional[float]) -> bool:
        """Whether a section began or ended (one that began and ended between two events shows
        only in ``sections``: it was short)."""
        section, sections = event.section or "", event.sections or 0
        if section == self.section and sections == self.sections:
            return False
        if self.section and not self.in_grace and now is not None:
            kinds = dict(self.section_longest)
            kinds[self.section] = max(kinds.get(self.section, 0.0), now - self.section_since)
            self.section_longest = tuple(sorted(kinds.items()))
        self.section, self.sections = section, sections
        self.section_since = now if now is not None else self.section_since
        return True


def _started(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.main_thread = event.main_thread or r.main_thread
    at = event.time
    if at is None:
        return
    r.started_time = at
    spawned = event.number("process_start")
    if spawned is not None and 0 < at - spawned < _DAY:
        r.spawned = spawned


def _framework(r: RankRecord, event: Event, now: Optional[float]) -> None:
    if event.name:
        r.frameworks = r.frameworks | {event.name}
        if event.flag("kept"):
            r.kept = r.kept | {event.name}


def _init_started(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.calling_init = True
    r.init_started_time = r.init_started_time or event.time


def _initialised(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.initialised = True
    r.initialised_time = r.initialised_time or event.time
    r.since = r.since or now  # the hook's and init()'s: the first one is the progress
    r.last_progress = r.last_progress or event.time


def _first_step(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.first_step_time = r.first_step_time or event.time
    r.called = True
    r._progressed(event, now)


def _step(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.first_step_time = r.first_step_time or event.time
    if event.step is not None:
        r.step = event.step
    saves = event.flag("saves_on_stop")
    if saves is not None:  # said in a fit's first step event
        r.saves_on_stop = saves
        r.answers_last_words = event.flag("last_words") is not False
    r._stepped(event, now)


def _finished(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.finished = True
    r._progressed(event, now)


def _progress(r: RankRecord, event: Event, now: Optional[float]) -> None:
    # A call began since the last event: the rank entered one, or completed one and is in the next.
    began = bool(event.busy) and (not r.busy or (event.count or 0) > r.count)
    compiling = bool(event.compiling)
    if compiling != r.compiling:  # a compilation began or ended: its grace starts or ends now
        r.compiling, r.compiled = compiling, r.compiled or compiling
        r.ran_since = now if not compiling else r.ran_since
        r._progressed(event, now)
    if r._section(event, now):
        r._progressed(event, now)
    trained = max(r.trained, event.trained or 0)
    if event.loads is not None and event.loads > r.loads:
        r.loads, r.in_grace = event.loads, True
        r.grace_count, r.grace_trained = max(r.count, event.count or 0), trained
        r._progressed(event, now)
    elif event.count is not None and event.count > r.count:
        if r.section or (r.in_grace and not _trained_past_grace(r, event.count, trained)):
            r._progressed(event, now)
        else:
            r._stepped(event, now)
    elif event.count is None and event.loads is None:
        r._progressed(event, now)  # not the rank hook's: a heartbeat is taken at its word
    r.count, r.trained = max(r.count, event.count or 0), trained
    r.ran_since = now if began else r.ran_since
    r.busy = bool(event.busy)


def _trained_past_grace(r: RankRecord, count: int, trained: int) -> bool:
    """Whether the grace ends with a count of ``count``: a training step completed since it
    began, or, for a rank that made no Cell call, a count 2 higher."""
    return trained > r.grace_trained or (not r.called and count >= r.grace_count + 2)


def _alive(r: RankRecord, event: Event, now: Optional[float]) -> None:
    """Its supervisor read that it moved while quiet (``launcher.hangs.liveness``)."""
    if now is not None:
        r.alive_at = now
    r.alive_how = event.how or r.alive_how
    r.quiet_written += max(event.bytes_written or 0, 0)


def _exiting(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.ended_cleanly = event.flag("clean") is True
    r.script_ended_at = r.script_ended_at or now


def _exited(r: RankRecord, event: Event, now: Optional[float]) -> None:
    r.exited, r.exit_code = True, event.returncode
    r.stopped = event.flag("stopped") is True
    r.exited_time = event.time
    r.script_ended_at = r.script_ended_at or now
    last = event.number("last_progress")  # metrics.jsonl keeps no progress events
    if last is not None and r.first_step_time is not None \
            and last > (r.last_progress or 0.0):
        r.last_progress = last


_FOLDS: dict[str, Callable[[RankRecord, Event, Optional[float]], None]] = {
    contract.EVENT_STARTED: _started,
    contract.EVENT_FRAMEWORK: _framework,
    contract.EVENT_INIT_STARTED: _init_started,
    contract.EVENT_INITIALISED: _initialised,
    contract.EVENT_FIRST_STEP: _first_step,
    contract.EVENT_STEP: _step,
    contract.EVENT_FINISHED: _finished,
    contract.EVENT_PROGRESS: _progress,
    contract.EVENT_EXITING: _exiting,
    contract.EVENT_EXITED: _exited,
    contract.EVENT_ALIVE: _alive,
}
"""How each kind of event folds in; the others say nothing of a rank's progress or marks."""
