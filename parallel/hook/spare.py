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

Every rank also tells, as it begins importing a framework, whether a spare would run its script
the same (``kept``): the rank hook notes how it left the process (``note_start``).
"""
from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys
from typing import Any, NoReturn

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


def _leave(error: BaseException) -> NoReturn:
    if not isinstance(error, SystemExit):
        sys.stderr.write(f"npu-launch spare: {type(error).__name__}: {error}\n")
        sys.stderr.flush()
    os._exit(1)


def note_start() -> None:
    """Note the environment, ``sys.path`` and the top-level modules as the rank hook leaves
    them, for ``kept``."""
    _started_as[:] = [dict(os.environ), list(sys.path), {n.partition(".")[0] for n in sys.modules}]


def compile_key_at_first_compile(api: Any) -> None:
    """MindSpore's compile cache keys the graphs on the script's own files: those not under
    ``sys.path`` as it was when ``mindspore`` was imported (``graph.api.sys_path``, the script's
    folder left out) and on the entry script's path. A spare imported it before the script ran,
    so both are taken again at the first compile, once the script set up its ``sys.path``; else
    every warm restart would compile anew."""
    real = getattr(api, "_get_compile_cache_dep_files", None)
    paths = getattr(api, "sys_path", None)
    if real is None or not isinstance(paths, list):
        return

    def dep_files() -> Any:
        if api._get_compile_cache_dep_files is dep_files:
            api._get_compile_cache_dep_files = real
            # As ``graph.api`` takes them at its import: for ``python -m``, ``sys.argv[0]`` is
            # only the module's path once Python found it, after a spare's import.
            script = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else None
            if hasattr(api, "entry_script_path"):
                api.entry_script_path = script
            now = list(sys.path)
            script_dir = os.path.dirname(script) if script else None
            if script_dir in now:
                now.remove(script_dir)
            paths[:] = now
        return real()
    api._get_compile_cache_dep_files = dep_files


_started_as: list[Any] = []  # see note_start
"""The environment, ``sys.path`` and the top-level modules as the hook left them: a script that
changes the environment or where the framework is found, or loads another package's compiled
library, before it imports the framework tells the launcher a spare would not run it the same
(``kept``)."""
_SAME_EITHER_WAY = frozenset({"numpy", "parallel"})
"""Packages a script may load before the framework: MindSpore loads numpy first itself, and
``parallel`` is npu-launch's own."""


def _native_first(loaded: set[str]) -> bool:
    """Whether the script loaded a compiled extension of a package of its own or a third party
    before the framework: native libraries load in another order in a spare (on Arm servers,
    "cannot allocate memory in static TLS block" is fixed by such an order)."""
    skip = loaded | _SAME_EITHER_WAY | set(getattr(sys, "stdlib_module_names", ()))
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] not in skip \
                and str(getattr(module, "__file__", None) or "").endswith(suffixes):
            return True
    return False


def kept(framework: str) -> bool:
    """Whether a spare would run this rank's script the same (the ``framework`` event's
    ``kept``): the environment is as the hook left it (``note_start``), no other package's compiled library was
    loaded since, and ``framework`` is found where it was then (a script may add its own folders
    to ``sys.path``, not another framework's)."""
    if not _started_as:
        return False
    env, path, loaded = _started_as
    if dict(os.environ) != env or _native_first(loaded):
        return False
    now = importlib.machinery.PathFinder.find_spec(framework, sys.path)
    then = importlib.machinery.PathFinder.find_spec(framework, path)
    return now is not None and then is not None and now.origin == then.origin
