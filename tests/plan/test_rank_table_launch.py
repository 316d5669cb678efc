"""Rank-table mode: every process gets the RANK_ID/DEVICE_ID the HCCL table assigns to this
server, checked from inside the ranks; disagreements are refused before anything starts."""
from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import assert_no_job_processes, fake_ascend_env, fake_devfs, run_launcher

TABLE = {"version": "1.0", "server_count": "2", "status": "completed", "server_list": [
    {"server_id": "10.1.0.1", "host_nic_ip": "reserve", "device": [
        {"device_id": "0", "device_ip": "192.98.92.100", "rank_id": "0"},
        {"device_id": "1", "device_ip": "192.98.93.100", "rank_id": "1"}]},
    {"server_id": "10.1.0.2", "host_nic_ip": "reserve", "device": [
        {"device_id": "6", "device_ip": "192.98.92.101", "rank_id": "2"},
        {"device_id": "7", "device_ip": "192.98.93.101", "rank_id": "3"}]}]}
SHOW = ("import json, os, sys\n"
        "keys = ('RANK_ID', 'DEVICE_ID', 'RANK_SIZE', 'RANK_TABLE_FILE', 'MS_ROLE', 'RANK')\n"
        "path = os.path.join(sys.argv[1], 'seen_' + os.environ['RANK_ID'] + '.json')\n"
        "json.dump({k: os.environ.get(k) for k in keys}, open(path, 'w'))\n")


def _setup(tmp: Path) -> tuple[Path, Path]:
    table, script = tmp / "cluster table.json", tmp / "show.py"
    table.write_text(json.dumps(TABLE))
    script.write_text(SHOW)
    return table, script


def test_each_process_gets_what_the_table_assigns(weird_tmp: Path) -> None:
    table, script = _setup(weird_tmp)
    result = run_launcher("--device", "cpu", "--rank-table", str(table), "--server-id", "10.1.0.2",
                          "--job-id", "rt-job", "--log-dir", str(weird_tmp / "logs"),
                          str(script), str(weird_tmp))
    assert result.returncode == 0, result.stderr
    seen = {r: json.loads((weird_tmp / f"seen_{r}.json").read_text()) for r in (2, 3)}
    for rank, device in ((2, "6"), (3, "7")):
        assert seen[rank] == {"RANK_ID": str(rank), "DEVICE_ID": device, "RANK_SIZE": "4",
                              "RANK_TABLE_FILE": str(table), "MS_ROLE": None, "RANK": str(rank)}
    assert not (weird_tmp / "logs" / "scheduler.log").exists()
    assert_no_job_processes("rt-job")


def test_table_and_launch_must_agree(weird_tmp: Path) -> None:
    table, script = _setup(weird_tmp)
    cases = [
        (["--server-id", "10.9.9.9"], "server '10.9.9.9' (this host) is not in the table"),
        ([], "this host is not in the table (servers: 10.1.0.1, 10.1.0.2); give --server-id"),
        (["--server-id", "10.1.0.2", "--cards", "3"], "--cards 3: the rank table gives server "
         "10.1.0.2 2 device(s)"),
    ]
    for extra, message in cases:
        result = run_launcher("--device", "cpu", "--rank-table", str(table), *extra,
                              "--log-dir", str(weird_tmp / "logs"), str(script), str(weird_tmp))
        assert result.returncode == 2 and message in result.stderr, (extra, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (weird_tmp / "logs").exists()


def test_npu_devices_the_host_lacks_are_refused(weird_tmp: Path) -> None:
    table, script = _setup(weird_tmp)
    env = {**os.environ, "NPU_LAUNCH_DEVFS": str(fake_devfs(weird_tmp / "dev", range(4)))}
    result = run_launcher("--device", "npu", "--rank-table", str(table), "--server-id",
                          "10.1.0.2", str(script), env=env)
    assert result.returncode == 2
    assert "server 10.1.0.2 device 6 is not on this host (cards: 0, 1, 2, 3)" in result.stderr


def test_unreadable_or_invalid_table(weird_tmp: Path) -> None:
    table, script = _setup(weird_tmp)
    result = run_launcher("--device", "cpu", "--rank-table", str(weird_tmp / "missing.json"),
                          str(script))
    assert result.returncode == 2 and "missing.json" in result.stderr
    bad = dict(TABLE, server_count="3")
    table.write_text(json.dumps(bad))
    result = run_launcher("--device", "cpu", "--rank-table", str(table), "--server-id",
                          "10.1.0.2", str(script))
    assert result.returncode == 2 and "server_count" in result.stderr, result.stderr


def test_auto_generates_this_hosts_table(weird_tmp: Path) -> None:
    _, script = _setup(weird_tmp)
    env = {**os.environ, **fake_ascend_env(weird_tmp, range(4))}
    logs = weird_tmp / "logs"
    result = run_launcher("--device", "npu", "--cards", "2", "--rank-table", "auto",
                          "--server-id", "10.0.0.5", "--log-dir", str(logs), str(script),
                          str(weird_tmp), env=env)
    assert result.returncode == 0, result.stderr
    generated = json.loads((logs / "rank_table.json").read_text())
    assert [d["device_id"] for d in generated["server_list"][0]["device"]] == ["0", "1"]
    for rank in (0, 1):
        seen = json.loads((weird_tmp / f"seen_{rank}.json").read_text())
        assert seen["RANK_TABLE_FILE"] == str(logs / "rank_table.json")
        assert seen["DEVICE_ID"] == str(rank) and seen["RANK_SIZE"] == "2"
