"""Hostile rank tables and ``rank-table`` options through the CLI's ``main``, in this process
(``helpers.run_cli_here``; a standard output it cannot write runs npu-launch as a process).

Each bad input must end in exit 2 and one line ``npu-launch: error: ...`` that names the file and
the place (``line:column`` or the JSON path) or the option, within a few seconds, without a
traceback and without echoing a huge value; ``--rank-table`` with such a file must start
nothing and create no log directory.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable, Union

import pytest
from helpers import (
    RANK_TABLE_EXAMPLES,
    assert_one_line_error,
    fake_ascend_env,
    npu_launch_argv,
    run_cli_here,
    sparse,
    to_dev_zero,
)

TIMEOUT_S = 60
"""Far above the second or so each case takes: only a hang reaches it."""
LONGEST_LINE = 600
"""An error line echoes no value in full: 80 characters of it at most, plus the path."""

Content = Union[str, bytes, Callable[[Path], None]]


def example() -> dict:
    return json.loads((RANK_TABLE_EXAMPLES / "rank_table_1x8_v1.0.json").read_text(encoding="utf-8"))


def changed(change: Callable[[dict], None]) -> str:
    doc = example()
    change(doc)
    return json.dumps(doc)


def device(doc: dict) -> dict:
    return doc["server_list"][0]["device"][0]


def text_of(doc_text: str, **replace: str) -> str:
    for old, new in replace.items():
        doc_text = doc_text.replace(old, new)
    return doc_text


def directory(path: Path) -> None:
    path.mkdir()


SERVER_COUNT = '"server_count": "1"'

# name: (file content, words the error line must hold; "{f}" is the file's path)
TABLES: dict[str, tuple[Content, tuple[str, ...]]] = {
    "/dev/zero": (to_dev_zero, ("{f}: a rank table may be at most 16 MiB",)),
    "a directory": (directory, ("{f}: cannot read the rank table: Is a directory",)),
    "larger than 16 MiB": (sparse(17 << 20), ("{f}: a rank table may be at most 16 MiB; this one is 17.0 MiB",)),
    "not UTF-8": (b'{"version": "1.0",\n "x": "\xff"}', ("{f}:2:8: not UTF-8 text (byte 0xff)",)),
    "empty": ("", ("{f}:1:1: not valid JSON: Expecting value",)),
    "invalid JSON": ('{"version": "1.0",\n "x": }', ("{f}:2:7: not valid JSON: Expecting value",)),
    "multi-megabyte line, invalid": ('{"a": "' + "x" * 5_000_000 + '"', ("{f}:1:5000009: not valid JSON",)),
    "multi-megabyte line, valid": (changed(lambda d: d["server_list"][0].update(server_id="s" * 5_000_000)),
                                   ("{f}: server_list[0].server_id: must be at most 64 characters, got 5000000",)),
    "nested 100,000 deep": ("[" * 100_000 + "]" * 100_000, ("{f}:1:33: nested deeper than the 32 levels accepted",)),
    "nested 40 deep in an extra key": (
        text_of(changed(lambda d: d.update(extra="@")), **{'"@"': "[" * 40 + "]" * 40}),
        ("nested deeper than the 32 levels accepted",)),
    "a number of 5000 digits": (text_of(changed(lambda d: None), **{SERVER_COUNT: '"server_count": ' + "1" * 5000}),
                                ("{f}: server_count: a number of 5000 digits; at most 32 are accepted",)),
    "a string of 5000 digits": (changed(lambda d: device(d).update(device_id="9" * 5000)), (
        "{f}: server_list[0].device[0].device_id: must be a whole number of at most 12 digits", "(5000 chars)")),
    "a float where an int belongs": (changed(lambda d: device(d).update(device_id=1.5)),
                                     ("server_list[0].device[0].device_id: must be a string, got the number 1.5",)),
    "an int where a string belongs": (changed(lambda d: device(d).update(device_id=0)),
                                      ('server_list[0].device[0].device_id: must be a string ("0")',)),
    "NaN": (text_of(changed(lambda d: None), **{SERVER_COUNT: '"server_count": NaN'}),
            ("{f}: server_count: not a finite number",)),
    "Infinity in an extra key": (text_of(changed(lambda d: d.update(extra="@")), **{'"@"': "-Infinity"}),
                                 ("{f}: extra: not a finite number",)),
    "1e999": (text_of(changed(lambda d: d.update(extra="@")), **{'"@"': "1e999"}), ("{f}: extra: not a finite number",)),
    "a huge device id": (changed(lambda d: device(d).update(device_id="99999999999")), (
        "server_list[0].device[0].device_id: 99999999999 is out of range 0-15",)),
    "a huge rank id": (changed(lambda d: device(d).update(rank_id="999999999999")), (
        "server_list[0].device[0].rank_id: rank 999999999999 is out of range 0-7",)),
    "unicode digits": (changed(lambda d: device(d).update(device_id="\u00b2")),
                       ("server_list[0].device[0].device_id: must be a whole number",)),
    "a 5 MB device ip": (changed(lambda d: device(d).update(device_ip="x" * 5_000_000)),
                         ("server_list[0].device[0].device_ip:", "...(5000000 chars) is not an IPv4 or IPv6 address")),
    "version 9.9": (changed(lambda d: d.update(version=9.9)),
                    ('{f}: version: must be "1.0" or "1.2" (a string), got the number 9.9',)),
    'version "9.9"': (changed(lambda d: d.update(version="9.9")), ('{f}: version: must be "1.0" or "1.2", got "9.9"',)),
    "a list": ("[1, 2]", ("{f}: $: must be an object, got a list",)),
    "a list where the servers belong": (changed(lambda d: d.update(server_list={"a": 1})),
                                        ("server_list: must be a list, got an object",)),
}


def super_pod_with_a_list_as_server_id() -> str:
    doc = json.loads((RANK_TABLE_EXAMPLES / "rank_table_superpod_v1.2.json").read_text(encoding="utf-8"))
    doc["server_list"][0]["server_id"] = ["10.0.0.1"]
    return json.dumps(doc)


TABLES["v1.2, a list as server_id"] = (super_pod_with_a_list_as_server_id(),
                                       ("server_list[0].server_id: must be a string, got a list",))
# JSON's "\ud800" escape reads as a lone surrogate: no character, so nothing can print or send it.
TABLES["a lone surrogate as server_id"] = (
    changed(lambda d: d["server_list"][0].update(server_id="\ud800")),
    ('{f}: server_list[0].server_id: must be UTF-8 text, got "\\ud800" (a lone surrogate escape)',))
# json keeps the last of two equal keys without a word: a v1.0 table would read as v1.2.
TABLES["a version given twice"] = (
    text_of(changed(lambda d: None), **{'"version": "1.0"': '"version": "1.0", "version": "1.2"'}),
    ("{f}: version: given twice in one object (the last would win without a word)",))
TABLES["a rank_id given twice in one device"] = (
    text_of(changed(lambda d: device(d).update(rank_id="@")), **{'"rank_id": "@"': '"rank_id": "0", "rank_id": "7"'}),
    ("{f}: server_list[0].device[0].rank_id: given twice in one object",))
TABLES["a lone surrogate as an extra key"] = (
    changed(lambda d: device(d).update({"x\udcff": "1"})),
    ('{f}: server_list[0].device[0]: the key "x\\udcff" is not UTF-8 text (a lone surrogate escape)',))


def write(path: Path, content: Content) -> Path:
    if callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """npu-launch ``args`` with ``env`` over this environment."""
    return run_cli_here(*args, cwd=cwd, env={**os.environ, **(env or {})}, guard=TIMEOUT_S)


def assert_refused(result: subprocess.CompletedProcess, *words: str) -> str:
    """The bad-input rule (``assert_one_line_error``), with the line's length bounded."""
    line = assert_one_line_error(result, *words)
    assert len(line) <= LONGEST_LINE, line
    return line


