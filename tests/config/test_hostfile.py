"""Hostfile parsing and the DeepSpeed-style host filters."""
from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.hostfile import HostEntry, HostSelection, read_hostfile, select_hosts
from launcher.errors import ConfigError, HostfileError, LaunchError


def write(directory: Path, text: str) -> Path:
    path = directory / "host file.txt"
    path.write_text(text, encoding="utf-8")
    return path


def entries(text: str, directory: Path) -> list[HostEntry]:
    return read_hostfile(write(directory, text))


def error_of(text: str, directory: Path) -> str:
    path = write(directory, text)
    with pytest.raises(HostfileError) as info:
        read_hostfile(path)
    return info.value.message


def test_reads_hosts_comments_blank_lines_and_users(weird_tmp: Path) -> None:
    text = "# cluster A\n\nnode1 slots=8\n   admin@node2\tslots=16   # rack 3\n#node3 slots=8\n10.0.0.5 slots=1\n"
    assert entries(text, weird_tmp) == [
        HostEntry("node1", 8, None, 3),
        HostEntry("node2", 16, "admin", 4),
        HostEntry("10.0.0.5", 1, None, 6),
    ]


def test_accepts_a_str_path_and_crlf_line_ends(weird_tmp: Path) -> None:
    path = write(weird_tmp, "node1 slots=2\r\nnode2 slots=2\r\n")
    assert [e.host for e in read_hostfile(str(path))] == ["node1", "node2"]


@pytest.mark.parametrize("text, line, words", [
    ("node1 slots=8\nnode2 slots=x\n", 2, "slots must be a whole number"),
    ("node1 slots=0\n", 1, "at least 1"),
    ("node1 slots=-2\n", 1, "'-2'"),
    ("# hi\nnode1\n", 2, "missing 'slots=N'"),
    ("node1 8\n", 1, "expected 'slots=N', got '8'"),
    ("node1 slot=8\n", 1, "expected 'slots=N'"),
    ("node1 slots=8 gpus=2\n", 1, "unexpected 'gpus=2'"),
    ("node1 slots = 8\n", 1, "unexpected"),
    ("node1 slots=4\n\nnode1 slots=8\n", 3, "duplicate host 'node1' (first on line 1)"),
    ("alice@node1 slots=4\nbob@node1 slots=8\n", 2, "duplicate host 'node1'"),
    ("node:1 slots=8\n", 1, "bad host name 'node:1'"),
    ("@node1 slots=8\n", 1, "bad user name ''"),
    ("a b@node1 slots=8\n", 1, "unexpected"),
])
def test_bad_lines_name_file_and_line(weird_tmp: Path, text: str, line: int, words: str) -> None:
    message = error_of(text, weird_tmp)
    assert message.startswith(f"{weird_tmp / 'host file.txt'}:{line}: ")
    assert words in message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n   # another\n"])
def test_a_hostfile_without_hosts_is_an_error(weird_tmp: Path, text: str) -> None:
    assert "no hosts in the hostfile" in error_of(text, weird_tmp)


def test_a_missing_hostfile_is_an_error_not_a_local_run(weird_tmp: Path) -> None:
    missing = weird_tmp / "nope"
    with pytest.raises(HostfileError) as info:
        read_hostfile(missing)
    assert info.value.message.startswith(f"{missing}: cannot read")
    assert info.value.exit_code == 2 and isinstance(info.value, LaunchError)


HOSTS = [HostEntry("node1", 4, None, 1), HostEntry("node2", 8, "admin", 2), HostEntry("node3", 2, None, 3)]


def cards(selection: list[HostSelection]) -> dict[str, tuple[int, ...]]:
    return {s.host: s.cards for s in selection}


def test_no_filter_selects_every_card_in_hostfile_order() -> None:
    assert select_hosts(HOSTS) == [
        HostSelection("node1", None, (0, 1, 2, 3)),
        HostSelection("node2", "admin", tuple(range(8))),
        HostSelection("node3", None, (0, 1)),
    ]


def test_include_picks_hosts_and_cards_keeping_hostfile_order() -> None:
    chosen = select_hosts(HOSTS, include="node3@node1:2,0")
    assert cards(chosen) == {"node1": (0, 2), "node3": (0, 1)}
    assert [s.host for s in chosen] == ["node1", "node3"]


def test_exclude_removes_cards_and_drops_emptied_hosts() -> None:
    chosen = select_hosts(HOSTS, exclude="node2@node3:0,1@node1:3")
    assert cards(chosen) == {"node1": (0, 1, 2)}


def test_include_then_exclude() -> None:
    assert cards(select_hosts(HOSTS, include="node1:0,1,2@node2:5", exclude="node1:1")) == {
        "node1": (0, 2), "node2": (5,)}


def test_nnodes_keeps_the_first_hosts_after_filtering() -> None:
    assert [s.host for s in select_hosts(HOSTS, exclude="node1", nnodes=1)] == ["node2"]
    assert [s.host for s in select_hosts(HOSTS, nnodes=3)] == ["node1", "node2", "node3"]


@pytest.mark.parametrize("kwargs, words", [
    ({"include": "node9"}, "--include: unknown host 'node9' (the hostfile has: node1, node2, node3)"),
    ({"exclude": "node1@nodeX:0"}, "--exclude: unknown host 'nodeX'"),
    ({"include": "node3:2"}, "card 2 out of range for host 'node3' (slots=2: cards 0-1)"),
    ({"include": "node1:0,a"}, "bad card 'a' for host 'node1'"),
    ({"include": "node1:"}, "bad card ''"),
    ({"include": "node1@node1:0"}, "host 'node1' is named twice"),
    ({"include": "node1:2,0,2"}, "--include: card 2 is named twice for host 'node1'"),
    ({"exclude": "node1:0, 0"}, "--exclude: card 0 is named twice for host 'node1'"),
    ({"include": ""}, "--include: empty (expected hosts and cards, e.g. node1:0,2@node2)"),
    ({"exclude": " "}, "--exclude: empty"),
    ({"exclude": "node1@node2@node3"}, "no hosts left"),
    ({"nnodes": 4}, "--nnodes 4: must be between 1 and the 3 hosts"),
    ({"nnodes": 0}, "--nnodes 0"),
    ({"include": "node1", "nnodes": 2}, "--nnodes 2: must be between 1 and the 1 hosts"),
])
def test_filter_errors_name_the_culprit(kwargs: dict, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        select_hosts(HOSTS, **kwargs)
    assert words in info.value.message


def test_reads_and_selects_from_a_real_file(weird_tmp: Path) -> None:
    hosts = entries("worker-0 slots=8\nroot@worker-1 slots=8\n", weird_tmp)
    assert select_hosts(hosts, include="worker-0@worker-1:0,2") == [
        HostSelection("worker-0", None, tuple(range(8))),
        HostSelection("worker-1", "root", (0, 2)),
    ]
