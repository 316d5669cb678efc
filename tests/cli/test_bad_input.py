"""Bad input of every class issue 10 found: one line naming the problem, exit 2, nothing started
and no log directory made. A refusal runs the CLI's ``main`` in this process
(``helpers.run_cli_here``: the funnel a process of it exits through); what only a process has
(a standard output it cannot write, a working directory removed under it, a planted bug, the
environment it was started with) runs npu-launch as a process. None of
them reaches a rank."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import (
    RANK_SCRIPTS,
    UNWRITABLE_STDOUTS,
    assert_one_line_error,
    npu_launch_argv,
    run_cli_here,
    run_launcher,
    run_unwritable,
)

SCRIPT = str(RANK_SCRIPTS / "chatty.py")
CPU = ("--device", "cpu")


def _refused(tmp: Path, *args: str, needles: tuple[str, ...] = ()) -> None:
    logs = tmp / "logs"
    given = args if "--log-dir" in args else ("--log-dir", str(logs), *args)
    result = run_cli_here(*given, cwd=tmp)
    assert_one_line_error(result, *needles)
    assert "Traceback" not in result.stderr
    assert not logs.exists() and not (tmp / "npu_launch_logs").exists()


@pytest.mark.parametrize("args, needles", [
    # numbers: bounds said in the message
    ([*CPU, "--cards", "10000", SCRIPT], ["--cards 10000", "1-64"]),
    ([*CPU, "--cards", "9" * 30, SCRIPT], ["--cards", "1-64"]),
    ([*CPU, "--cards", "9" * 5000, SCRIPT], ["--cards '999", "a number of 5000 digits; at most 32"]),
    # ASCII digits only (click's int takes these, and '1_0' is ten ranks)
    ([*CPU, "--cards", "1_0", SCRIPT], ["--cards '1_0': expected a whole number written in digits 0-9"]),
    ([*CPU, "--cards", "\uff11", SCRIPT], ["--cards '\uff11': expected a whole number written in digits 0-9"]),
    ([*CPU, "--cards", "+2", SCRIPT], ["--cards '+2': expected a whole number"]),
    ([*CPU, "--cards", " 2", SCRIPT], ["--cards ' 2': expected a whole number"]),
    ([*CPU, "--master-port", "8_118", SCRIPT], ["--master-port '8_118': expected a whole number"]),
    ([*CPU, "--seed", "\u0661\u0662", SCRIPT], ["--seed '\u0661\u0662': expected a whole number"]),
    ([*CPU, "--micro-batches", "0x10", SCRIPT], ["--micro-batches '0x10': expected a whole number"]),
    ([*CPU, "--max-restarts", "", SCRIPT], ["--max-restarts '': expected a whole number"]),
    ([*CPU, "--nnodes", "5000", SCRIPT], ["--nnodes 5000", "1-1024"]),
    ([*CPU, "--max-restarts", "99999999", SCRIPT], ["--max-restarts", "0-1000"]),
    ([*CPU, "--seed", "9" * 25, SCRIPT], ["parallel.seed", "at most 4294967295"]),
    ([*CPU, "--kill-timeout", "nan", SCRIPT], ["--kill-timeout nan", "between 0 and"]),
    ([*CPU, "--startup-timeout", "inf", SCRIPT], ["--startup-timeout inf"]),
    ([*CPU, "--hang-timeout", "1e308", SCRIPT], ["--hang-timeout"]),
    ([*CPU, "--hang-grace", "-1", SCRIPT], ["--hang-grace -1", "between 0 and"]),
    ([*CPU, "--ssh-port", "-1", SCRIPT], ["--ssh-port -1", "1-65535"]),
    ([*CPU, "--master-port", "70000", SCRIPT], ["--master-port 70000", "1-65535"]),
    # silently ignored combinations, now refused
    ([*CPU, "--console", "99", "--cards", "2", SCRIPT], ["--console 99", "ranks 0-1"]),
    ([*CPU, "--console", "-1", SCRIPT], ["--console -1"]),
    ([*CPU, "--console", "", SCRIPT], ["--console: empty (expected 'all', 'none' or ranks like 0,3)"]),
    ([*CPU, "--console", " ", SCRIPT], ["--console: empty"]),
    ([*CPU, "--cards", "2", "--console", "1,0,1", SCRIPT], ["--console 1,0,1: rank 1 is named twice"]),
    ([*CPU, "--config", "", SCRIPT], ["--config: empty path"]),
    ([*CPU, "--config", "c" * 100_000, SCRIPT], ["--config 'ccc", "a path of 100000 bytes", "4095"]),
    ([*CPU, "--nnodes", "2", SCRIPT], ["--nnodes 2 without --hostfile", "--node-rank"]),
    ([*CPU, "--include", "node1", SCRIPT], ["--include", "--hostfile"]),
    ([*CPU, "--exclude", "node1:0", SCRIPT], ["--exclude", "--hostfile"]),
    ([*CPU, "--launcher-args", "-t 5", SCRIPT], ["--launcher-args", "srun or mpirun"]),
    ([*CPU, "--ssh-option", "-v", SCRIPT], ["--ssh-option", "not over ssh"]),
    ([*CPU, "--debug", "--max-restarts", "2", SCRIPT], ["--debug", "--max-restarts"]),
    ([*CPU, "--debug", "--nnodes", "2", SCRIPT], ["--debug", "--nnodes"]),
    # names that would reach the file system or a process
    ([*CPU, "--job-id", "a/b", SCRIPT], ["--job-id 'a/b'"]),
    ([*CPU, "--job-id", "..", SCRIPT], ["--job-id '..'"]),
    ([*CPU, "--job-id", "/tmp/elsewhere", SCRIPT], ["--job-id '/tmp/elsewhere'"]),
    ([*CPU, "--job-id", "a\nb", SCRIPT], ["--job-id 'a\\nb'"]),
    ([*CPU, "--job-id", "x" * 100_000, SCRIPT], ["--job-id", "chars"]),
    ([*CPU, "--master-addr", "a b;c", SCRIPT], ["--master-addr", "host name or an IP"]),
    ([*CPU, "--launcher-args", "'unbalanced", SCRIPT], ["--launcher-args", "No closing quotation"]),
    # messages that say what is wrong
    ([*CPU, "--card", "2", SCRIPT], ["no such option: '--card' (did you mean --cards?)"]),
    ([*CPU, "--hang-timout", "2", SCRIPT], ["did you mean --hang-timeout?"]),
    ([*CPU, "-x.py"], ["no such option: '-x.py'", "./-x.py"]),
    ([*CPU, str(RANK_SCRIPTS)], ["a directory without __main__.py"]),
])
def test_bad_option_is_one_line(tmp_path: Path, args, needles) -> None:
    _refused(tmp_path, *args, needles=tuple(needles))


def test_a_preflight_count_is_ascii_digits_too(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("n1 slots=1\n")
    result = run_cli_here("preflight", "--hostfile", "hosts", "--nnodes", "1_0", cwd=tmp_path)
    assert_one_line_error(result, "--nnodes '1_0': expected a whole number written in digits 0-9")


@pytest.mark.parametrize("args, needles", [
    (["--include", ""], ["--include: empty (expected hosts and cards, e.g. node1:0,2@node2)"]),
    (["--exclude", " "], ["--exclude: empty"]),
    (["--include", "n1:0,0"], ["--include: card 0 is named twice for host 'n1'"]),
    (["--exclude", "n2:1@N1:1, 1"], ["--exclude: card 1 is named twice for host 'n1'"]),
])
def test_an_empty_or_repeating_host_filter_is_refused(tmp_path: Path, args, needles) -> None:
    """An empty ``--include`` was taken as none given; ``n1:0,0`` as ``n1:0``."""
    (tmp_path / "hosts").write_text("n1 slots=2\nn2 slots=2\n")
    _refused(tmp_path, *CPU, "--hostfile", "hosts", "--no-preflight", "--master-addr", "127.0.0.1",
             "--dry-run", *args, SCRIPT, needles=tuple(needles))
    result = run_cli_here("preflight", "--hostfile", "hosts", *args, cwd=tmp_path)
    assert_one_line_error(result, *needles)


def test_a_message_is_bounded_and_one_line(tmp_path: Path) -> None:
    result = run_cli_here(*CPU, "--console", "x\n" * 60_000, SCRIPT, cwd=tmp_path)
    assert_one_line_error(result, "--console")
    assert len(result.stderr) < 600


@pytest.mark.parametrize("stdout", UNWRITABLE_STDOUTS)
@pytest.mark.parametrize("json_plan", [False, True], ids=["text", "json"])
def test_a_plan_that_cannot_be_written_is_one_line(tmp_path: Path, stdout: str, json_plan: bool) -> None:
    """Like an unwritable ``-o FILE``: exit 2 and one line, and no traceback from Python's last
    flush of standard output at exit."""
    argv = npu_launch_argv(*CPU, "--cards", "2", "--dry-run", *(["--json"] if json_plan else []),
                           "--log-dir", str(tmp_path / "logs"), SCRIPT)
    result = run_unwritable(argv, stdout, cwd=tmp_path, timeout=120)
    why = {"/dev/full": "No space left on device", "closed": "it is closed"}.get(stdout, "Broken pipe")
    assert_one_line_error(result, f"npu-launch: error: cannot write the plan to standard output: {why}")
    assert not (tmp_path / "logs").exists()


def test_an_unexpected_exception_is_one_line_with_exit_1(tmp_path: Path) -> None:
    """The funnel's last line of defence: a bug is said in one line, and the variable it names
    shows the traceback."""
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    (tmp_path / "sitecustomize.py").write_text(
        "import launcher.launch\n"
        "def broken(*a, **k):\n    raise KeyError('planted')\n"
        "launcher.launch.make_job = broken\n")
    result = run_launcher(*CPU, "--dry-run", SCRIPT, cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "npu-launch: internal error: KeyError: 'planted' (a bug in npu-launch; "
        "NPU_LAUNCH_TRACEBACK=1 shows where)"]
    shown = run_launcher(*CPU, "--dry-run", SCRIPT, cwd=tmp_path,
                         env={**env, "NPU_LAUNCH_TRACEBACK": "1"})
    assert "Traceback" in shown.stderr and "planted" in shown.stderr


class TestLogDirectory:
    def test_a_file(self, tmp_path: Path) -> None:
        (tmp_path / "f").write_text("x")
        _refused(tmp_path, *CPU, "--log-dir", str(tmp_path / "f"), SCRIPT,
                 needles=("is a file, not a folder",))

    def test_under_a_file(self, tmp_path: Path) -> None:
        (tmp_path / "f").write_text("x")
        _refused(tmp_path, *CPU, "--log-dir", str(tmp_path / "f" / "job"), SCRIPT,
                 needles=(f"lies under {tmp_path / 'f'}, a file",))

    def test_a_folder_of_other_files_is_refused_and_left_as_it_was(self, tmp_path: Path) -> None:
        """``--log-dir .`` (or a folder of the user's) had its plan.json and summary.json
        replaced; an earlier launch's folder (its lock stays) or an empty one is taken."""
        mine = tmp_path / "mine"
        mine.mkdir()
        (mine / "plan.json").write_text("precious")
        _refused(tmp_path, *CPU, "--log-dir", str(mine), SCRIPT,
                 needles=(f"log directory {mine}: holds files that are no job's of npu-launch",))
        assert [p.name for p in mine.iterdir()] == ["plan.json"]
        assert (mine / "plan.json").read_text() == "precious"
        (tmp_path / "empty" / "lost+found").mkdir(parents=True)
        (mine / ".npu_launch.lock").write_text("")
        (tmp_path / "msrun_log").mkdir()  # msrun ran there before: npu-launch msrun reuses it
        for name in ("scheduler.log", "worker_0.log", "worker_1.log"):
            (tmp_path / "msrun_log" / name).write_text("msrun's\n")
        for taken in ("empty", "mine", "msrun_log"):
            result = run_cli_here(*CPU, "--dry-run", "--log-dir", taken, SCRIPT, cwd=tmp_path)
            assert result.returncode == 0, result.stderr

    def test_a_lock_that_is_a_folder(self, tmp_path: Path) -> None:
        (tmp_path / "logs" / ".npu_launch.lock").mkdir(parents=True)
        result = run_cli_here(*CPU, "--log-dir", str(tmp_path / "logs"), SCRIPT, cwd=tmp_path)
        assert_one_line_error(result, f"log directory {tmp_path / 'logs'}: .npu_launch.lock is a "
                              "folder, not npu-launch's lock file")
        assert [p.name for p in (tmp_path / "logs").iterdir()] == [".npu_launch.lock"]

    def test_dry_run_checks_it_too(self, tmp_path: Path) -> None:
        (tmp_path / "f").write_text("x")
        _refused(tmp_path, *CPU, "--dry-run", "--log-dir", str(tmp_path / "f" / "j"), SCRIPT)

    def test_read_only_file_system(self, tmp_path: Path) -> None:
        """A real read-only mount (root on this machine; a user's NFS export elsewhere)."""
        target = tmp_path / "ro"
        target.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(target), str(target)]
                                               ).returncode != 0:
            pytest.skip("needs root to make a read-only bind mount")
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
            _refused(tmp_path, *CPU, "--log-dir", str(target / "job"), SCRIPT,
                     needles=("read-only file system",))
        finally:
            subprocess.run(["umount", str(target)], check=False)