@pytest.fixture
def table_file(request: pytest.FixtureRequest, weird_tmp: Path) -> tuple[Path, tuple[str, ...]]:
    content, words = TABLES[request.param]
    path = write(weird_tmp / "rank table.json", content)
    return path, tuple(w.replace("{f}", str(path)) for w in words)


@pytest.mark.parametrize("table_file", list(TABLES), indirect=True)
def test_rank_table_validate_refuses_in_one_line(table_file: tuple[Path, tuple[str, ...]]) -> None:
    path, words = table_file
    assert_refused(run("rank-table", "validate", str(path), cwd=path.parent), *words)


@pytest.mark.parametrize("table_file", list(TABLES), indirect=True)
def test_launch_with_a_hostile_rank_table_starts_nothing(table_file: tuple[Path, tuple[str, ...]]) -> None:
    path, words = table_file
    script = path.parent / "train.py"
    script.write_text("print('ran')\n", encoding="utf-8")
    result = run("--rank-table", str(path), "--server-id", "10.0.0.11", "--device", "cpu", "--dry-run",
                 str(script), cwd=path.parent)
    assert_refused(result, *words)
    assert "ran" not in result.stdout
    assert not (path.parent / "npu_launch_logs").exists()


@pytest.mark.parametrize("name", ["/dev/zero", "nested 100,000 deep", "a number of 5000 digits", "version 9.9",
                                  "a lone surrogate as server_id"])
