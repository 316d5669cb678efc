"""The habits pyproject.toml writes down, kept by the test command: ruff's checks over the whole
tree, and mypy over the host side, the whole rank side (``parallel``, MindSpore typed as ``Any``)
and ``scripts``, with every ``type: ignore`` naming its error code and used; and the launcher's
records typed past the edge (``typed_reads``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO


def _run(*module_and_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *module_and_args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_ruff() -> None:
    result = _run("ruff", "check", "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.fixture(scope="module")
def mypy_build() -> dict:
    """One mypy build of the tree (``tests/typed_reads.py``): its errors and its ``.get(`` reads."""
    result = _run("tests.typed_reads")
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


def test_mypy(mypy_build: dict) -> None:
    assert mypy_build["errors"] == [], "\n".join(mypy_build["errors"])


def test_the_launcher_reads_records_typed_past_the_edge(mypy_build: dict) -> None:
    """No ``.get(`` on a plain dict (untyped values: a record read by field name) outside the
    edge readers (tests/typed_reads.py names them and says how the types are found)."""
    found = mypy_build
    assert found["untyped"] == [], f"mypy gave these receivers no type: {found['untyped']}"
    # The check sees: the edge readers' own reads are found, as are the typed maps' lookups.
    assert len(found["edge"]) >= 5 and found["typed"] >= 50, found
    assert found["outside"] == [], (
        "read these records as typed values at the edge (parallel.record_fields.JsonObject, "
        "launcher.observe.read_values.Fields, a from_json): " + "; ".join(found["outside"]))
