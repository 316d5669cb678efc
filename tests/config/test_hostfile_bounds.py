"""Hostile hostfiles, filters and ssh options: one line and exit 2, never a traceback or a hang.

Each input is refused by the parser (``read_hostfile`` / ``select_hosts`` /
``split_ssh_options``) and, end to end, by the real CLI in ``--dry-run``: exit code 2, one line
on stderr that starts ``npu-launch: error:``, and no log directory left behind.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from helpers import assert_one_line_error, run_cli_here

from launcher.cluster.backends import TransportOptions
from launcher.cluster.backends.mpi import MpiBackend
from launcher.cluster.backends.ssh import SshBackend, split_ssh_options, ssh_argv
from launcher.config.hostfile import (
    HostEntry,
    HostSelection,
    check_host_name,
    parse_hostfile,
    read_hostfile,
    select_hosts,
)
from launcher.errors import ConfigError, HostfileError
from launcher.limits import MAX_FILE_BYTES, MAX_NODES, MAX_RANKS_PER_NODE

LONGEST_MESSAGE = 400
"""An error line echoes at most ``MAX_SHOWN`` characters of any value: no 5 MB lines."""

HOSTILE = ["no;de1", "$(touch PWNED)", "`touch PWNED`", "no'de", 'no"de', "-oProxyCommand=x",
           "no\\de", "a|b", "a&b", "a>b", "a*", "~root", "a/b", "a..b", "..", "\x1b[31m"]
"""Host names full of what a shell or ssh would act on; none of them can be a host."""


def _write(directory: Path, content: bytes, name: str = "hosts") -> Path:
    path = directory / name
    path.write_bytes(content)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(HostfileError) as info:
        read_hostfile(path)
    message = info.value.message
    assert "\n" not in message and len(message) < LONGEST_MESSAGE, message
    return message


BAD_FILES = [
    (b"node1 slots=\xc2\xb2\n", 1, "slots must be a whole number of at least 1, got '\u00b2'"),
    ("node1 slots=\u0661\u0662\n".encode(), 1, "got '\u0661\u0662'"),
    (b"node1 slots=" + b"7" * 5000 + b"\n", 1,
     f"slots=777777777777...(5000 digits): at most {MAX_RANKS_PER_NODE} per host"),
    (b"node1 slots=1000000000\n", 1, f"slots=1000000000: at most {MAX_RANKS_PER_NODE} per host"),
    (b"node1 slots=65\n", 1, "slots=65: at most 64 per host"),
    (b"node1 slots=1\nnode2 slots=\xff\n", 2, "not UTF-8 text (byte 0xff)"),
    (b"node1 slots=1\nNODE1 slots=2\n", 2,
     "duplicate host 'NODE1' (first on line 1 as 'node1'; names ignore case)"),
    (b"a@Node1.Example slots=1\nb@node1.example slots=1\n", 2, "duplicate host"),
    (b"x" * 300 + b" slots=1\n", 1, "is longer than 253 characters (DNS)"),
    (b"a" * 64 + b".example slots=1\n", 1, "has a part longer than 63 characters (DNS)"),
    (b"-oProxyCommand=touch_PWNED slots=1\n", 1, "starts with '-' (ssh would read it as an option)"),
    (b"-l@node1 slots=1\n", 1, "user name '-l' starts with '-' (ssh would read it as an option)"),
    (b"u" * 33 + b"@node1 slots=1\n", 1, "is longer than 32 characters"),
    (b"node1 slots=1 " + b"t" * 5_000_00 + b"\n", 1, "...(500002 chars)"),
    (b"h" * 900_000 + b"\n", 1, "...(900002 chars)"),
    ("node1\u2028slots=1\n# a\x0c\nnode1 slots=x\n".encode(), 3, "got 'x'"),
]


@pytest.mark.parametrize("content, line, words", BAD_FILES, ids=range(len(BAD_FILES)))
def test_bad_hostfile_lines_are_refused_by_file_and_line(tmp_path: Path, content: bytes,
                                                         line: int, words: str) -> None:
    path = _write(tmp_path, content)
    message = _refusal(path)
    assert message.startswith(f"{path}:{line}: "), message
    assert words in message, message


def test_more_hosts_than_a_job_may_have(tmp_path: Path) -> None:
    many = "".join(f"n{i} slots=1\n" for i in range(MAX_NODES + 1)).encode()
    message = _refusal(_write(tmp_path, many))
    assert message == f"{tmp_path / 'hosts'}:{MAX_NODES + 1}: more than {MAX_NODES} hosts, " \
                      "the most a job may have"
    assert len(read_hostfile(_write(tmp_path, many.rsplit(b"n", 1)[0]))) == MAX_NODES


def test_the_largest_accepted_values(tmp_path: Path) -> None:
    name = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
    assert len(name) == 253
    text = f"{'u' * 32}@{name} slots={MAX_RANKS_PER_NODE}\nnode1. slots=1\n"
    assert read_hostfile(_write(tmp_path, text.encode())) == [
        HostEntry(name, MAX_RANKS_PER_NODE, "u" * 32, 1), HostEntry("node1.", 1, None, 2)]


@pytest.mark.parametrize("size, refused", [(MAX_FILE_BYTES, False), (MAX_FILE_BYTES + 1, True)])
def test_file_size_bound(tmp_path: Path, size: int, refused: bool) -> None:
    text = b"node1 slots=1\n"
    path = _write(tmp_path, text + b" " * (size - len(text)))
    if refused:
        assert _refusal(path) == (f"{path}: larger than 1 MiB, the most a hostfile may be "
                                  "(one short line per host)")
    else:
        assert read_hostfile(path) == [HostEntry("node1", 1, None, 1)]


def _finishes(action: Callable[[], object], seconds: float = 10) -> object:
    """``action()``'s error, raised in a thread that must end within ``seconds``."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(action())
        except Exception as e:  # the test inspects it
            outcome.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s"
    return outcome[0]