@pytest.mark.parametrize("command", [["show"], ["merge", "-o", "-"]])
def test_show_and_merge_refuse_in_one_line(weird_tmp: Path, name: str, command: list[str]) -> None:
    content, words = TABLES[name]
    path = write(weird_tmp / "t.json", content)
    assert_refused(run("rank-table", command[0], str(path), *command[1:], cwd=weird_tmp),
                   *(w.replace("{f}", str(path)) for w in words))


@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
@pytest.mark.parametrize("command", [["show"], ["merge", "-o", "-"], ["validate"]])
def test_show_and_merge_to_an_unwritable_stdout_are_one_line(weird_tmp: Path, command: list[str],
                                                            stdout: str) -> None:
    table = str(RANK_TABLE_EXAMPLES / "rank_table_1x8_v1.0.json")
    argv = npu_launch_argv("rank-table", command[0], table, *command[1:])
    with open(os.devnull if stdout == "closed" else stdout, "wb") as out:
        result = subprocess.run(argv, cwd=weird_tmp, stdout=out, stderr=subprocess.PIPE, text=True,
                                timeout=TIMEOUT_S, preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None)
    why = "it is closed" if stdout == "closed" else "No space left on device"
    what = "the result" if command == ["validate"] else "the table"
    assert_refused(result, f"npu-launch: error: cannot write {what} to standard output: {why}")


def test_several_problems_are_one_error_line_and_listed_on_stdout(weird_tmp: Path) -> None:
    doc = example()
    device(doc)["device_id"] = "99"
    doc["server_list"][0]["device"][1]["device_ip"] = "x" * 100_000
    path = write(weird_tmp / "two.json", json.dumps(doc))
    result = run("rank-table", "validate", str(path), cwd=weird_tmp)
    assert_refused(result, f"{path}: server_list[0].device[0].device_id: 99 is out of range 0-15",
                   "(2 problems in all, listed above)")
    assert [line.split(": ")[1] for line in result.stdout.splitlines()] == [
        "server_list[0].device[0].device_id", "server_list[0].device[1].device_ip"]


def test_the_examples_still_validate_and_launch(weird_tmp: Path) -> None:
    for table in sorted(RANK_TABLE_EXAMPLES.glob("*.json")):
        result = run("rank-table", "validate", str(table), cwd=weird_tmp)
        assert result.returncode == 0 and "valid rank table" in result.stdout, result.stderr
    script = weird_tmp / "train.py"
    script.write_text("print('ran')\n", encoding="utf-8")
    result = run("--rank-table", str(RANK_TABLE_EXAMPLES / "rank_table_1x8_v1.0.json"), "--server-id", "10.0.0.11",
                 "--device", "cpu", "--dry-run", str(script), cwd=weird_tmp)
    assert result.returncode == 0, result.stderr


# Options of rank-table generate and from-hostfile ------------------------------------------------

HUGE = "9" * 5000
LONG = "h" * 100_000

