"""Whether SCRIPT is something Python runs, checked before anything starts.

A shell script, a program or a file with a syntax error would make every rank fail the same
way once the whole job had started; ``check_python_source`` says so in one line instead
(``script 'train.py':3: not Python (...)``). A ``#!`` line is a comment to Python, so a file
whose ``#!`` names another interpreter but compiles (a shell and Python polyglot) is taken.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Optional

from launcher import limits
from launcher.errors import ConfigError
from launcher.limits import shown

_PYTHON_MAGIC = (b"PK\x03\x04", importlib.util.MAGIC_NUMBER[:2])
"""A zip application and compiled bytecode: files Python runs that are no source."""


def check_python_source(path: str, name: str) -> None:
    """Refuse a script Python cannot run before anything starts (a shell script, a program, a
    syntax error), naming it and, for source, ``file:line``; every rank would fail the same. A
    ``#!`` line naming another interpreter is only a comment to Python: such a file that
    compiles (a shell and Python polyglot) is taken."""
    if not os.path.isfile(path):  # a FIFO would hold every rank, /dev/zero fill its memory
        raise ConfigError(f"script {name}: not a regular file")
    try:  # read, not sized: /proc's files say they are empty
        head = limits.read_at_most(path, limits.MAX_COMPILED_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"script {name}: {e.strerror}") from None
    whole = len(head) <= limits.MAX_COMPILED_BYTES
    if head.startswith(_PYTHON_MAGIC):
        return
    if head.startswith(b"\x7fELF"):
        raise ConfigError(f"script {name}: an executable program, not Python: npu-launch runs "
                          "SCRIPT with Python in every rank")
    # Past the compile bound only the first line is read: a foreign #! line is believed.
    problem = _compile_problem(head, path) if whole else (
        (0, "") if _foreign_interpreter(head) else None)
    if problem is None:
        return
    interpreter = _foreign_interpreter(head)
    if interpreter:
        raise ConfigError(f"script {name}: a {interpreter} script ({shown(_first_line(head))}), "
                          "not Python: npu-launch runs SCRIPT with Python in every rank")
    line, why = problem
    raise ConfigError(f"script {name}{f':{line}' if line else ''}: not Python ({why})")


def _foreign_interpreter(head: bytes) -> str:
    """The program a ``#!`` line names when it is not Python, else "" (``env`` and its
    options are looked through: ``#!/usr/bin/env -S python3 -u``)."""
    if not head.startswith(b"#!"):
        return ""
    words = _first_line(head)[2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if not words:
        return ""
    program = os.path.basename(words[0])
    return "" if program.startswith(("python", "pypy")) else program


def _first_line(head: bytes) -> str:
    return head.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def _compile_problem(source: bytes, path: str) -> Optional[tuple[int, str]]:
    """Why ``source`` does not compile (its line, 0 if none, and the reason), or None."""
    with warnings.catch_warnings():  # an invalid escape sequence is the script's own business
        warnings.simplefilter("ignore")
        try:
            compile(source, path, "exec", dont_inherit=True)
        except SyntaxError as e:
            return e.lineno or 1, shown(e.msg)
        except ValueError as e:  # NUL bytes, on Python before 3.12
            return 0, shown(str(e))
        except (RecursionError, MemoryError):
            return 0, "nested too deep to compile"
    return None
