"""How srun and mpirun agents get the plan on hosts that share no storage: from the launcher.

ssh feeds each agent its plan on stdin. srun and mpirun start every agent with one command
line, so for the job's life the launcher serves the payload on a TCP port of its own host, on
the interface that reaches node 0 (``PayloadServer``). Each agent connects (``fetch``), proves
it belongs to this launch with a key the launcher put in its environment (``contract.
PAYLOAD_KEY``: an environment, unlike a command line, is private to its owner; srun passes it
on by default, mpirun with ``-x``), and reads the payload. A wrong key, or a client that says
nothing for a few seconds, is disconnected with nothing sent.
"""
from __future__ import annotations

import contextlib
import hmac
import secrets
import socket
import threading
import time
from typing import Iterator

from launcher.errors import LaunchError

SCHEME = "tcp://"
_HELLO_TIMEOUT = 5.0
_CONNECT_TIMEOUT = 60.0
MAX_PAYLOAD_BYTES = 1 << 30
"""A plan larger than this is not a plan."""


class PayloadServer:
    """Serves ``payload`` to every client that sends ``key``, until ``close``."""

    def __init__(self, payload: bytes, toward: str) -> None:
        self.key = secrets.token_hex(16)
        self._payload = payload
        host = _address_toward(toward)
        self._sock = socket.create_server((host or "0.0.0.0", 0))
        self._sock.settimeout(0.2)
        port = self._sock.getsockname()[1]
        self.address = f"{SCHEME}{host or socket.gethostname()}:{port}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="payload-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._sock.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(_HELLO_TIMEOUT)
            try:
                said = _read_line(conn, len(self.key) + 1)
                if hmac.compare_digest(said, self.key.encode()):
                    conn.sendall(self._payload)
            except OSError:
                pass


@contextlib.contextmanager
def serving(payload: bytes, toward: str) -> Iterator[PayloadServer]:
    server = PayloadServer(payload, toward)
    try:
        yield server
    finally:
        server.close()


def fetch(address: str, key: str, timeout: float = _CONNECT_TIMEOUT) -> bytes:
    """The payload served at ``address`` (``tcp://host:port``); ``LaunchError`` when it cannot
    be had within ``timeout`` (the launcher is gone, or the key is wrong)."""
    host, _, port = address.removeprefix(SCHEME).rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=_HELLO_TIMEOUT) as conn:
                conn.sendall(key.encode() + b"\n")
                conn.settimeout(timeout)
                data = _read_all(conn)
            if data:
                return data
            raise LaunchError(f"the launcher at {address} sent no plan (a wrong key?)")
        except (OSError, ValueError) as e:
            if time.monotonic() > deadline:
                raise LaunchError(f"cannot fetch the plan from the launcher at {address}: "
                                  f"{e}") from None
            time.sleep(0.2)


def _read_line(conn: socket.socket, limit: int) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) <= limit:
        chunk = conn.recv(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return data.rstrip(b"\n")


def _read_all(conn: socket.socket) -> bytes:
    parts, size = [], 0
    while chunk := conn.recv(1 << 20):
        size += len(chunk)
        if size > MAX_PAYLOAD_BYTES:
            raise ValueError(f"more than {MAX_PAYLOAD_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _address_toward(peer: str) -> str:
    """This host's address on the interface that reaches ``peer`` (no packet is sent); "" when
    no route says."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return ""