# (options after "generate --server-id 10.0.0.11 -o -", words the error line must hold)
GENERATE = [
    (["--devices", "0-99999999999"], "--devices '0-99999999999': 99999999999 is out of range 0-15"),
    (["--devices", "[0,99999999999)"],
     "--devices '[0,99999999999)': 99999999998 is out of range 0-15 (physical ids of /dev/davinci0"),
    (["--devices", "[0,17)"], "--devices '[0,17)': 16 is out of range 0-15"),
    (["--devices", HUGE], "999999999999...(5000 digits) is out of range 0-15"),
    (["--devices", "\u00b2"], "--devices '\u00b2': expected ids like 0-7"),
    (["--devices", "0-\u0661"], "expected ids like 0-7"),
    (["--visible-devices", "0-99999999"], "--visible-devices '0-99999999': 99999999 is out of range 0-15"),
    (["--device-ip", "\u00b2=1.2.3.4"], "--device-ip '\u00b2=1.2.3.4': expected N=VALUE"),
    (["--device-ip", "1\u00b2=1.2.3.4"], "expected N=VALUE"),
    (["--device-ip", f"{HUGE}=1.2.3.4"], "expected N=VALUE"),
    (["--device-ip", "99=1.2.3.4"], "--device-ip '99=1.2.3.4': device 99 is out of range 0-15"),
    (["--device-ip", f"0={LONG}", "--devices", "0"], "...(100000 chars) is not an IPv4 or IPv6 address"),
    (["--device-port", "\u0661\u0662\u0663\u0664"], "is not a whole number within 0-65535"),
    (["--device-port", "1_000"], "'1_000' is not a whole number within 0-65535"),
    (["--device-port", HUGE], "is not a whole number within 0-65535"),
    (["--host-port", "\u00b2"], "'\u00b2' is not a whole number within 0-65535"),
    (["--format", "1.2", "--super-device-id", "0=\u00b2", "--super-pod-id", "1"],
     "--super-device-id 0=\u00b2: the value must be a whole number"),
    (["--format", "1.2", "--super-device-id", f"0={HUGE}", "--super-pod-id", "1"], "the value must be a whole number"),
    (["--format", "1.2", "--super-device-id", "\u00b2=1", "--super-pod-id", "1"], "--super-device-id '\u00b2=1'"),
    (["--format", "1.2", "--super-device-id", "0=1", "--super-pod-id", LONG, "--devices", "0"],
     "super_pod_list[0].super_pod_id: must be at most 64 characters, got 100000"),
    (["--host-ip", LONG], "server_list[0].host_ip:"),
    (["--server-id", LONG], "...(100002 chars): must be 1 to 64 characters"),
]


@pytest.mark.parametrize("options, words", GENERATE, ids=[" ".join(o)[:40] for o, _ in GENERATE])
def test_generate_options_are_refused_in_one_line(weird_tmp: Path, options: list[str], words: str) -> None:
    result = run("rank-table", "generate", "--server-id", "10.0.0.11", "-o", "-", *options, cwd=weird_tmp,
                 env=fake_ascend_env(weird_tmp, range(8)))
    assert_refused(result, words)


@pytest.mark.parametrize("name, content, words", [
    ("/dev/zero", to_dev_zero, "a hccn.conf may be at most 1 MiB"),
    ("a directory", directory, "cannot read the hccn.conf: Is a directory"),
    ("not UTF-8", b"address_0=192.1.10.6\naddress_1=\xff\n", ":2:11: not UTF-8 text (byte 0xff)"),
    ("huge device numbers", f"address_{HUGE}=1.1.1.1\n", "has no address_N for them"),
])
def test_a_hostile_hccn_conf_is_refused_in_one_line(weird_tmp: Path, name: str, content: Content,
                                                    words: str) -> None:
    conf = write(weird_tmp / "hccn.conf", content)
    env = {"NPU_LAUNCH_DEVFS": str(weird_tmp / "dev"), "PATH": os.environ["PATH"]}  # no hccn_tool
    (weird_tmp / "dev").mkdir()
    (weird_tmp / "dev" / "davinci0").touch()
    result = run("rank-table", "generate", "--server-id", "10.0.0.11", "--hccn-conf", str(conf), "-o", "-",
                 cwd=weird_tmp, env=env)
    assert_refused(result, words)


@pytest.mark.parametrize("options, words", [
    (["--nnodes", "\u00b2"], "'\u00b2' is not a whole number within 0-1024"),
    (["--nnodes", "99999999999999"], "is not a whole number within 0-1024"),
    (["--device-port", "\u0661"], "is not a whole number within 0-65535"),
    (["--device-port", "0"], "error: --device-port 0: must be within 1-65535"),
    (["--hccn-conf", "no equals sign" * 5000], "--hccn-conf 'no equals signno equals sign"),
    (["--hccn-conf", "10.0.0.11=/dev/zero"], "a hccn.conf may be at most 1 MiB"),
    (["--hccn-conf", f"{LONG}=x"], f"--hccn-conf {'h' * 80}...(100000 chars): not a host in"),
])
def test_from_hostfile_options_are_refused_in_one_line(weird_tmp: Path, options: list[str], words: str) -> None:
    hosts = write(weird_tmp / "hostfile", "10.0.0.11 slots=2\n")
    assert_refused(run("rank-table", "from-hostfile", str(hosts), *options, "-o", "-", cwd=weird_tmp), words)
