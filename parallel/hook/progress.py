"""Training progress seen without user code, for the launcher's hang check (via ``rank_hook``).

Three places every MindSpore training loop passes through are counted, on the main thread only
(torch's counterparts below):

* a top-level call of a ``Cell`` (``Cell.__call__`` not nested in another): one step of a
  custom loop over a compiled ``TrainOneStepCell``, of ``Model.train`` (with or without dataset
  sink mode: in sink mode one call runs a sink of steps), of the project's trainer;
* the next batch of a MindSpore dataset iterator (``create_tuple_iterator``,
  ``create_dict_iterator``), which also covers loops around a bare ``@jit`` function;
* a checkpoint load (``load_checkpoint``, ``load_param_into_net``), after which the launcher
  allows the longer first-step grace again (a recompilation may follow);
* a checkpoint save (``save_checkpoint``) or an evaluation (``Model.eval``): a ``section`` of its
  own kind while the main thread is inside, which the launcher judges by a limit of its own (one
  rank that saves or evaluates alone is not a rank that hangs).

In a torch script the same three are a top-level ``Module`` call (a forward), a top-level
``Tensor.backward`` (DDP's gradient all-reduce runs inside it) or ``torch.distributed``
collective, and the next batch of a ``DataLoader`` iterator; torch has no load to count.

The first top-level call's end is also sent at once, as ``first-step``: the end of graph
compilation, for the start-up breakdown.

The counters cost a few attribute reads and an increment per call (``bench/bench_progress.py``)
and change nothing the script computes: the wrapped function is called with the same arguments
and its result or exception passes through. A daemon thread, started by the first count, sends a
``progress`` event at most every ``INTERVAL`` seconds and only when something changed: ``count``
(calls completed plus batches fetched; a call that raised is not completed), ``busy`` (the main
thread is inside a top-level call now: waiting in a collective, in the synchronous case; or the
last one raised, and nothing was called or fetched since) and ``loads``. MindSpore releases the GIL
while a graph runs or a collective waits, so the thread reports a rank blocked there too.

Nothing here imports MindSpore; ``rank_hook`` wraps its functions as their modules load.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional

from parallel import contract, events

INTERVAL = 0.5
"""Seconds between two progress events of a rank, at most 2 a second."""


class _Counters:
    def __init__(self) -> None:
        self.main = threading.main_thread().ident
        self.depth = 0
        self.raised = False
        """The last top-level call raised, and no call or batch came since."""
        self.calls = 0
        self.batches = 0
        self.loads = 0
        self.section = ""
        self.sections = 0
        self.trained = 0
        """Top-level calls of a Cell (or Module) in training mode that completed: training steps,
        told from a toolkit's warm-up collectives and evaluation cells, which end no grace."""
        self.compile_calls = 0
        """Calls of MindSpore's executors' ``compile`` the main thread is inside (nested)."""
        self.compiling = False
        """The main thread is inside a graph compilation (``compile_begins``)."""
        self.reporter: "threading.Thread | None" = None


_state = _Counters()


def counting_call(real: Callable[..., Any]) -> Callable[..., Any]:
    """``Cell.__call__`` (or any function: a collective, ``Tensor.backward``), counting the
    main thread's top-level calls."""
    state = _state
    get_ident = threading.get_ident

    def counted(*args: Any, **kwargs: Any) -> Any:
        if state.depth or get_ident() != state.main:
            return real(*args, **kwargs)
        state.depth, state.raised = 1, False
        _ensure_reporter()
        try:
            result = real(*args, **kwargs)
        except BaseException:
            # Not completed, and told as still inside it: a rank whose collective timed out
            # was waiting on a peer, and that must not look like progress, nor like a rank
            # that stopped between steps, before its error report is read.
            state.depth, state.raised = 0, True
            raise
        state.depth = 0
        state.calls += 1
        if args and _trains(args[0]):
            state.trained += 1
        if state.calls == 1:
            events.emit(contract.EVENT_FIRST_STEP)
        return result
    return functools.update_wrapper(counted, real)


_TRAINING_KINDS = frozenset({"TrainOneStepCell", "TrainOneStepWithLossScaleCell", "Optimizer"})
"""Cells whose call is a training step whether or not the script called ``set_train()``
(``TrainOneStepCell`` does not set it; a functional loop's optimizer call updates the weights)."""
_kinds: dict[type, bool] = {}


