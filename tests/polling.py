"""The one way the tests wait for something: poll a predicate until it holds.

Standard library only, so that the test-host library (``tests/multinode/``), which tools load
by its path outside pytest (``scripts/test-hosts``, ``bench/bench_nodes.py``), uses it too.
"""
from __future__ import annotations

import time
from typing import Callable, Optional


def wait_for(predicate: Callable[[], object], what: str, timeout: float = 120.0, *,
             every: float = 0.05, check: Optional[Callable[[], None]] = None,
             failure: type[Exception] = AssertionError,
             detail: Optional[Callable[[], str]] = None) -> object:
    """Poll ``predicate`` every ``every`` seconds until it is truthy, and return its value.

    ``check`` runs before each look and raises once what is waited for can no longer come (a
    daemon died). At ``timeout`` raises ``failure`` naming ``what``, followed by ``detail()``
    when given (a daemon's log tail). The timeout only keeps a broken test from hanging: no
    test judges the product by it. Predicates that start processes in the test hosts poll
    every 0.5 s or so, not to steal the two cores from the ranks being waited for.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check is not None:
            check()
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise failure(f"timed out after {timeout:g} s waiting for {what}"
                  + (f"; {detail()}" if detail is not None else ""))
