"""The host side never imports MindSpore: start-up stays fast and it runs without MindSpore. And the
dependency rule: import-linter's contracts, and no import cycle on the rank side."""
import graphlib
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from helpers import REPO, TESTS, module_marks

import launcher


def test_every_launcher_module_imports_without_mindspore() -> None:
    names = sorted(m.name for m in pkgutil.walk_packages(launcher.__path__, "launcher.")
                   if not m.name.endswith(".__main__"))  # runs the command when imported
    names += ["parallel", "parallel.events", "parallel.hook.rank_hook"]
    code = (f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore')\n"
            f"print('LOADED', {len(names)}, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert f"LOADED {len(names)} []" in out.stdout, out.stdout + out.stderr
    assert "launcher.cli" in names and "launcher.run.supervisor" in names


def test_test_modules_outside_the_mindspore_mark_import_without_it() -> None:
    """``-m "not mindspore"`` still imports every test module not marked mindspore as a whole
    (conftest.py leaves out the marked ones): none of them, nor the conftests and helpers, may
    load MindSpore at import time."""
    paths = [p for p in sorted(TESTS.rglob("test_*.py")) if "mindspore" not in module_marks(p)]
    modules = [("", "conftest"), ("", "helpers"), ("", "multinode.conftest")]
    modules += [_importable(p) for p in paths]
    code = (f"import importlib, sys\nsys.path[:0] = [{str(TESTS)!r}, {str(REPO)!r}]\n"
            f"for folder, name in {modules!r}:\n"
            "    sys.path[:0] = [folder] if folder else []\n"
            "    importlib.import_module(name)\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore')\n"
            f"print('LOADED', {len(modules)}, heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert f"LOADED {len(modules)} []" in out.stdout, out.stdout + out.stderr
    names = [name for _, name in modules]
    assert "test_config_cli" in names and "test_trainer" not in names


def _importable(path: Path) -> tuple[str, str]:
    """(folder to put first on ``sys.path``, module name) to import a test module as pytest
    does: by its dotted name under ``tests/`` inside a package (``multinode``), else by its own
    name from its folder (``tests/parallel/`` must not hide the ``parallel`` package)."""
    if (path.parent / "__init__.py").exists():
        return "", ".".join(path.relative_to(TESTS).with_suffix("").parts)
    return str(path.parent), path.stem


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", command], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_the_dependency_rule_holds() -> None:
    """pyproject.toml's import-linter contracts: no package cycles (launcher above rank_tables
    above parallel), the launcher's subpackages in their layers, the rank side's subpackages in
    theirs (and the trainer's and the hook's modules), the seam imports nothing, the rank side
    nothing of the host side, the host side no MindSpore."""
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "8 kept, 0 broken" in result.stdout


def test_no_module_has_an_import_cycle() -> None:
    """No module of ``launcher``, ``parallel`` or ``rank_tables`` reaches itself through
    imports, those inside functions and under ``TYPE_CHECKING`` counted (as import-linter counts
    them): the layers contracts order the subpackages and the trainer's and the hook's modules,
    this covers every module."""
    graph = grimp.build_graph("launcher", "parallel", "rank_tables", cache_dir=None)
    imports = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    graphlib.TopologicalSorter(imports).prepare()  # raises CycleError, naming the cycle


@pytest.mark.parametrize("module, wrong", [
    ("parallel/events.py", "import launcher.errors"),
    ("parallel/data/readers.py", "import parallel.trainer"),  # independent siblings on the rank side
    ("parallel/trainer/amp.py", "def scaler():\n    import parallel.trainer.cells  # the old circle: in a function, still counted"),
    ("launcher/plan/launch_plan.py", "import parallel.mode.setup"),
    ("parallel/contract.py", "import yaml"),
    ("rank_tables/table.py", "import launcher.config.hostfile"),
    ("launcher/config/devices.py", "import launcher.plan.launch_plan"),  # a layer above
    ("launcher/run/watch.py", "import launcher.observe.monitor"),
    ("launcher/cluster/fanout.py", "import launcher.observe.report"),  # independent siblings
    ("launcher/plan/binding.py", "if False:\n    import launcher.run.process  # type-only, still counted"),
])
def test_a_wrong_import_breaks_the_rule(tmp_path: Path, module: str, wrong: str) -> None:
    for item in ("launcher", "parallel", "rank_tables", "pyproject.toml"):
        source = REPO / item
        copy = shutil.copytree if source.is_dir() else shutil.copy
        copy(source, tmp_path / item)
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{wrong}  # deliberately against the rule\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0 and "BROKEN" in result.stdout, result.stdout[-3000:]
