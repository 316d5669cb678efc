"""The host side never imports MindSpore: start-up stays fast and it runs without MindSpore."""
import pkgutil
import subprocess
import sys

import launcher
from helpers import REPO, TESTS, module_marks


def test_every_launcher_module_imports_without_mindspore() -> None:
    names = sorted(m.name for m in pkgutil.walk_packages(launcher.__path__, "launcher."))
    names += ["parallel", "parallel.events", "parallel.rank_hook"]
    code = (f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore')\n"
            f"print('LOADED', {len(names)}, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert f"LOADED {len(names)} []" in out.stdout, out.stdout + out.stderr
    assert "launcher.cli" in names and "launcher.supervisor" in names


def test_test_modules_outside_the_mindspore_mark_import_without_it() -> None:
    """``-m "not mindspore"`` still imports every test module not marked mindspore as a whole
    (conftest.py leaves out the marked ones): none of them, nor the conftests and helpers, may
    load MindSpore at import time."""
    paths = [p for p in sorted(TESTS.rglob("test_*.py")) if "mindspore" not in module_marks(p)]
    names = ["conftest", "helpers", "multinode.conftest"]
    names += [".".join(p.relative_to(TESTS).with_suffix("").parts) for p in paths]
    code = (f"import importlib, sys\nsys.path[:0] = [{str(TESTS)!r}, {str(REPO)!r}]\n"
            f"for n in {names!r}: importlib.import_module(n)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore')\n"
            f"print('LOADED', {len(names)}, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert f"LOADED {len(names)} []" in out.stdout, out.stdout + out.stderr
    assert "test_config_cli" in names and "test_trainer" not in names
