"""The host side never imports MindSpore: start-up stays fast and it runs without MindSpore."""
import pkgutil
import subprocess
import sys

import launcher


def test_every_launcher_module_imports_without_mindspore() -> None:
    names = sorted(m.name for m in pkgutil.walk_packages(launcher.__path__, "launcher."))
    names += ["parallel", "parallel.events", "parallel.rank_hook"]
    code = (f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore')\n"
            f"print('LOADED', {len(names)}, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert f"LOADED {len(names)} []" in out.stdout, out.stdout + out.stderr
    assert "launcher.cli" in names and "launcher.supervisor" in names