class TestConfigFile:
    @pytest.mark.parametrize("text, needles", [
        ("cards: [1, 2]\n", [":1: cards: expected a whole number, got [1, 2]"]),
        ("cards: {a: 1}\n", [":1: cards: expected a whole number"]),
        ("cards: true\n", [":1: cards: expected a whole number, got True"]),
        ("cards: 2.7\n", [":1: cards: expected a whole number, got 2.7"]),
        ("cards:\n", [":1: cards: no value"]),
        ("cards: !!int abc\n", [":1: cards: not a valid int"]),
        ("cards: !!python/object/apply:os.system [touch PWNED]\n", [":1: cards:", "constructor"]),
        (f"cards: {'9' * 5000}\n", [":1: cards:"]),
        ("kill-timeout: [1]\n", [":1: kill_timeout: expected a number"]),
        ("dry-run: 1\n", [":1: dry_run: expected true or false"]),
        ("device: [cpu]\n", [":1: device: expected a single value"]),
        ("cards: 1\nconsole: [1, 2]\n", [":2: console: expected a single value"]),
        ("cards: 1\nconsole: 5\n", [":2: --console 5: the job has ranks 0-0"]),
        ("cards: 1\nenv:\n  GOOD: 1\n  1X: 2\n", [":4: --env '1X': not a variable name"]),
        ("env:\n  A: null\n", [":2: env.A: expected a single value, got None"]),
        ("env:\n  A: yes\n", [":2: env.A: True is a YAML boolean"]),
        ("env:\n  RANK: '3'\n", [":2: --env RANK"]),
        ("env: {A: \"x\\0y\"}\n", ["--env A", "NUL"]),
        ("parallel: [1, 2]\n", [":1: parallel: expected a single value"]),
        ("cards: 2\nparallel:\n  mode: data\n  dp: abc\n", [":4: parallel.dp: expected an integer"]),
        ("parallel:\n  mode: data\n\n  seed: -3\n", [":4: parallel.seed: must be >= 0"]),
        ("? [a, b]\n: 1\n", [":1: expected an option name as the key"]),
        ("cards: 100\n", [":1: --cards 100: expected 1-64"]),
        # YAML 1.1 reads these as integers: 10, 8 (octal), 16, 90 (base 60), 3
        ("cards: 1_0\n", [":1: cards: '1_0': YAML reads it as 10; write a whole number in digits 0-9, "
                          "or quote it if you mean the text"]),
        ("cards: 010\n", [":1: cards: '010': YAML reads it as 8"]),
        ("master-port: 0x10\n", [":1: master_port: '0x10': YAML reads it as 16"]),
        ("parallel:\n  seed: 1:30\n", [":2: parallel: '1:30': YAML reads it as 90"]),
        ("env:\n  MASK: 0b11\n", [":2: env: '0b11': YAML reads it as 3"]),
        ("cards: 0x" + "f" * 100_000 + "\n", [":1: cards: '0xfff", "(100004 chars): write a whole number"]),
        ("cards: '2'\n", [":1: cards: expected a whole number, got '2'"]),
        # a nested key given twice: YAML keeps the last
        ("parallel:\n  dp: 1\n  dp: 2\n", [":3: parallel: 'dp' given twice"]),
        ("parallel: {dp: 1, dp: 2}\n", [":1: parallel: 'dp' given twice"]),
        ("env:\n  A: '1'\n  B: '2'\n  A: '3'\n", [":4: env: 'A' given twice"]),
        ("console: ''\n", [":1: --console: empty"]),
        ("job-id: ../../etc\n", [":1: --job-id '../../etc'"]),
        ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", [":1: nested deeper than 32 levels"]),
    ], ids=lambda v: v[:40] if isinstance(v, str) else None)
    def test_refused_naming_file_and_line(self, tmp_path: Path, text: str, needles) -> None:
        config = tmp_path / "job.yaml"
        config.write_text(text)
        _refused(tmp_path, *CPU, "--config", str(config), SCRIPT,
                 needles=tuple(f"{config}{n}" if n.startswith(":") else n for n in needles))
        assert not (tmp_path / "PWNED").exists()

    def test_a_pipe_is_read_and_never_waited_on_without_end(self, tmp_path: Path) -> None:
        """``--config <(...)`` works; a FIFO nobody writes to reads as empty (no hang)."""
        fifo = tmp_path / "job.yaml"
        os.mkfifo(fifo)
        # What a shell's <(...) gives: a pipe its writer had opened, and wrote to, before
        # npu-launch reads. (A writer thread racing the read lost in CI: the FIFO read as empty.)
        held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that the writer's open returns
        try:
            fifo.write_text("cards: 100\n")
            _refused(tmp_path, *CPU, "--config", str(fifo), SCRIPT,
                     needles=(f"{fifo}:1: --cards 100",))
        finally:
            os.close(held)
        result = run_cli_here(*CPU, "--config", str(fifo), "--dry-run", SCRIPT, cwd=tmp_path)
        assert result.returncode == 0, result.stderr

    def test_dates_and_numbers_are_text_where_text_belongs(self, tmp_path: Path) -> None:
        config = tmp_path / "job.yaml"
        config.write_text("job-id: 2026-12-01\nscript_args: [1, 2.5, x]\n")
        result = run_cli_here(*CPU, "--config", str(config), "--dry-run", SCRIPT, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "job 2026-12-01" in result.stdout and "chatty.py 1 2.5 x" in result.stdout


class TestEnvFile:
    """``.npu_launch_env`` goes with a multi-node job: a bad one is refused before any host
    is reached."""

    @pytest.mark.parametrize("content, needle", [
        (b"A=1\n\xff\xfe=2\n", ":2: not UTF-8 text"),
        (b"A=1\n1X=2\n", ":2: expected KEY=VALUE, got '1X=2'"),
        (b"A=1\nB=x\0y\n", ":2: expected KEY=VALUE"),
        (b"# mine\nRANK=5\n", ":2: RANK: npu-launch sets RANK in every rank itself"),
        (b"NPU_LAUNCH_JOB_ID=x\n", ":1: NPU_LAUNCH_JOB_ID: npu-launch sets NPU_LAUNCH_JOB_ID"),
    ])
    def test_bad_env_file(self, tmp_path: Path, content: bytes, needle: str) -> None:
        (tmp_path / ".npu_launch_env").write_bytes(content)
        (tmp_path / "hosts").write_text("localhost slots=1\n")
        _refused(tmp_path, *CPU, "--hostfile", "hosts", "--no-preflight", "--master-addr",
                 "127.0.0.1", "--dry-run", SCRIPT,
                 needles=(f"{tmp_path / '.npu_launch_env'}{needle}",))

    def test_env_file_of_a_megabyte_line(self, tmp_path: Path) -> None:
        (tmp_path / ".npu_launch_env").write_bytes(b"A=" + b"x" * (2 << 20) + b"\n")
        (tmp_path / "hosts").write_text("localhost slots=1\n")
        _refused(tmp_path, *CPU, "--hostfile", "hosts", "--no-preflight", "--master-addr",
                 "127.0.0.1", "--dry-run", SCRIPT, needles=("larger than 1024 KiB",))


def test_node_0s_own_variables_do_not_override_what_the_plan_sets(tmp_path: Path) -> None:
    """Node 0's environment travels to the other hosts, but every rank's own identity is the
    plan's: a ``RANK`` or an outer launch's ``NPU_LAUNCH_TOKEN`` gave every rank the same one."""
    (tmp_path / "hosts").write_text("n1 slots=1\nn2 slots=1\n")
    env = {**os.environ, "RANK": "7", "NPU_LAUNCH_JOB_ID": "outer", "NPU_LAUNCH_TOKEN": "outer",
           "NPU_LAUNCH_HOST": "outer"}
    result = subprocess.run(npu_launch_argv(*CPU, "--hostfile", "hosts", "--no-preflight",
                                            "--master-addr", "127.0.0.1", "--dry-run", "--json",
                                            SCRIPT), cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    ranks = json.loads(result.stdout)["ranks"]
    assert [(r["env"]["RANK"], r["env"]["NPU_LAUNCH_HOST"]) for r in ranks] == [("0", "n1"),
                                                                               ("1", "n2")]
    assert {r["env"]["NPU_LAUNCH_JOB_ID"] for r in ranks} != {"outer"}
    assert "outer" not in {r["env"]["NPU_LAUNCH_TOKEN"] for r in ranks}


def test_a_working_directory_removed_under_the_shell(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    launcher = " ".join(f"'{w}'" for w in npu_launch_argv(*CPU, "--dry-run", SCRIPT))
    result = subprocess.run(["sh", "-c", f"cd '{gone}' && rmdir '{gone}' && exec {launcher}"],
                            capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, "the working directory no longer exists")
