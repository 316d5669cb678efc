"""Loaded at start-up by every process npu-launch starts: the launcher puts this folder first on
``PYTHONPATH``. It installs the rank hook (error reports, events, parent watch) so that user
scripts need no decorator, then runs any ``sitecustomize`` this one shadows.

The hook is imported from this Python's own npu-launch if it has one, else from the tree this
folder is in (the launcher's): a rank whose script re-runs itself under another environment's
Python, or a launcher run from a source checkout, still reports its errors and its start, and
MindSpore's scheduler (started when a rank says it imports MindSpore) is not waited for in vain.
The rank hook and what it imports are standard library only."""
from __future__ import annotations

import os
import sys
from types import ModuleType


def _rank_hook() -> ModuleType | None:
    try:
        from parallel.hook import rank_hook
        return rank_hook
    except ImportError:
        pass
    if "parallel" in sys.modules:  # another package of that name: leave it alone
        return None
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, tree)
    try:
        from parallel.hook import rank_hook
        return rank_hook
    except Exception:  # noqa: BLE001 - a Python too old for it: run the script unchanged
        for name in [n for n in sys.modules if n == "parallel" or n.startswith("parallel.")]:
            del sys.modules[name]
        return None
    finally:
        sys.path.remove(tree)  # the package found stays; the user's sys.path is theirs


def _boot() -> None:
    rank_hook = _rank_hook()
    if rank_hook is None:  # run the script unchanged
        return
    rank_hook.install()
    rank_hook.run_shadowed_sitecustomize(__file__)


_boot()
