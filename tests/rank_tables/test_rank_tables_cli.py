"""The ``rank-table`` click group: each subcommand through CliRunner, and the module run as a program."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from helpers import ASCEND_FIXTURES, REPO, fake_ascend_env
from helpers import RANK_TABLE_EXAMPLES as EXAMPLES

from launcher.cli.rank_table import rank_table

A2_CONF = ASCEND_FIXTURES / "a2_host" / "hccn.conf"


def invoke(args: list, env: dict | None = None) -> Result:
    return CliRunner().invoke(rank_table, [str(a) for a in args], env=env)


def broken_copy(directory: Path) -> Path:
    doc = json.loads((EXAMPLES / "rank_table_2x8_v1.0.json").read_text(encoding="utf-8"))
    doc["server_list"][1]["device"][3]["rank_id"] = 11
    doc["server_list"][1]["device"][4]["rank_id"] = "4"
    path = directory / "bad table.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_the_group_and_its_commands() -> None:
    assert isinstance(rank_table, click.Group) and rank_table.name == "rank-table"
    assert set(rank_table.commands) == {"generate", "merge", "validate", "show", "from-hostfile"}


def test_validate_a_good_table() -> None:
    result = invoke(["validate", EXAMPLES / "rank_table_superpod_v1.2.json"])
    assert result.exit_code == 0
    assert result.output.endswith("rank_table_superpod_v1.2.json: valid rank table v1.2, 4 server(s), 16 rank(s)\n")


def test_validate_reports_every_problem_with_its_path_and_exits_2(weird_tmp: Path) -> None:
    bad = broken_copy(weird_tmp)
    result = invoke(["validate", EXAMPLES / "rank_table_1x8_v1.0.json", bad])
    assert result.exit_code == 2
    assert "rank_table_1x8_v1.0.json: valid rank table v1.0" in result.stdout
    assert result.stdout.splitlines()[1:] == [
        f'{bad}: server_list[1].device[3].rank_id: must be a string ("11"), got the number 11',
        f"{bad}: server_list[1].device[4].rank_id: rank 4 is already server_list[0].device[4]",
    ]
    assert result.stderr.splitlines() == [
        f'Error: {bad}: server_list[1].device[3].rank_id: must be a string ("11"), got the number 11 '
        "(2 problems in all, listed above)"]


def test_show_prints_rank_server_device_ip() -> None:
    result = invoke(["show", EXAMPLES / "rank_table_1x8_v1.0.json"])
    assert result.exit_code == 0
    assert result.output.splitlines()[:4] == [
        "rank table v1.0: 1 server(s), 8 rank(s)",
        "rank  server     device  device_ip",
        "0     10.0.0.11  0       192.1.10.6",
        "1     10.0.0.11  1       192.2.10.6",
    ]


def test_show_refuses_an_invalid_table(weird_tmp: Path) -> None:
    result = invoke(["show", broken_copy(weird_tmp)])
    assert result.exit_code == 2 and "server_list[1].device[3].rank_id" in result.stderr


def test_merge_to_stdout_and_the_same_server_twice(weird_tmp: Path) -> None:
    result = invoke(["merge", EXAMPLES / "rank_table_1x8_v1.0.json", "-o", "-"])
    assert result.exit_code == 0 and json.loads(result.stdout)["server_count"] == "1"
    one = EXAMPLES / "rank_table_1x8_v1.0.json"
    result = invoke(["merge", one, EXAMPLES / "rank_table_2x8_v1.0.json", "-o", weird_tmp / "out.json"])
    assert result.exit_code == 2
    assert result.stderr == f"Error: {EXAMPLES / 'rank_table_2x8_v1.0.json'}: server '10.0.0.11' is already in {one}\n"
    assert not (weird_tmp / "out.json").exists()


def test_merge_refuses_a_table_written_by_merge_hccl(weird_tmp: Path) -> None:
    result = invoke(["merge", broken_copy(weird_tmp), "-o", "-"])
    assert result.exit_code == 2 and 'must be a string ("11")' in result.stderr


def test_from_hostfile_errors_name_the_host(weird_tmp: Path) -> None:
    hosts = weird_tmp / "host file"
    hosts.write_text("10.0.0.11 slots=8\n10.0.0.12 slots=8\n", encoding="utf-8")
    result = invoke(["from-hostfile", hosts, "--hccn-conf", f"10.0.0.11={A2_CONF}", "-o", "-"])
    assert result.exit_code == 2
    assert "no device IPs for host '10.0.0.12': pass --hccn-conf 10.0.0.12=PATH" in result.stderr
    result = invoke(["from-hostfile", hosts, "--hccn-conf", f"node9={A2_CONF}"])
    assert result.exit_code == 2 and f"--hccn-conf node9: not a host in {hosts}" in result.stderr
    result = invoke(["from-hostfile", weird_tmp / "none"])
    assert result.exit_code == 2 and "cannot read the hostfile" in result.stderr


def test_from_hostfile_with_nnodes_to_stdout(weird_tmp: Path) -> None:
    hosts = weird_tmp / "hosts"
    hosts.write_text("10.0.0.11 slots=4\n10.0.0.12 slots=8\n", encoding="utf-8")
    result = invoke(["from-hostfile", hosts, "--hccn-conf", f"10.0.0.11={A2_CONF}", "--nnodes", "1",
                     "--device-port", "16667", "-o", "-"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [s["server_id"] for s in doc["server_list"]] == ["10.0.0.11"]
    assert [d["device_port"] for d in doc["server_list"][0]["device"]] == ["16667"] * 4


def test_generate_to_stdout_reports_where_ips_came_from(weird_tmp: Path) -> None:
    result = invoke(["generate", "--server-id", "10.0.0.11", "--devices", "0,2", "--device-ip", "2=10.9.9.2",
                     "-o", "-"], env=fake_ascend_env(weird_tmp, range(8)))
    assert result.exit_code == 0, result.output
    devices = json.loads(result.stdout)["server_list"][0]["device"]
    assert [(d["device_id"], d["device_ip"]) for d in devices] == [("0", "192.1.10.6"), ("2", "10.9.9.2")]
    assert result.stderr.splitlines() == ["device IPs of device(s) 0 from hccn_tool",
                                          "device IPs of device(s) 2 from --device-ip"]


@pytest.mark.parametrize("args, words", [
    (["--devices", "0-99"], "--devices '0-99': 99 is out of range 0-15"),
    (["--devices", "0-9"], "--devices: logical id(s) 8,9 out of range"),
    (["--devices", "x"], "--devices 'x': expected ids like 0-7"),
    (["--super-pod-id", "1"], "--super-pod-id: only for --format 1.2"),
    (["--format", "1.2", "--super-device-id", "0=x", "--super-pod-id", "1"], "--super-device-id 0=x: the value"),
    (["--device-ip", "zero=1.1.1.1"], "--device-ip 'zero=1.1.1.1': expected N=VALUE"),
    (["--server-id", " "], "--server-id: empty (leave the option out for its default)"),
])
def test_generate_bad_input_exits_2(weird_tmp: Path, args: list, words: str) -> None:
    result = invoke(["generate", "--server-id", "h", *args], env=fake_ascend_env(weird_tmp, range(8)))
    assert result.exit_code == 2 and words in result.stderr, result.output


def test_generate_default_output_file_in_the_working_directory(weird_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = fake_ascend_env(weird_tmp, range(4))
    monkeypatch.chdir(weird_tmp)
    result = invoke(["generate", "--server-id", "10.0.0.11", "--devices", "[2,4)"], env=env)
    assert result.exit_code == 0
    assert "wrote hccl_2p_23_10.0.0.11.json: 1 server(s), 2 rank(s)" in result.stderr
    assert json.loads((weird_tmp / "hccl_2p_23_10.0.0.11.json").read_text())["server_list"][0]["device"][1] == {
        "device_id": "3", "device_ip": "192.4.10.6", "rank_id": "1"}


def test_generate_to_a_fifo_nobody_reads_is_refused_and_one_read_is_written(
        weird_tmp: Path) -> None:
    """``-o FIFO`` blocked the open for ever when no reader came; a reader gets the table."""
    env = fake_ascend_env(weird_tmp, range(4))
    fifo = weird_tmp / "table.json"
    os.mkfifo(fifo)
    args = ["generate", "--server-id", "10.0.0.11", "--devices", "0", "-o", fifo]
    result = invoke(args, env=env)
    assert result.exit_code == 2 and f"{fifo}: cannot write: a pipe nobody reads" in \
        result.stderr, result.output
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        written = None
        for _ in range(100):  # until cat has opened its end
            written = invoke(args, env=env)
            if written.exit_code == 0:
                break
            time.sleep(0.05)
        assert written is not None and written.exit_code == 0, written.output if written else ""
        out, _ = reader.communicate(timeout=10)
    finally:
        reader.kill()
    assert json.loads(out)["server_list"][0]["server_id"] == "10.0.0.11"


def run_module(args: list, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli.rank_table", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, **(env or {})}, check=False)


def test_the_module_runs_as_a_program(weird_tmp: Path) -> None:
    bad = broken_copy(weird_tmp)
    done = run_module(["validate", bad])
    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        f'{bad}: server_list[1].device[3].rank_id: must be a string ("11"), got the number 11',
        f"{bad}: server_list[1].device[4].rank_id: rank 4 is already server_list[0].device[4]",
    ]
    assert done.stderr.splitlines() == [
        f'Error: {bad}: server_list[1].device[3].rank_id: must be a string ("11"), got the number 11 '
        "(2 problems in all, listed above)"]
    done = run_module(["generate", "--server-id", "10.0.0.11", "-o", "-"], env=fake_ascend_env(weird_tmp, range(2)))
    assert done.returncode == 0, done.stderr
    assert [d["device_ip"] for d in json.loads(done.stdout)["server_list"][0]["device"]] == ["192.1.10.6", "192.2.10.6"]


def test_importing_every_module_does_nothing_and_never_loads_mindspore() -> None:
    names = ["rank_tables", "launcher.config.hostfile"] + [f"rank_tables.{p.stem}" for p in (REPO / "rank_tables").glob("*.py")
                                                   if p.stem != "__init__"]
    code = (f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\n"
            "print('mindspore' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert (done.stdout, done.stderr) == ("False\n", "")
