"""The plan server srun and mpirun agents fetch from: the key opens it, nothing else does.

Real sockets on loopback; the multi-node tests run it for real between private-disk hosts.
"""
from __future__ import annotations

import socket
import threading

import pytest

from launcher.errors import LaunchError
from launcher.payload import SCHEME, fetch, serving

PAYLOAD = b'{"plan": "x"}\n' * 50_000  # 700 kB: more than one send


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


def test_a_client_that_says_nothing_is_dropped_and_others_are_served() -> None:
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
