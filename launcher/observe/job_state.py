"""Every rank's state and the checkpoints written, folded from the ranks' events (``JobState``,
``RankState``): what the live display shows and ``summary.json`` says, in one place."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

from launcher.checkpoints.ledger import files_standing
from launcher.observe.startup import job_phases
from launcher.observe.summary_records import AttemptEntry, CheckpointRecord, FilesMoved
from launcher.ranks.record import RankRecord
from parallel import contract
from parallel.checkpoints.manifest import RankFile, complete_files
from parallel.config import ExecMode
from parallel.contract import EVENT_EXITED, Event


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One held-out evaluation a rank reported (``contract.EVENT_EVAL``); ``time`` is the rank's
    clock, ``epoch`` the epochs completed when it ran."""

    epoch: Optional[int]
    step: Optional[int]
    loss: Optional[float]
    accuracy: Optional[float]
    samples: Optional[int]
    time: Optional[float]

    @classmethod
    def of(cls, event: Event) -> "Evaluation":
        """The evaluation an eval event describes."""
        return cls(epoch=event.epoch, step=event.step, loss=event.loss, accuracy=event.accuracy,
                   samples=event.samples, time=event.time)


def exec_mode_of(value: Any) -> Optional[ExecMode]:
    """``graph``/``pynative`` as an ``ExecMode``; None for anything else (or nothing)."""
    try:
        return ExecMode(value)
    except (ValueError, TypeError):
        return None


@dataclasses.dataclass
class RankState:
    """What one rank has reported so far; it folds that rank's records in arrival order.

    ``progress`` is the rank's record in this attempt (``launcher.ranks.RankRecord``: its
    progress, its marks, whether it finished or exited), folded once here and read by the hang
    check, the phases and the attempt; a restart begins a new one (``begin_attempt``). The rest
    (steps, losses, evaluations) outlives an attempt, for the summary. ``seen_at`` is the
    monitor's clock when a record arrived; ``last_event_time`` is the rank's own clock.
    """

    rank: int
    host: str
    step: Optional[int] = None
    epoch: Optional[int] = None
    loss: Optional[float] = None
    loss_step: Optional[int] = None
    """The step of ``loss``: a step event without a loss (a ``Model.train`` output that is no
    number) leaves the last one standing."""
    samples_per_s: Optional[float] = None
    reports_loss: bool = True
    """False for a rank of a pipeline stage before the last (its ``layout`` event): it computes
    no loss, whatever its step events say."""
    final_loss: Optional[float] = None
    exec_mode: Optional[ExecMode] = None
    evals: list[Evaluation] = dataclasses.field(default_factory=list)
    last_event: str = ""
    last_event_time: Optional[float] = None
    seen_at: Optional[float] = None
    progress: RankRecord = dataclasses.field(default_factory=RankRecord)

    def begin_attempt(self) -> None:
        """A (restarted) attempt begins: nothing of this rank's progress is known in it."""
        self.progress = RankRecord()

    @property
    def finished(self) -> bool:
        """Finished training in this attempt (``finished``)."""
        return self.progress.finished

    @property
    def exited(self) -> bool:
        """Its process ended in this attempt."""
        return self.progress.exited

    @property
    def exit_code(self) -> Optional[int]:
        """How its process ended in this attempt (None while it runs, or by an unknown code)."""
        return self.progress.exit_code

    @property
    def done(self) -> bool:
        """Finished training, or its script ended (it may wait in its exit handlers for the
        others, as MindSpore's finalisation does), or gone: no progress is to come."""
        return self.finished or self.progress.script_ended

    @property
    def last_eval(self) -> Optional[Evaluation]:
        """The most recent evaluation, if any."""
        return self.evals[-1] if self.evals else None

    def to_summary(self) -> dict[str, Any]:
        """This rank's entry in summary.json; without a ``finished`` loss, the last step's."""
        final_loss = self.final_loss if self.final_loss is not None else self.loss
        last = self.last_eval
        return {"rank": self.rank, "host": self.host, "exit_code": self.exit_code,
                "steps": self.step, "final_loss": final_loss, "samples_per_s": self.samples_per_s,
                "exec_mode": self.exec_mode.value if self.exec_mode else None,
                "eval": dataclasses.asdict(last) if last else None,
                "evals": [dataclasses.asdict(e) for e in self.evals],
                "last_event": self.last_event, "last_event_time": self.last_event_time,
                "phases": self.progress.phases()}


