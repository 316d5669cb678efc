"""Matching files: bad input skipped with a note, long lines bounded, no false alarms."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.diagnose import diagnose_paths, load, scan_file
from launcher.diagnose.sources import rank_of

ROOT = Path(__file__).resolve().parents[2]
EI0006 = "EI0006: Getting socket times out. Reason: 1. The remote does not initiate a connect request."
OOM = ("        [driver interface] halMemAlloc failed: device_id=6, size=32212254720, type=2, "
       "env_type=3, drvRetCode=6![FUNC:ReportError][FILE:npu_driver.cc][LINE:568]")


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def test_the_cause_comes_first_and_peers_timeouts_follow(tmp_path):
    _write(tmp_path / "log dir" / "rank_3.log", "step\n" * 811 + OOM + "\n")
    for rank in (0, 1, 2, 4, 5, 6, 7):
        _write(tmp_path / "log dir" / f"rank_{rank}.log", f"ok\n{EI0006}\n")
    diagnosis = diagnose_paths([str(tmp_path / "log dir")])
    line = diagnosis.block()[0]
    assert line.startswith("npu-launch: likely cause: rank 3 ran out of device memory "
                           "(EL0004, rank_3.log:812); ranks 0-2, 4-7 timed out connecting")
    assert "(EI0006)" in line and "Fix: Lower the batch size" in line
    found = diagnosis.to_json()
    assert found[0]["rank"] == 3 and found[0]["consequence_of"] is None
    assert {f["consequence_of"] for f in found[1:]} == {3}


def test_npu_launchs_log_dir_names_each_ranks_host_from_its_plan(tmp_path):
    """As the job's own failure block does: ``rank 3 on node2``, the host from ``plan.json``;
    a plan that cannot be read (not JSON, a host that is no text) names no host, and no error."""
    logs = tmp_path / "logs"
    _write(logs / "rank_3.log", OOM + "\n")
    _write(logs / "rank_0.log", EI0006 + "\n")
    plan = {"job_id": "j", "ranks": [{"rank": 0, "host": "node1"}, {"rank": 3, "host": "node2"}]}
    _write(logs / "plan.json", json.dumps(plan))
    line = diagnose_paths([str(logs)]).block()[0]
    assert line.startswith("npu-launch: likely cause: rank 3 on node2 ran out of device memory"), line
    assert "rank 0 on node1 timed out" in line, line
    for bad in ("{not json", json.dumps({"ranks": [{"rank": 3, "host": 7}, "x", {"rank": "3"}]}),
                json.dumps([1, 2])):
        _write(logs / "plan.json", bad)
        line = diagnose_paths([str(logs)]).block()[0]
        assert line.startswith("npu-launch: likely cause: rank 3 ran out of device memory"), line


def test_a_blamed_ranks_timeout_never_hides_another_ranks_own_fault(tmp_path):
    _write(tmp_path / "worker_0.log", EI0006 + "\n")
    _write(tmp_path / "worker_1.log", "EJ0001: Failed to initialize the HCCP process.\n")
    from launcher.diagnose.run import diagnose_files
    from launcher.diagnose.sources import LogFile
    diagnosis = diagnose_files([LogFile(str(tmp_path / "worker_0.log"), 0),
                                LogFile(str(tmp_path / "worker_1.log"), 1)], blamed=0)
    assert diagnosis.to_json()[0]["rank"] == 1
    assert diagnosis.block()[0].startswith("npu-launch: likely cause: rank 1 could not start HCCP")


@pytest.mark.parametrize("path, rank", [
    ("hosts/node2/rank_3.log", 3), ("worker_12.log", 12), ("scheduler.log", None),
    ("run/attempt_0/5/stderr.log", 5), ("ascend/rank_7/debug/plog/plog-123_1.log", 7),
    ("slurm-1234.out", None), ("plog/plog-1382_20250805194601414.log", None),
])
def test_a_files_rank_is_read_from_its_path(path, rank):
    assert rank_of(path) == rank


def test_bad_input_is_skipped_with_one_note_each(tmp_path):
    _write(tmp_path / "d" / "rank_0.log", EI0006 + "\n")
    (tmp_path / "d" / "core.bin").write_bytes(b"\x7fELF\0\0\0" * 100)
    (tmp_path / "d" / "gbk.log").write_bytes("错误".encode("gbk") * 50 + b"\n")
    os.symlink(tmp_path / "d", tmp_path / "d" / "loop")
    unreadable = tmp_path / "d" / "secret.log"
    unreadable.write_text("x")
    unreadable.chmod(0)
    diagnosis = diagnose_paths([str(tmp_path / "d"), str(tmp_path / "missing")])
    notes = "\n".join(diagnosis.notes)
    assert "binary file" in notes and "not UTF-8" in notes and "missing" in notes
    assert diagnosis.named and diagnosis.files_read >= 1


def test_a_long_line_is_read_in_bounded_pieces(tmp_path):
    path = tmp_path / "long.log"
    with open(path, "wb") as f:
        f.write(b"x" * (6 << 20) + b" EI0006: Getting socket times out\nnext\n")
    code = ("import resource, sys; from launcher.diagnose import scan_file, load; "
            "knowledge = load(); before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"hits = scan_file({str(path)!r}, knowledge); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, "
            "[h.fault.id for h in hits])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split(maxsplit=1)
    # ru_maxrss in KiB: what the scan added to the process, whatever the interpreter started with.
    assert int(out[0]) < 32 * 1024, f"{out[0]} KiB more memory for one long line of 6 MB"
    assert "hccl-socket-timeout" in out[1]


def test_the_first_line_and_count_of_each_fault(tmp_path):
    path = tmp_path / "rank_0.log"
    _write(path, f"a\n{EI0006}\nb\n{EI0006}\n")
    (hit,) = scan_file(str(path), load())
    assert (hit.line, hit.count, hit.evidence) == (2, 2, "rank_0.log:2")


SCRIPTS = {
    "key_error": "cfg = {'lr': 0.1}\nprint(cfg['batch_size'])\n",
    "missing_data": "open('/data/imagenet/train/n01440764/img_001.JPEG').read()\n",
    "type_error": "def f(a, b):\n    return a + b\nf(1, 'x')\n",
    "attribute": "import os\nos.path.joinn('a', 'b')\n",
    "value_error": "int('12a')\n",
    "zero_division": "steps = 0\nprint(10 / steps)\n",
    "index_error": "xs = []\nxs[3]\n",
    "import_error": "import no_such_module_for_npu_launch\n",
}


RETRY = ("[WARNING] DISTRIBUTED(1,python):2026-12-04-10:11:12.345.678 [tcp_client.cc:1] Connect] "
         "Failed to connect to the meta server node url: 127.0.0.1:8118\n")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_ordinary_script_errors_match_nothing(tmp_path, name):
    script = tmp_path / f"{name}.py"
    script.write_text(SCRIPTS[name])
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" in run.stderr
    # a worker's retries before the scheduler listened: healthy runs print them too
    _write(tmp_path / "logs" / "rank_0.log", RETRY * 3 + run.stdout + run.stderr)
    assert not diagnose_paths([str(tmp_path / "logs")]).named


def test_the_command_exit_codes_and_json(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "launcher.cli", "diagnose", *args],
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    _write(tmp_path / "named" / "worker_0.log", EI0006 + "\n")
    _write(tmp_path / "clean" / "worker_0.log", "all fine\n")
    os.makedirs(tmp_path / "empty")
    named = cli("--json", str(tmp_path / "named"))
    assert named.returncode == 1
    assert json.loads(named.stdout)["diagnosis"][0]["evidence"] == "worker_0.log:1"
    assert cli(str(tmp_path / "clean")).returncode == 0
    empty = cli(str(tmp_path / "empty"))
    assert empty.returncode == 2 and "Traceback" not in empty.stderr
    assert empty.stderr.strip().splitlines()[-1].startswith("npu-launch: error: no readable log")


def test_files_of_no_rank_stand_alone(tmp_path):
    _write(tmp_path / "plog" / "plog-1_1.log", EI0006 + "\n")
    _write(tmp_path / "plog" / "plog-2_1.log", "EJ0001: Failed to initialize the HCCP process.\n")
    found = diagnose_paths([str(tmp_path / "plog")]).to_json()
    assert [(f["rank"], f["id"], f["evidence"]) for f in found] == [
        (None, "hccp-init", "plog-2_1.log:1"), (None, "hccl-socket-timeout", "plog-1_1.log:1")]