def test_dev_zero_is_refused_at_the_bound() -> None:
    error = _finishes(lambda: read_hostfile("/dev/zero"))
    assert isinstance(error, HostfileError)
    assert error.message == ("/dev/zero: larger than 1 MiB, the most a hostfile may be "
                             "(one short line per host)")


def test_a_fifo_without_writer_is_empty_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    error = _finishes(lambda: read_hostfile(fifo))
    assert isinstance(error, HostfileError) and "no hosts in the hostfile" in error.message


def test_a_terminal_nobody_types_into_is_an_error_not_a_hang(monkeypatch) -> None:
    """A tty (``--hostfile /dev/pts/N``, as ``/proc/kmsg`` too) blocked every read for ever:
    it is read like a pipe now, and silence past ``PIPE_WAIT`` is an error."""
    import pty

    import rank_tables.bounded
    monkeypatch.setattr(rank_tables.bounded, "PIPE_WAIT", 0.2)
    controller, terminal = pty.openpty()
    try:
        error = _finishes(lambda: read_hostfile(os.ttyname(terminal)), seconds=10)
    finally:
        os.close(controller)
        os.close(terminal)
    assert isinstance(error, HostfileError) and "nothing to read for 0.2 s" in error.message


def test_a_pipe_with_a_writer_is_read() -> None:
    """As ``--hostfile <(make-hosts)`` gives it: the writer is there, its bytes come late."""
    read_end, write_end = os.pipe()

    def write_late() -> None:
        time.sleep(0.3)
        os.write(write_end, b"node1 slots=2\n")
        os.close(write_end)
    writer = threading.Thread(target=write_late)
    writer.start()
    try:
        assert _finishes(lambda: read_hostfile(f"/dev/fd/{read_end}")) == [
            HostEntry("node1", 2, None, 1)]
    finally:
        writer.join()
        os.close(read_end)


@pytest.mark.parametrize("name, words", [
    ("dir", "cannot read the hostfile: Is a directory"),
    ("missing", "cannot read the hostfile: No such file or directory"),
])
def test_not_a_readable_file(tmp_path: Path, name: str, words: str) -> None:
    (tmp_path / "dir").mkdir()
    assert _refusal(tmp_path / name) == f"{tmp_path / name}: {words}"