@dataclasses.dataclass(frozen=True)
class StatusLoss:
    """The one training loss the status line shows: the latest loss of the lowest rank that
    reported one (rank 0; in a pipeline, the first rank of the last stage, which computes it),
    and its step. Always one rank's, the same rank's on every step: ranks report at their own
    steps (``Model.train`` scripts at most every few seconds), so a mean over ranks would mix
    steps, and in data parallelism each rank's loss is that of its own share of the batch."""

    rank: int
    step: Optional[int]
    value: float

    @classmethod
    def of(cls, ranks: Iterable["RankState"]) -> Optional["StatusLoss"]:
        """The loss to show; None while no rank reported one."""
        reported = [s for s in ranks if s.loss is not None and s.reports_loss]
        first = min(reported, key=lambda s: s.rank, default=None)
        if first is None or first.loss is None:
            return None
        return cls(first.rank, first.loss_step, first.loss)


class JobState:
    """Every rank's state and the checkpoints written, folded from events."""

    def __init__(self, ranks: Mapping[int, str]) -> None:
        self.ranks: dict[int, RankState] = {r: RankState(r, h) for r, h in sorted(ranks.items())}
        self.checkpoints: list[CheckpointRecord] = []
        self.files: dict[int, dict[int, RankFile]] = {}
        """Each step's checkpoint files by rank, as the ranks described them."""
        self.transferred = FilesMoved()
        """Checkpoint files node 0 sent to hosts that lacked them, for a resume."""
        self.collected = FilesMoved()
        """Checkpoint files the agents sent node 0 (``launcher.cluster.collect``)."""
        self.storage: Optional[str] = None
        """``shared`` or ``private``: whether node 0 found every rank's files (the ledger's
        ``storage``)."""
        self.attempts: list[AttemptEntry] = []
        """Each attempt of the job as it ended (``restarts.AttemptRecord``), in order."""
        self.earlier_attempts: list[AttemptEntry] = []
        """The attempts of earlier launches into the same log directory (the same command run
        again resumes there): kept ahead of this launch's in summary.json."""
        self.busy_alone: dict[int, dict[str, Any]] = {}
        """Each rank's longest spell busy alone (``contract.EVENT_BUSY_ALONE``)."""
        self.global_batch: Optional[int] = None
        """Every rank's batch together, as the ranks' readers last reported it (``data``)."""

    def reshape(self, ranks: Mapping[int, str]) -> None:
        """The job goes on with these ranks on these hosts (``--min-nodes`` left a host out):
        a rank that no longer exists leaves the table; its records stay in metrics.jsonl."""
        self.ranks = {r: dataclasses.replace(self.ranks[r], host=h) if r in self.ranks
                      else RankState(r, h) for r, h in sorted(ranks.items())}

    def apply(self, event: Event, seen_at: float) -> None:
        """Fold one event in (``exited`` is the supervisor's, not what the rank last said)."""
        state = self._rank(event.rank, event.host)
        state.progress.observe(event, seen_at)
        if event.kind == contract.EVENT_BUSY_ALONE:  # the monitor's, not the rank's last word
            _on_busy_alone(self, state, event, seen_at)
        if event.kind in LIVENESS or event.kind in (EVENT_EXITED, contract.EVENT_BUSY_ALONE):
            return
        state.last_event, state.seen_at = event.kind, seen_at
        state.last_event_time = event.time
        if event.exec_mode is not None:  # few events say; a failed Enum lookup costs an exception
            state.exec_mode = exec_mode_of(event.exec_mode) or state.exec_mode
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, state, event, seen_at)

    def summary(self) -> dict[str, Any]:
        """The per-rank and job-wide fields of summary.json."""
        rates = [s.samples_per_s for s in self.ranks.values() if s.samples_per_s is not None]
        steps = [s.step for s in self.ranks.values() if s.step is not None]
        complete = self.complete_steps()
        ranks = [s.to_summary() for s in self.ranks.values()]
        return {"world_size": len(self.ranks),
                "global_samples_per_s": sum(rates) if rates else None,
                "last_step": max(steps, default=None),
                "phases": job_phases({r["rank"]: r["phases"] for r in ranks}),
                "ranks": ranks,
                "checkpoints": [dataclasses.replace(c, complete=c.step in complete).to_json()
                                for c in self.checkpoints],
                "complete_steps": complete, "checkpoints_sent": self.transferred.to_json(),
                "checkpoints_collected": self.collected.to_json(), "checkpoint_storage": self.storage,
                "busy_alone": {str(r): spell for r, spell in sorted(self.busy_alone.items())},
                "attempts": [a.to_json() for a in (*self.earlier_attempts, *self.attempts)]}

    def complete_steps(self) -> list[int]:
        """Steps complete by the ledger's one rule (``parallel.checkpoints.manifest.complete_files``): every
        rank of the job reported its file of the step, on whatever host, at one data position."""
        return sorted(step for step, files in self.files.items()
                      if complete_files(files, len(self.ranks)) is not None)

    def _rank(self, rank: int, host: str) -> RankState:
        if rank not in self.ranks:
            self.ranks[rank] = RankState(rank, host)
            self.ranks = dict(sorted(self.ranks.items()))
        return self.ranks[rank]


