"""The launcher's server for agents: the plan srun and mpirun agents fetch, and the checkpoint
files agents send node 0's ledger. The key opens it, nothing else does, and an upload that is not
exactly what it said it is leaves nothing behind.

Real sockets on loopback and a real ledger on disk; the multi-node tests run both for real
between private-disk hosts.
"""
from __future__ import annotations

import errno
import hashlib
import os
import socket
import threading
from pathlib import Path

import pytest

from launcher.checkpoints.ledger import CheckpointLedger
from launcher.checkpoints.uploads import Upload
from launcher.cluster import payload
from launcher.cluster.payload import SCHEME, fetch, serving, upload_file
from launcher.errors import LaunchError
from parallel.contract import Event

PAYLOAD = b'{"plan": "x"}\n' * 50_000  # 700 kB: more than one send
DATA = b"four"
SHA_OF_DATA = hashlib.sha256(DATA).hexdigest()


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _nothing_comes(conn: socket.socket) -> bool:
    """The server closed ``conn`` without sending a byte (a reset counts: it had unread data)."""
    try:
        return conn.recv(10) == b""
    except ConnectionResetError:
        return True


def test_the_key_gets_the_payload_and_every_agent_may_ask() -> None:
    with serving(PAYLOAD, "127.0.0.1") as server:
        assert server.address.startswith(f"{SCHEME}127.0.0.1:")
        answers: list[bytes] = []
        threads = [threading.Thread(target=lambda: answers.append(fetch(server.address, server.key)))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert answers == [PAYLOAD] * 8


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_wrong_key_gets_nothing_and_is_told_in_one_line() -> None:
    with serving(PAYLOAD, "127.0.0.1") as server:
        with pytest.raises(LaunchError, match=r"sent nothing for 'plan' \(a wrong key"):
            fetch(server.address, "0" * 32)
        with pytest.raises(LaunchError):
            fetch(server.address, server.key[:-1])  # a prefix of the key is not the key
        with socket.create_connection(("127.0.0.1", _port(server.address))) as conn:
            conn.sendall(server.key.encode() + b"tail plan\n")  # the key and more is not the key
            assert _nothing_comes(conn)
        for request in ("replica 0", "replica \u00b2", "replica", "plan please"):  # no replicas here
            with pytest.raises(LaunchError, match="sent nothing"):
                fetch(server.address, server.key, request, timeout=1)


def test_a_client_that_says_nothing_is_dropped_and_others_are_served(monkeypatch) -> None:
    monkeypatch.setattr(payload, "_HELLO_TIMEOUT", 0.5)  # 5 s
    with serving(PAYLOAD, "127.0.0.1") as server:
        with socket.create_connection(("127.0.0.1", _port(server.address))) as silent:
            assert fetch(server.address, server.key) == PAYLOAD  # not held up by the silent one
            silent.settimeout(30)
            assert _nothing_comes(silent)  # cut after the hello timeout


def test_no_launcher_is_one_line_after_the_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(LaunchError, match=f"cannot fetch 'plan' from the launcher at "
                                              f"{SCHEME}127.0.0.1:{port}"):
            fetch(f"{SCHEME}127.0.0.1:{port}", "k", timeout=0.5)


# Uploads: checkpoint files agents send node 0's ledger (launcher.cluster.collect) ---------------------

def _ledger(log_dir: Path, collected: list) -> CheckpointLedger:
    """Node 0's ledger of a 2-rank sliced job that collects rank 1's files."""
    return CheckpointLedger(str(log_dir), world_size=2, data_parallel=False, collect=(1,),
                            on_collected=lambda size, seconds: collected.append(size))


def _slice(tmp_path: Path, data: bytes) -> tuple[Path, str]:
    path = tmp_path / "host b" / "step_10" / "rank_1.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_an_upload_is_checked_and_put_in_place_in_the_ledger(weird_tmp: Path) -> None:
    logs, collected = weird_tmp / "logs", []
    ledger = _ledger(logs, collected)
    data = os.urandom(3 << 20)  # many reads' worth
    path, sha = _slice(weird_tmp, data)
    with serving(b"", "127.0.0.1", receiver=ledger) as server:
        upload_file(server.address, server.key, Upload(1, 10, "rank_1.ckpt", len(data), sha),
                    str(path))
    kept = logs / "checkpoint_ledger" / "step_10" / "rank_1" / "rank_1.ckpt"
    assert _files_under(logs) == [kept] and kept.read_bytes() == data
    assert ledger.collected_steps() == [10] and collected == [len(data)]


def test_an_empty_file_is_an_upload_too(tmp_path: Path) -> None:
    logs, collected = tmp_path / "logs", []
    path, sha = _slice(tmp_path, b"")
    with serving(b"", "127.0.0.1", receiver=_ledger(logs, collected)) as server:
        upload_file(server.address, server.key, Upload(1, 3, "empty", 0, sha), str(path))
    assert (logs / "checkpoint_ledger" / "step_3" / "rank_1" / "empty").read_bytes() == b""
    assert collected == [0]


_BEFORE, _AFTER = "refused before a byte", "refused once the bytes came"


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("upload, when", [
    (Upload(5, 10, "rank_1.ckpt", 4, SHA_OF_DATA), _BEFORE),    # no rank 5 in a 2-rank job
    (Upload(0, 10, "rank_0.ckpt", 4, SHA_OF_DATA), _BEFORE),    # rank 0's files stay where they are
    (Upload(1, 10, "rank_1.ckpt", 10 ** 17, SHA_OF_DATA), _BEFORE),  # more than the disk holds
    (Upload(1, 10, "rank_1.ckpt", 10 ** 19, SHA_OF_DATA), _BEFORE),  # more digits than a size has
    (Upload(1, 10, "rank_1.ckpt", 4, SHA_OF_DATA.upper()), _BEFORE),
    (Upload(1, 10, "../../../escaped", 4, SHA_OF_DATA), _BEFORE),
    (Upload(1, 10, "a/b", 4, SHA_OF_DATA), _BEFORE),
    (Upload(1, 10, "..", 4, SHA_OF_DATA), _BEFORE),
    (Upload(1, 10, ".hidden", 4, SHA_OF_DATA), _BEFORE),
    (Upload(1, 10, "x..y", 4, SHA_OF_DATA), _BEFORE),
    (Upload(1, 10, "rank_1.ckpt", 4, "0" * 64), _AFTER),      # not the bytes the upload said
    (Upload(1, 10, "rank_1.ckpt", 3, SHA_OF_DATA), _AFTER),   # 3 bytes of the 4 the sha is of
    (Upload(1, 10, "rank_1.ckpt", 5, SHA_OF_DATA), _AFTER),   # the agent stops short
], ids=["stranger-rank", "uncollected-rank", "past-free-space", "size-digits", "uppercase-sha",
        "dotdot-name", "slash-name", "dotdot", "hidden-name", "dotdot-inside", "wrong-sha",
        "fewer-bytes-than-hashed", "fewer-bytes-than-said"])
def test_an_upload_that_is_not_sane_writes_nothing(tmp_path: Path, upload: Upload,
                                                   when: str) -> None:
    logs, collected = tmp_path / "logs", []
    logs.mkdir()
    path, _ = _slice(tmp_path, DATA)
    with serving(b"", "127.0.0.1", receiver=_ledger(logs, collected)) as server:
        with pytest.raises(LaunchError):
            upload_file(server.address, server.key, upload, str(path), timeout=5)
    assert _files_under(logs) == [] and collected == []
    assert not list((logs / "checkpoint_ledger").glob("step_*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host b", "logs"]
    # Refused on its fields alone, not a byte is staged; else what came is gone again.
    assert (logs / "checkpoint_ledger").exists() is (when == _AFTER)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("request_line", [
    "upload ../1 10 4 {sha} rank_1.ckpt", "upload 1 10/../../x 4 {sha} rank_1.ckpt",
    "upload 1 -10 4 {sha} rank_1.ckpt", "upload 1 10 4 ../{sha} rank_1.ckpt",
    "upload 1 10 4 {sha} rank_1.ckpt extra", "upload 1 10 4 {sha}", "upload \u00b9 10 4 {sha} r",
    "upload 1 1e3 4 {sha} r", "upload 1 10 0x4 {sha} r", "upload 1 10 4 {sha} /etc/passwd",
    "upload 1 10 4 {sha} \u0391lpha", "upload 1 10 4 {sha} r\\x", "upload 1 \u00b2 4 {sha} r",
    "upload 1 10 \u0664 {sha} r", "upload 1 10 99999999999999999999 {sha} r",
])
def test_path_tricks_in_the_fields_write_nothing(tmp_path: Path, request_line: str) -> None:
    logs, collected = tmp_path / "logs", []
    logs.mkdir()
    with serving(b"", "127.0.0.1", receiver=_ledger(logs, collected)) as server:
        line = f"{server.key} {request_line.format(sha=SHA_OF_DATA)}"
        assert _raw_upload(server.address, line, DATA) == b""
    assert _files_under(logs) == [] and collected == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]


@pytest.mark.parametrize("fields", [
    ["-1", "10", "4", SHA_OF_DATA, "r"], ["1", "-10", "4", SHA_OF_DATA, "r"],
    ["1", "10", "-4", SHA_OF_DATA, "r"], ["1", "+10", "4", SHA_OF_DATA, "r"],
    ["\u00b9", "10", "4", SHA_OF_DATA, "r"], ["1", "10", "\u0664", SHA_OF_DATA, "r"],
    ["1", "1" * 19, "4", SHA_OF_DATA, "r"], ["1", "10", "4", SHA_OF_DATA[:-1], "r"],
    ["1", "10", "4", SHA_OF_DATA, ""], ["1", "10", "4", SHA_OF_DATA, "r", "s"],
])
def test_an_upload_names_ascii_numbers_a_hex_sha256_and_a_plain_name(fields: list) -> None:
    assert Upload.parse(fields) is None
    assert Upload.parse(["1", "1" * 18, "4", SHA_OF_DATA, "r"]) == \
        Upload(1, int("1" * 18), "r", 4, SHA_OF_DATA)


def _raw_upload(address: str, line: str, body: bytes) -> bytes:
    """Send ``line`` and ``body`` as a client that keeps to no rule would; what comes back."""
    with socket.create_connection(("127.0.0.1", _port(address))) as conn:
        try:
            conn.sendall(line.encode() + b"\n" + body)
            conn.shutdown(socket.SHUT_WR)
        except OSError as e:  # the server hung up first (a 3 MB body past its size): no answer
            if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
            return b""
        answer = b""
        try:
            while chunk := conn.recv(100):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


@pytest.mark.parametrize("size", [len(DATA), 3 << 20], ids=["with-the-request", "streamed"])
def test_bytes_past_the_announced_size_write_nothing(tmp_path: Path, size: int) -> None:
    logs, collected = tmp_path / "logs", []
    data = (DATA * size)[:size]
    with serving(b"", "127.0.0.1", receiver=_ledger(logs, collected)) as server:
        line = f"{server.key} upload 1 10 {size} {hashlib.sha256(data).hexdigest()} r"
        assert _raw_upload(server.address, line, data + b"more") == b""
        assert _files_under(logs) == [] and collected == []
        assert _raw_upload(server.address, line, data) == b"ok\n"  # the same, exact: taken
    assert _files_under(logs) == [logs / "checkpoint_ledger" / "step_10" / "rank_1" / "r"]


def test_an_upload_with_a_wrong_key_or_without_a_ledger_writes_nothing(tmp_path: Path) -> None:
    logs, collected = tmp_path / "logs", []
    logs.mkdir()
    path, sha = _slice(tmp_path, DATA)
    upload = Upload(1, 10, "rank_1.ckpt", len(DATA), sha)
    with serving(b"", "127.0.0.1", receiver=_ledger(logs, collected)) as server:
        with pytest.raises(LaunchError, match="did not take"):
            upload_file(server.address, "0" * 32, upload, str(path))
        with pytest.raises(LaunchError):
            upload_file(server.address, server.key[:-1], upload, str(path))
    with serving(b"", "127.0.0.1") as server:  # a server without a ledger takes no upload
        with pytest.raises(LaunchError):
            upload_file(server.address, server.key, upload, str(path))
    assert _files_under(logs) == [] and collected == []


def test_an_upload_of_a_pruned_step_is_refused(tmp_path: Path) -> None:
    logs, collected = tmp_path / "logs", []
    ledger = _ledger(logs, collected)
    path, sha = _slice(tmp_path, DATA)
    with serving(b"", "127.0.0.1", receiver=ledger) as server:
        for step in (10, 20):
            upload_file(server.address, server.key, Upload(1, step, "r", len(DATA), sha),
                        str(path))
            for rank in (0, 1):
                ledger.record(_checkpoint_event(rank, step, path, sha))
            assert ledger.complete_steps[-1] == step
        # Step 20 is complete and collected: step 10's copy is gone, and not taken again.
        assert ledger.collected_steps() == [20]
        with pytest.raises(LaunchError):
            upload_file(server.address, server.key, Upload(1, 10, "r", len(DATA), sha),
                        str(path))
    assert _files_under(logs / "checkpoint_ledger" / "step_10") == [
        logs / "checkpoint_ledger" / "step_10" / "files.json",
        logs / "checkpoint_ledger" / "step_10" / "manifest.json"]
    assert collected == [len(DATA)] * 2


def _checkpoint_event(rank: int, step: int, path: Path, sha: str) -> Event:
    event = Event.parse({"event": "checkpoint", "rank": rank, "host": "ab"[rank], "step": step,
                         "path": str(path), "name": path.name, "size": len(DATA), "sha256": sha,
                         "position": {"epoch": 0, "batch_in_epoch": step, "global_step": step},
                         "world_size": 2, "time": 1.0})
    assert event is not None
    return event
