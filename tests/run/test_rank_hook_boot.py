"""A rank whose Python has no npu-launch still gets the rank hook: ``parallel/_boot`` imports it
from the launcher's own tree. Real processes: the rank's script re-runs itself (``os.execv``)
under a virtual environment's Python made for the test, without npu-launch, psutil or MindSpore,
as a script that switches to another environment does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import assert_no_job_processes, run_launcher

_SWITCH = """\
import os, sys
python = {python!r}
if sys.executable != python:  # the launcher's Python: go on in the other environment's
    os.execv(python, [python, __file__])
try:
    import psutil  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the other environment has psutil: it is not one without npu-launch")
raise ValueError("the rank's own error, in a Python without npu-launch")
"""


def test_a_rank_in_a_python_without_npu_launch_still_reports_its_exception(tmp_path: Path) -> None:
    venv = tmp_path / "other-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the ranks' too
    plain = subprocess.run([python, "-c", "import parallel"], capture_output=True, env=alone,
                           cwd=tmp_path)
    assert plain.returncode != 0, "the test's environment must lack npu-launch"
    script = tmp_path / "switch.py"
    script.write_text(_SWITCH.format(python=python))
    log_dir = tmp_path / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "other-python",
                          "--log-dir", str(log_dir), str(script), env=alone, timeout=120)
    assert result.returncode == 1, result.stderr
    # The error report's line, which only a loaded rank hook writes (the log's tail shows the
    # traceback too, as "    | ..." lines).
    assert "  ValueError: the rank's own error, in a Python without npu-launch" in \
        result.stderr.splitlines(), result.stderr
    cause = json.loads((log_dir / "summary.json").read_text())["attempts"][-1]["cause"]
    assert cause["exception"] == "ValueError"
    assert_no_job_processes("other-python")
