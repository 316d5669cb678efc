"""Options, config files and bad input: one line, exit code 2, nothing started."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, assert_one_line_error, fake_devfs, run_cli_here, run_launcher

SCRIPT = str(RANK_SCRIPTS / "chatty.py")


@pytest.mark.parametrize("args, needles", [
    (["--device", "cpu", "missing.py"], ["missing.py", "no such file"]),
    (["--device", "cpu", "--cards", "0", SCRIPT], ["--cards 0"]),
    (["--device", "cpu"], ["no script"]),
    (["--device", "cpu", "--no-such-option", SCRIPT], ["--no-such-option"]),
    (["--device", "cpu", "--console", "zero", SCRIPT], ["--console zero"]),
    (["--device", "cpu", "--env", "NOEQUALS", SCRIPT], ["--env", "NOEQUALS"]),
    (["--device", "cpu", "--env", "1X=1", SCRIPT], ["--env '1X'", "not a variable name"]),
    (["--device", "cpu", "--env", "RANK=3", SCRIPT], ["--env RANK", "from --cards"]),
    (["--device", "cpu", "--env", "MS_SCHED_PORT=1", SCRIPT], ["--env MS_SCHED_PORT", "--master-port"]),
    (["--device", "cpu", "--env", "MASTER_ADDR=h", SCRIPT], ["--env MASTER_ADDR", "--master-addr"]),
    (["--device", "cpu", "--env", "NPU_LAUNCH_TOKEN=x", SCRIPT], ["--env NPU_LAUNCH_TOKEN", "itself"]),
    (["--device", "cpu", "--debug", "--cards", "2", SCRIPT], ["--debug", "--cards 2"]),
    (["--device", "npu", "--cards", "2", SCRIPT], ["--device npu", "no Ascend cards"]),
    (["--device", "cpu", "--no-checkpoint-collect", SCRIPT],
     ["--no-checkpoint-collect", "starts no node agents"]),
])
def test_bad_options_are_one_line_exit_2(weird_tmp: Path, args, needles) -> None:
    result = run_cli_here(*args, "--log-dir", str(weird_tmp / "logs"), cwd=weird_tmp)
    assert_one_line_error(result, *needles)
    assert not (weird_tmp / "logs").exists(), "a refused launch must not create its log dir"


def test_master_port_in_use(weird_tmp: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_launcher("--device", "cpu", "--cards", "2", "--master-port", str(port),
                              "--log-dir", str(weird_tmp / "logs"), SCRIPT)
    assert_one_line_error(result, f"--master-port {port}", "already in use")
    assert not (weird_tmp / "logs").exists()


def test_more_cards_than_devices(weird_tmp: Path) -> None:
    devfs = fake_devfs(weird_tmp / "dev", (0, 1, 10, 11))  # two-digit ids too
    env = {**os.environ, "NPU_LAUNCH_DEVFS": str(devfs)}
    result = run_launcher("--device", "npu", "--cards", "5", SCRIPT, env=env)
    assert_one_line_error(result, "--cards 5", "4 Ascend card(s) (0,1,10,11)")
    env["ASCEND_RT_VISIBLE_DEVICES"] = "1,10"
    result = run_launcher("--device", "npu", "--cards", "3", SCRIPT, env=env)
    assert_one_line_error(result, "--cards 3", "2 Ascend card(s) (1,10)")
    result = run_launcher("--device", "auto", "--dry-run", "--json", SCRIPT, env=env)
    plan = json.loads(result.stdout)
    assert "found 2 Ascend card(s)" in result.stderr
    assert [r["env"]["DEVICE_ID"] for r in plan["ranks"]] == ["0", "1"]
    assert plan["device"] == "npu"


@pytest.mark.parametrize("text, line, words", [
    ("cards: 2\n# a comment\nkill-timeout: 3\nshards: 4\ndevice: cpu\n", 4, "unknown key 'shards'"),
    ("cards: 2\ndevice: cpu\nenv: [A=1\nconsole: all\n", 4, "invalid YAML"),
    ("device: cpu\ncards: many\n", 2, "cards"),
    ("device: cpu\ncheckpoint-collect: false\n", 2, "--no-checkpoint-collect: this job starts no"),
    ("device: cpu\nhostfile: 5\n", 2, ": 5: cannot read the hostfile: No such file"),
], ids=["unknown key", "invalid yaml", "bad value", "a flag's off form", "a hostfile it names"])
def test_a_bad_config_file_names_its_line(weird_tmp: Path, text: str, line: int, words: str) -> None:
    cfg = weird_tmp / "job.yaml"
    cfg.write_text(text)
    result = run_launcher("--config", str(cfg), "--log-dir", str(weird_tmp / "logs"), SCRIPT)
    assert_one_line_error(result, f"{cfg}:{line}:", words)
    assert not (weird_tmp / "logs").exists()


BILLION_LAUGHS = "device: cpu\nenv:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  {name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("content, words", [
    (BILLION_LAUGHS.encode(), ":4: YAML alias *a"),
    (b"device: cpu\nscript_args: [&x 1, *x]\n", ":2: YAML alias *x"),
    (b"device: cpu\ncards: \xff\n", ":2: not UTF-8 text"),
    (b"# " + b"x" * (1 << 20) + b"\n", "larger than 1024 KiB"),
], ids=["alias bomb", "any alias", "not utf-8", "too large"])
def test_a_hostile_config_file_is_refused_at_once(weird_tmp: Path, content: bytes, words: str) -> None:
    cfg = weird_tmp / "job.yaml"
    cfg.write_bytes(content)
    result = run_launcher("--config", str(cfg), "--log-dir", str(weird_tmp / "logs"), SCRIPT,
                          timeout=60)
    assert_one_line_error(result, str(cfg), words)
    assert not (weird_tmp / "logs").exists()


@pytest.mark.parametrize("text, line, words", [
    ('device: cpu\nenv: {A: "\\ud800"}\n', 2, "env: '\\ud800': the escape \\ud800 is a lone surrogate"),
    ('device: cpu\nenv:\n  B: ok\n  A: "x\\udcff"\n', 4, "env: 'x\\udcff': the escape \\udcff"),
    ('env: {"\\ud800": x}\n', 1, "env: '\\ud800'"),
    ('script: "\\ud800"\n', 1, "script: '\\ud800'"),
    ('script_args: [a, "\\ud800"]\n', 1, "script_args: '\\ud800'"),
    ('log_dir: "\\ud800"\n', 1, "log_dir: '\\ud800'"),
    ('hostfile: "\\ud800"\n', 1, "hostfile: '\\ud800'"),
    ('rank-table: "\\ud800"\n', 1, "rank_table: '\\ud800'"),
], ids=["env value", "env value, its line", "env name", "script", "script_args", "log_dir", "hostfile",
        "rank_table"])
def test_a_lone_surrogate_escape_is_refused_on_its_line(weird_tmp: Path, text: str, line: int,
                                                        words: str) -> None:
    """YAML's "\\ud800" is no character: no file name, argument or variable can hold it."""
    cfg = weird_tmp / "job.yaml"
    cfg.write_text(text)
    result = run_launcher("--config", str(cfg), "--device", "cpu", "--dry-run", "--log-dir",
                          str(weird_tmp / "logs"), SCRIPT)
    assert_one_line_error(result, f"{cfg}:{line}: {words}", "not a character")
    assert not (weird_tmp / "logs").exists()


