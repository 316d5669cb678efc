"""A warm spare: a process that imports the framework during one attempt and becomes a rank (or
the scheduler) of the next, so a restart does not pay the import again (``launcher.run.spares``).

The launcher starts it with the command and environment of the process it may stand in for,
plus ``NPU_LAUNCH_SPARE`` (the framework to import) and a token of its own: the failed
attempt's teardown ends what carries the launch's token, and passes it by. The rank hook calls
``wait`` before anything else of its own: the framework is imported with the hook's wrappers
in place, and the process blocks on its stdin. The launcher's one line there is the next
attempt's environment for the process, as JSON: ``wait`` puts it in place of its own, points
stdin at ``/dev/null`` and returns, the rank hook goes on as in any rank, and Python runs the
command line's script as it would have. An end of stdin without that line (the job ended,
nothing failed) exits at once, and so does anything that goes wrong while it waits: a spare
never runs the script in an environment that is not a rank's.

Nothing is written to the rank's files until the go: they belong to the running attempt.
"""
from __future__ import annotations

import importlib
import json
import os
import sys

from parallel import contract

_QUIET = (contract.EVENTS_FILE, contract.ERROR_FILE, contract.STACK_FILE)
_GO_MAX = 64 << 20
"""The longest go line read: an environment within the kernel's ``ARG_MAX`` is far shorter."""


def wait(framework: str) -> dict[str, str]:
    """Import ``framework``, then wait for the go; the environment it gave, now this
    process's own. Exits the process on an end of stdin or any error."""
    try:
        for name in _QUIET:
            os.environ.pop(name, None)
        importlib.import_module(framework)
        env = _read_go()
        os.environ.clear()
        os.environ.update(env)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        return env
    except BaseException as e:  # noqa: BLE001 - a spare that cannot stand in ends, silently
        _leave(e)
        raise  # not reached


def _read_go() -> dict[str, str]:
    line = bytearray()
    while not line.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)  # the job ended, or this spare was not needed
        line += chunk
        if len(line) > _GO_MAX:
            raise ValueError("go line too long")
    env = json.loads(line)
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise ValueError("go line is no environment")
    return env


def _leave(error: BaseException) -> None:
    if not isinstance(error, SystemExit):
        sys.stderr.write(f"npu-launch spare: {type(error).__name__}: {error}\n")
        sys.stderr.flush()
    os._exit(1)