def _on_step(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    state.step = _either(event.step, state.step)
    state.epoch = _either(event.epoch, state.epoch)
    if event.loss is not None:
        state.loss, state.loss_step = event.loss, event.step
    state.samples_per_s = _either(event.samples_per_s, state.samples_per_s)


def _on_checkpoint(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    job.checkpoints.append(CheckpointRecord(state.rank, event.step, event.host, event.path,
                                            state.last_event_time))
    file = RankFile.reported(state.rank, event.record)
    if file is not None and event.step is not None and file.position.global_step == event.step:
        job.files.setdefault(event.step, {}).update(files_standing(event, file, len(job.ranks)))


def _on_finished(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    state.step = _either(event.steps, state.step)
    state.final_loss = _either(event.final_loss, state.final_loss)
    state.samples_per_s = _either(event.samples_per_s, state.samples_per_s)


def _on_layout(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    stage, stages = event.whole("pp_stage"), event.whole("pp")
    if stage is not None and stages is not None:
        state.reports_loss = stage == stages - 1


def _on_eval(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    state.evals.append(Evaluation.of(event))


def _on_data(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    size = event.whole("global_batch")
    if size is not None and size > 0:
        job.global_batch = size


def _on_busy_alone(job: JobState, state: RankState, event: Event, seen_at: float) -> None:
    seconds, doing = event.number("seconds"), event.text("doing")
    if seconds is None or doing is None:
        return
    kept = job.busy_alone.get(state.rank)
    if kept is None or seconds > kept["seconds"]:
        job.busy_alone[state.rank] = {"seconds": seconds, "doing": doing[:40],
                                      "bytes_written": event.bytes_written or 0,
                                      "host": state.host}


T = TypeVar("T")


def _either(new: Optional[T], old: Optional[T]) -> Optional[T]:
    """What an event says, or what was known when it does not say."""
    return old if new is None else new


LIVENESS = frozenset((contract.EVENT_PROGRESS, contract.EVENT_STACK, contract.EVENT_ALIVE))
"""Events for the hang check alone (see the module's docstring)."""


_HANDLERS: dict[str, Callable[[JobState, RankState, Event, float], None]] = {
    contract.EVENT_STEP: _on_step,
    contract.EVENT_CHECKPOINT: _on_checkpoint,
    contract.EVENT_FINISHED: _on_finished,
    contract.EVENT_EVAL: _on_eval,
    contract.EVENT_LAYOUT: _on_layout,
    contract.EVENT_DATA: _on_data,
}
