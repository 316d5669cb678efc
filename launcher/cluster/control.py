"""Control lines: how a node agent tells node 0 it runs, its events, its ranks' end and its result
(and relays a rank's last words); and what node 0 tells the agents on their stdin.

They travel in the agent's stdout among its ranks' ``[host:rank]`` lines, marked by a record
separator byte no program prints by accident, one JSON object per line, so ssh, srun and mpirun
can carry them unchanged. ``decode`` turns one back into a typed value, once, as it arrives.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional, Union

from launcher.run.failures import JobResult
from parallel.contract import Event

MARK = b"\x1eNPL "
EVENT = "event"
RESULT = "result"
NODE_DONE = "node-done"
AGENT_UP = "agent-up"
FINISH = b"finish\n"
"""Node 0 -> agents, on stdin: every node's ranks are done."""
SAVE = b"save "
"""Node 0 -> agents, on stdin: ``save <step>``: a stop signal came, and every rank saves that
step and exits (``attempt.StopRequest``); each agent writes it into its host's log directory,
where the trainer looks for it (``contract.STOP_REQUEST_FILE``)."""
WORDS = b"words "
"""Node 0 -> agents, on stdin: ``words <rank> <attempt> <age>``: a rank failed or hangs, and
``rank`` is asked for its last words (``launcher.run.last_words``), the lost rank having been
unable to complete a step with it for ``age`` seconds (an age, not a time: hosts' clocks may
differ). The agent that runs ``rank`` asks it and answers with a ``last-words`` line."""
LAST_WORDS = "last-words"
_MAX_STEP_DIGITS = 18
_MAX_ANSWER = 1000


@dataclasses.dataclass(frozen=True)
class NodeDone:
    """Every rank of node ``node_rank`` exited 0 (its scheduler may still be needed)."""

    node_rank: int


@dataclasses.dataclass(frozen=True)
class AgentUp:
    """An agent's first line: it runs, so its connection is set up (node 0's ``--fanout``
    counts it as connecting until then)."""


@dataclasses.dataclass(frozen=True)
class WordsRequest:
    """Node 0's ``words`` line."""

    rank: int
    attempt: int
    age: float


@dataclasses.dataclass(frozen=True)
class LastWords:
    """An agent's relay of ``rank``'s answer to node 0's ``words`` line
    (``launcher.run.last_words.ask_here``)."""

    rank: int
    answer: str


Message = Union[Event, JobResult, NodeDone, AgentUp, LastWords]


def encode(kind: str, payload: dict[str, Any]) -> bytes:
    """One control line (without the newline)."""
    return MARK + json.dumps({"type": kind, **payload}, default=str).encode()


def event_line(event: Event) -> bytes:
    return encode(EVENT, dict(event.record))


def result_line(result: JobResult) -> bytes:
    return encode(RESULT, result.to_json())


def node_done_line(node_rank: int) -> bytes:
    return encode(NODE_DONE, {"node_rank": node_rank})


def agent_up_line() -> bytes:
    return encode(AGENT_UP, {})


def last_words_line(rank: int, answer: str) -> bytes:
    return encode(LAST_WORDS, {"rank": rank, "answer": answer[:_MAX_ANSWER]})


def words_line(rank: int, attempt: int, age: float) -> bytes:
    return WORDS + f"{rank} {attempt} {max(0.0, age):.3f}\n".encode()


def words_request(line: bytes) -> Optional[WordsRequest]:
    """The request in a ``words`` line (without its newline); None for any other line."""
    if not line.startswith(WORDS):
        return None
    parts = line[len(WORDS):].split()
    if len(parts) != 3 or not all(p.isdigit() and len(p) <= _MAX_STEP_DIGITS for p in parts[:2]):
        return None
    try:
        age = float(parts[2])
    except ValueError:
        return None
    if not 0.0 <= age < 1e9:  # also refuses nan
        return None
    return WordsRequest(int(parts[0]), int(parts[1]), age)


def save_line(step: int) -> bytes:
    return SAVE + str(step).encode() + b"\n"


def saved_step(line: bytes) -> Optional[int]:
    """The step of a ``save`` line (without its newline); None for any other line."""
    if not line.startswith(SAVE):
        return None
    digits = line[len(SAVE):].strip()
    if not (digits.isdigit() and len(digits) <= _MAX_STEP_DIGITS):
        return None
    return int(digits)


def decode(line: bytes) -> Optional[Message]:
    """The message in ``line``; None for an ordinary output line or a garbled control line."""
    if not line.startswith(MARK):
        return None  # a rank cannot forge one: its lines start with "[host:rank] "
    try:
        record = json.loads(line[len(MARK):])
        kind = record.pop("type")
        if kind == EVENT:
            return Event.parse(record)
        if kind == RESULT:
            return JobResult.from_json(record)
        if kind == NODE_DONE:
            return NodeDone(int(record["node_rank"]))
        if kind == AGENT_UP:
            return AgentUp()
        if kind == LAST_WORDS and isinstance(record["answer"], str):
            return LastWords(int(record["rank"]), record["answer"][:_MAX_ANSWER])
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None