def test_a_path_that_would_break_the_line_is_shown_quoted(tmp_path: Path) -> None:
    with pytest.raises(HostfileError) as info:
        read_hostfile(str(tmp_path / "a\nb"))
    assert "\n" not in info.value.message and "a\\nb" in info.value.message
    with pytest.raises(HostfileError) as info:
        read_hostfile("nul\0byte")
    assert info.value.message.startswith("'nul\\x00byte': cannot read the hostfile")


@pytest.mark.parametrize("host", HOSTILE)
def test_hosts_a_shell_would_act_on_are_refused(host: str) -> None:
    assert check_host_name(host) is not None
    with pytest.raises(HostfileError) as info:
        parse_hostfile(f"{host} slots=1\n", "hosts")
    assert info.value.message.startswith("hosts:1: ")
    assert "\n" not in info.value.message and "\x1b" not in info.value.message


@pytest.mark.parametrize("user", [u for u in HOSTILE if u != "a..b"] + ["", "1root", "ro ot"])
def test_users_a_shell_would_act_on_are_refused(user: str) -> None:
    with pytest.raises(HostfileError) as info:
        parse_hostfile(f"{user}@node1 slots=1\n", "hosts")
    assert info.value.message.startswith("hosts:1: ")
    assert "\n" not in info.value.message and "\x1b" not in info.value.message


HOSTS = [HostEntry("node1", 2, None, 1), HostEntry("Node2", 4, None, 2)]


def _short_id(value: object) -> str:
    return repr(value)[:30]


@pytest.mark.parametrize("kwargs, words", ids=_short_id, argvalues=[
    ({"include": "node1:\u00b2"}, "--include: bad card '\u00b2' for host 'node1'"),
    ({"include": "node1:\u0661"}, "bad card '\u0661'"),
    ({"include": "node1:99999999999999999999"},
     "--include: card 99999999999999999999 out of range for host 'node1' (slots=2: cards 0-1)"),
    ({"exclude": "node1:" + "9" * 5000}, "card 999999999999...(5000 digits) out of range"),
    ({"include": "x" * 5_000_000}, "unknown host 'xxxxxxxx"),
    ({"include": "node1@"}, "unknown host ''"),
    ({"include": "node1@NODE1"}, "host 'node1' is named twice"),
])
def test_filter_refusals_are_short(kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        select_hosts(HOSTS, **kwargs)
    assert words in info.value.message
    assert len(info.value.message) < LONGEST_MESSAGE


def test_filters_ignore_case_like_the_hostfile() -> None:
    chosen = select_hosts(HOSTS, include="NODE1:1@node2", exclude="NODE2:0")
    assert [(s.host, s.cards) for s in chosen] == [("node1", (1,)), ("Node2", (1, 2, 3))]


def test_an_unknown_host_lists_a_few_known_ones() -> None:
    many = [HostEntry(f"n{i}", 1, None, i) for i in range(1, MAX_NODES + 1)]
    with pytest.raises(ConfigError) as info:
        select_hosts(many, include="nope")
    assert info.value.message == ("--include: unknown host 'nope' (the hostfile has: "
                                  f"n1, n2, n3, n4, n5, ... ({MAX_NODES} hosts))")


@pytest.mark.parametrize("option, words", ids=_short_id, argvalues=[
    ('-o "ProxyCommand=x', "--ssh-option '-o \"ProxyCommand=x': No closing quotation"),
    ("-F 'a", "No closing quotation"),
    ("-o X\\", "No escaped character"),
    ("-o A=\0", "contains a NUL character"),
    ("-o '" + "x" * 5_000_000, "...(5000006 chars): longer than 4096 characters"),
])
def test_bad_ssh_options_are_config_errors(option: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        split_ssh_options(("-v", option))
    assert info.value.message.startswith("--ssh-option ")
    assert words in info.value.message and len(info.value.message) < LONGEST_MESSAGE
    for backend in (SshBackend, MpiBackend):
        with pytest.raises(ConfigError):
            backend([], TransportOptions(None, (option,)))


def test_ssh_options_split_like_a_shell_and_end_before_the_host() -> None:
    assert split_ssh_options(('-F "/a b/c"', "-o X=1", "")) == ("-F", "/a b/c", "-o", "X=1")
    argv = ssh_argv("node1", "u", ["python", "-c", "print(1)"], "/w d",
                    TransportOptions(22, ('-F "/a b"',)))
    assert argv == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "22",
                    "-F", "/a b", "--", "u@node1", "cd -- '/w d' && exec python -c 'print(1)'"]


# The CLI ------------------------------------------------------------------------------------------

def _cli(tmp_path: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """A dry run of ``args`` through the CLI's ``main`` in this process."""
    script = tmp_path / "script.py"
    script.write_text("print('ran')\n")
    return run_cli_here("--dry-run", *args, "--device", "cpu", "--cards", "1", str(script),
                        cwd=tmp_path, guard=timeout)


def _one_line_exit_2(result: subprocess.CompletedProcess, tmp_path: Path, words: str) -> None:
    line = assert_one_line_error(result, words)
    assert len(line) < LONGEST_MESSAGE + 50, line
    assert result.stdout == ""
    assert not (tmp_path / "npu_launch_logs").exists()


CLI_FILES = [content for content, _, _ in BAD_FILES] + [
    "".join(f"n{i} slots=1\n" for i in range(MAX_NODES + 1)).encode(),
    b"x" * (3 << 20) + b" slots=1\n",
]


@pytest.mark.parametrize("content", CLI_FILES, ids=range(len(CLI_FILES)))
def test_cli_refuses_bad_hostfiles_in_one_line(tmp_path: Path, content: bytes) -> None:
    path = _write(tmp_path, content)
    _one_line_exit_2(_cli(tmp_path, "--hostfile", str(path)), tmp_path, f"{path}:")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "dir"])