def test_config_from_dev_zero_is_refused() -> None:
    result = run_launcher("--config", "/dev/zero", SCRIPT, timeout=60)
    assert_one_line_error(result, "--config /dev/zero: larger than 1024 KiB")


def test_config_file_values_and_flags_win(weird_tmp: Path) -> None:
    cfg = weird_tmp / "job.yaml"
    cfg.write_text(f"device: cpu\ncards: 3\nkill_timeout: 7\nmaster-port: 45678\n"
                   f"env: {{FOO: 'a b;c'}}\nscript: {json.dumps(SCRIPT)}\n"
                   "script_args: [--lines, 5]\n")
    result = run_launcher("--config", str(cfg), "--cards", "2", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert len(plan["ranks"]) == 2  # the flag beat the file's 3
    assert plan["master_port"] == 45678
    assert plan["ranks"][0]["env"]["FOO"] == "a b;c"
    assert plan["ranks"][0]["argv"][1:] == [SCRIPT, "--lines", "5"]


def test_dry_run_prints_plan_and_starts_nothing(weird_tmp: Path) -> None:
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "cpu", "--cards", "2", "--job-id", "j1", "--log-dir",
                          str(logs), "--dry-run", SCRIPT, "--code", "3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "job j1: 2 rank(s) on 1 node(s), dynamic-cluster mode, device cpu" in out
    assert "scheduler" in out and "rank 0" in out and "rank 1" in out
    assert "MS_ROLE=MS_WORKER" in out and "MS_ROLE=MS_SCHED" in out
    assert f"log {logs}/rank_1.log" in out
    assert "--code 3" in out
    assert not logs.exists()


def test_parallel_layout_is_checked_before_anything_starts(weird_tmp: Path) -> None:
    result = run_launcher("--device", "cpu", "--cards", "4", "--dp", "3", "--log-dir",
                          str(weird_tmp / "logs"), SCRIPT)
    assert_one_line_error(result, "dp*mp*pp = 3*1*1 = 3 != world size 4")
    assert not (weird_tmp / "logs").exists()
    result = run_launcher("--device", "cpu", "--cards", "4", "--parallel", "semi", "--pp", "2",
                          "--micro-batches", "1", "--log-dir", str(weird_tmp / "logs"), SCRIPT)
    assert_one_line_error(result, "micro_batches 1 < pp 2")
    assert not (weird_tmp / "logs").exists()


def test_parallel_section_of_config_file_and_flags_over_it(weird_tmp: Path) -> None:
    cfg = weird_tmp / "job.yaml"
    cfg.write_text("device: cpu\ncards: 4\nparallel:\n  mode: semi\n  mp: 2\n  seed: 7\n")
    result = run_launcher("--config", str(cfg), "--seed", "9", "--dry-run", "--json", SCRIPT)
    assert result.returncode == 0, result.stderr
    parallel = json.loads(json.loads(result.stdout)["ranks"][0]["env"]["NPU_LAUNCH_PARALLEL"])
    assert (parallel["mode"], parallel["dp"], parallel["mp"], parallel["seed"]) == ("semi", 2, 2, 9)
    cfg.write_text("device: cpu\ncards: 2\nparallel:\n  mode: data\n  shards: 2\n")
    assert_one_line_error(run_launcher("--config", str(cfg), SCRIPT), f"{cfg}:5: parallel: unknown key "
                    "'shards'")
