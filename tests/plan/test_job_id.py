"""A job's default id, and so its log directory: new for each launch, except in a Slurm batch
script, where a requeued job's same command must find its own log directory again
(``launcher/plan/job_id.py``). Shown by ``--dry-run``: nothing starts."""
import os
import re
import subprocess
from pathlib import Path

from helpers import RANK_SCRIPTS, assert_one_line_error, npu_launch_argv, run_launcher

SCRIPT = str(RANK_SCRIPTS / "plain_job.py")
CPU = ("--device", "cpu", "--cards", "1", "--launcher", "local")


def _log_dir(tmp_path: Path, env: dict, *args: str) -> str:
    result = run_launcher(*CPU, "--dry-run", *args, cwd=tmp_path, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("log dir: ")]
    return line.removeprefix("log dir: ")


def test_a_batch_job_finds_the_same_log_directory_when_requeued(tmp_path: Path) -> None:
    batch = {"ENVIRONMENT": "BATCH", "SLURM_JOB_ID": "4242"}
    first = _log_dir(tmp_path, batch, SCRIPT, "--steps", "3")
    requeued = _log_dir(tmp_path, {**batch, "SLURM_RESTART_COUNT": "1"}, SCRIPT, "--steps", "3")
    assert first == requeued
    assert re.fullmatch(re.escape(str(tmp_path / "npu_launch_logs")) + r"/slurm-4242-[0-9a-f]{8}",
                        first), first
    other_command = _log_dir(tmp_path, batch, SCRIPT, "--steps", "4")
    other_job = _log_dir(tmp_path, {**batch, "SLURM_JOB_ID": "4243"}, SCRIPT, "--steps", "3")
    assert len({first, other_command, other_job}) == 3


def test_outside_a_batch_script_every_launch_is_new(tmp_path: Path) -> None:
    salloc = {"SLURM_JOB_ID": "4242"}  # an salloc shell: no ENVIRONMENT=BATCH
    names = {Path(_log_dir(tmp_path, salloc, SCRIPT)).name for _ in range(2)}
    assert len(names) == 2 and not any(n.startswith("slurm-") for n in names), names


def test_an_option_still_names_the_job(tmp_path: Path) -> None:
    batch = {"ENVIRONMENT": "BATCH", "SLURM_JOB_ID": "4242"}
    assert _log_dir(tmp_path, batch, "--job-id", "mine", SCRIPT) == str(tmp_path / "npu_launch_logs" / "mine")
    assert _log_dir(tmp_path, batch, "--log-dir", "here", SCRIPT) == str(tmp_path / "here")


def test_a_job_id_that_is_no_number_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "ENVIRONMENT": "BATCH", "SLURM_JOB_ID": "../../etc"}
    result = run_launcher(*CPU, SCRIPT, cwd=tmp_path, env=env)
    assert_one_line_error(result, "SLURM_JOB_ID '../../etc'", "not a Slurm job id")
    assert list(tmp_path.iterdir()) == []



def test_a_command_that_is_not_utf8_still_names_the_batch_job(tmp_path: Path) -> None:
    """A file name or argument of bytes that are not UTF-8 (``$'\\xff'``) reaches Python as
    surrogate escapes; the id hashes them alike each time."""
    env = {**os.environ, "ENVIRONMENT": "BATCH", "SLURM_JOB_ID": "4242"}
    script = tmp_path / os.fsdecode(b"job\xff.py")
    script.write_text(Path(SCRIPT).read_text())

    def log_dir(*args: str) -> str:
        result = subprocess.run(npu_launch_argv(*CPU, "--dry-run", *args), cwd=tmp_path, env=env,
                                capture_output=True, text=True, errors="surrogateescape", timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        (line,) = [x for x in result.stdout.splitlines() if x.startswith("log dir: ")]
        return line.removeprefix("log dir: ")

    argument = os.fsdecode(b"--steps=\xff")
    first = log_dir(str(script), argument)
    assert first == log_dir(str(script), argument)
    assert re.fullmatch(r".*/slurm-4242-[0-9a-f]{8}", first), first
    assert first != log_dir(SCRIPT, argument)