def test_cli_refuses_files_that_are_not_hostfiles(tmp_path: Path, special: str) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    path = special if special.startswith("/") else str(tmp_path / special)
    _one_line_exit_2(_cli(tmp_path, "--hostfile", path), tmp_path, f"{path}:")


@pytest.mark.parametrize("args, words", ids=_short_id, argvalues=[
    (("--include", "node1:\u00b2"), "--include: bad card '\u00b2'"),
    (("--include", "node1:99999999999999999999"), "card 99999999999999999999 out of range"),
    (("--exclude", "nodeX"), "--exclude: unknown host 'nodeX'"),
    (("--include", "n" * 100_000), "...(100002 chars)"),  # one argv word holds 128 KiB at most
    (("--ssh-option", "-o '" + "x" * 100_000), "...(100006 chars): longer than 4096 characters"),
    (("--ssh-option", '-o "ProxyCommand=x'), "--ssh-option '-o \"ProxyCommand=x': No closing"),
])
def test_cli_refuses_bad_filters_and_ssh_options(tmp_path: Path, args: tuple, words: str) -> None:
    hostfile = _write(tmp_path, b"node1 slots=2\n")
    _one_line_exit_2(_cli(tmp_path, "--hostfile", str(hostfile), *args), tmp_path, words)


def test_preflight_command_refuses_a_bad_ssh_option(tmp_path: Path) -> None:
    hostfile = _write(tmp_path, b"node1 slots=2\n")
    result = run_cli_here("preflight", "--hostfile", str(hostfile), "--ssh-option", "-F 'x",
                          cwd=tmp_path)
    _one_line_exit_2(result, tmp_path, "--ssh-option \"-F 'x\": No closing quotation")


def test_mpirun_refuses_hostfile_users_it_cannot_pass() -> None:
    hosts = [HostSelection("node1", None, (0,)), HostSelection("node2", "admin", (0,))]
    with pytest.raises(ConfigError) as info:
        MpiBackend(hosts, TransportOptions())
    assert info.value.message == ("--launcher mpi: mpirun cannot log in as 'admin' on node2 "
                                  "(drop 'user@' from the hostfile and set User in ~/.ssh/config)")
