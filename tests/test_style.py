"""The habits pyproject.toml writes down, kept by the test command: ruff's checks over the whole
tree, and mypy over the host side, the whole rank side (``parallel``, MindSpore typed as ``Any``)
and ``scripts``, with every ``type: ignore`` naming its error code and used."""
from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def _run(*module_and_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *module_and_args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_ruff() -> None:
    result = _run("ruff", "check", "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_mypy() -> None:
    result = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