def _trains(obj: Any) -> bool:
    """Whether calling ``obj`` (a top-level call's first argument) is a training step: a Cell
    or Module in training mode, or one of ``_TRAINING_KINDS`` (by class, looked up once)."""
    if getattr(obj, "training", False) is True:
        return True
    kind = type(obj)
    known = _kinds.get(kind)
    if known is None:
        known = _kinds[kind] = any(k.__name__ in _TRAINING_KINDS for k in kind.__mro__)
    return known


def counting_next(real: Callable[..., Any]) -> Callable[..., Any]:
    """A dataset iterator's ``__next__``, counting batches the main thread fetched."""
    state = _state
    get_ident = threading.get_ident

    def __next__(self: Any) -> Any:
        item = real(self)
        if not state.depth and get_ident() == state.main:
            state.batches += 1
            state.raised = False
            _ensure_reporter()
        return item
    return functools.update_wrapper(__next__, real)


def counting_load(real: Callable[..., Any]) -> Callable[..., Any]:
    """``load_checkpoint`` or ``load_param_into_net``: the launcher's grace starts again."""
    state = _state

    def load(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        finally:
            state.loads += 1
            _ensure_reporter()
    return functools.update_wrapper(load, real)


def in_section(kind: str, real: Callable[..., Any]) -> Callable[..., Any]:
    """``save_checkpoint`` (``kind`` ``save``) or ``Model.eval`` (``eval``): the main thread is in
    a section of that kind until it returns (the outermost one counts: a save inside an
    evaluation is part of it)."""
    state = _state
    get_ident = threading.get_ident

    def section(*args: Any, **kwargs: Any) -> Any:
        if state.section or get_ident() != state.main:
            return real(*args, **kwargs)
        state.section = kind
        _ensure_reporter()
        try:
            return real(*args, **kwargs)
        finally:
            state.section = ""
            state.sections += 1
    return functools.update_wrapper(section, real)


def compiling(real: Callable[..., Any]) -> Callable[..., Any]:
    """MindSpore's graph compilation (``_CellGraphExecutor.compile``, ``_JitExecutor.compile``):
    once it finds no compiled graph (``compile_begins``) until it returns, the launcher allows
    the compile grace, whenever in the run it comes (an evaluation network's first call, a new
    input shape, a recompilation). Most calls find the graph and return at once; in PyNative a
    ``@jit`` function's call first waits for the queued operators (a collective among them),
    which is no compilation."""
    state = _state
    get_ident = threading.get_ident

    def compile(*args: Any, **kwargs: Any) -> Any:
        if get_ident() != state.main:
            return real(*args, **kwargs)
        state.compile_calls += 1
        try:
            return real(*args, **kwargs)
        finally:
            state.compile_calls -= 1
            if not state.compile_calls:
                state.compiling = False
    return functools.update_wrapper(compile, real)


def compile_begins(real: Callable[..., Any]) -> Callable[..., Any]:
    """The executors' ``_set_compile_cache_dep_files``, which MindSpore calls only once a
    compile found no graph to reuse, right before it compiles one: the compilation begins."""
    state = _state
    get_ident = threading.get_ident

    def begins(*args: Any, **kwargs: Any) -> Any:
        if state.compile_calls and get_ident() == state.main:
            state.compiling = True
            _ensure_reporter()
        return real(*args, **kwargs)
    return functools.update_wrapper(begins, real)


Snapshot = tuple[int, bool, int, str, int, int, bool]


def snapshot(state: Optional[_Counters] = None) -> Snapshot:
    """(count, busy, loads, section, sections, trained, compiling) now."""
    state = state or _state
    return (state.calls + state.batches, state.depth > 0 or state.raised, state.loads,
            state.section, state.sections, state.trained, state.compiling)


def _ensure_reporter() -> None:
    if _state.reporter is None:
        _state.reporter = threading.Thread(target=_report, args=(_state,),
                                           name="npu-launch-progress", daemon=True)
        _state.reporter.start()


def _report(state: _Counters) -> None:
    sent = None
    wake = threading.Event()
    while True:
        now = snapshot(state)
        if now != sent:
            count, busy, loads, section, sections, trained, compiling_now = now
            events.emit(contract.EVENT_PROGRESS, count=count, busy=busy, loads=loads,
                        section=section, sections=sections, trained=trained,
                        compiling=compiling_now)
            sent = now
        wake.wait(INTERVAL)
