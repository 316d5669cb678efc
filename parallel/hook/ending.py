"""How a rank's process ends, told to the launcher by the rank hook (``parallel.hook.rank_hook``).

* A fault of its own (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL: a native library's crash) first
  prints every thread's Python stack into the rank's log (faulthandler): no error report exists
  then, and the launcher's failure block shows the log's last lines.
* As its exit handlers begin, one ``exiting`` event says whether the script ended cleanly: no
  exception escaped it, and it asked ``sys.exit`` for no code but 0. It is sent once Python has
  waited for the script's threads (``threading._shutdown``), before the first ``atexit``
  handler, whoever registered it and when: ``atexit`` runs the last registered first, so a
  handler the script registers late would otherwise run, and maybe never return, before it.
  Where that function is missing, ``atexit`` sends it, as late as the hook can register it. MindSpore sometimes faults
  in its own exit handler after a clean end (its communication threads race its teardown), or
  its cluster kills the rank there with SIGTERM once a peer left first: the launcher then
  counts the rank as finished, not failed (``RankRecord.teardown_crash``). A
  script that raises ``SystemExit`` itself, without ``sys.exit``, is taken at its word only
  when it exits normally: ``atexit`` cannot see the code it gave.

Nothing here imports MindSpore.
"""
from __future__ import annotations

import atexit
import faulthandler
import functools
import sys
import threading
from typing import Any, Callable

from parallel import contract, events

_asked: list[object] = []
"""What the script passed to ``sys.exit``, every call (a caught one too: never clean then)."""
_said = False


def install(events_on: bool) -> None:
    """At the rank's boot: the stacks on a fault; with events, the ``exiting`` event (before
    every exit handler; ``atexit`` where Python has no ``threading._shutdown``)."""
    _print_stacks_on_a_fault()
    if events_on:
        sys.exit = _recording_exit(sys.exit)
        _say_before_exit_handlers()
        atexit.register(say_exiting)


def _say_before_exit_handlers() -> None:
    """Send ``exiting`` at the end of ``threading._shutdown``: Python calls it once the main
    module ended, to wait for the script's threads, and runs the ``atexit`` handlers after it."""
    real = getattr(threading, "_shutdown", None)
    if real is None or getattr(real, "__wrapped__", None) is not None:
        return

    @functools.wraps(real)
    def _shutdown() -> None:
        try:
            real()
        finally:
            say_exiting()
    threading._shutdown = _shutdown  # type: ignore[attr-defined]


def again_after_init() -> None:
    """Once MindSpore (or torch) has registered its exit handlers: say ``exiting`` before them
    (where ``threading._shutdown`` is missing; else it comes before every handler anyway)."""
    atexit.register(say_exiting)


def say_exiting() -> None:
    """The ``exiting`` event, once."""
    global _said
    if _said:
        return
    _said = True
    clean = getattr(sys, "last_value", None) is None and all(code in (None, 0) for code in _asked)
    events.emit(contract.EVENT_EXITING, clean=clean)


def _recording_exit(real: Callable[..., Any]) -> Callable[..., Any]:
    def exit(status: object = None) -> Any:
        _asked.append(status)
        return real(status)
    return functools.update_wrapper(exit, real)


def _print_stacks_on_a_fault() -> None:
    """faulthandler for fatal signals, into the rank's log (a script's own stays)."""
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):  # no stderr with a descriptor
        pass
