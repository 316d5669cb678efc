"""What agents fetch from the launcher: the plan (srun, mpirun) and checkpoint replicas.

ssh feeds each agent its plan on stdin. srun and mpirun start every agent with one command
line, so for the job's life the launcher serves the payload on a TCP port of its own host, on
the interface that reaches node 0 (``PayloadServer``). Each agent connects (``fetch``), proves
it belongs to this launch with a key (in its environment for srun and mpirun: an environment,
unlike a command line, is private to its owner; srun passes it on by default, mpirun with
``-x``; in the payload for ssh), and asks for the plan, or, on a restart, for the replica that
stands in for a rank whose checkpoint file its host lacks (``launcher.checkpoints``). A wrong
key, a bad request, or a client that says nothing for a few seconds is disconnected with
nothing sent. One request per connection: ``<key> plan`` or ``<key> replica <rank>``.
"""
from __future__ import annotations

import contextlib
import hmac
import secrets
import socket
import threading
import time
from typing import Callable, Iterator, Mapping

from launcher.errors import LaunchError

SCHEME = "tcp://"
_HELLO_TIMEOUT = 5.0
_MAX_REQUEST = 200
_MAX_CLIENTS = 1100
"""Connections served at once: every agent of the largest job (1024 nodes) may ask together."""
_CONNECT_TIMEOUT = 60.0
MAX_PAYLOAD_BYTES = 1 << 30
"""A plan larger than this is not a plan."""


class PayloadServer:
    """Serves ``payload``, and the files of ``replicas`` (rank -> path), to every client that
    sends ``key``, until ``close``."""

    def __init__(self, payload: bytes, toward: str, replicas: Mapping[int, str] = {},
                 on_sent: Callable[[int, float], None] = lambda size, seconds: None) -> None:
        self.key = secrets.token_hex(16)
        self.payload = payload
        """What ``plan`` requests get; may be set once the server's address is known."""
        self._on_sent = on_sent
        self._replicas = dict(replicas)
        host = _address_toward(toward)
        self._sock = socket.create_server((host or "0.0.0.0", 0))
        self._sock.settimeout(0.2)
        port = self._sock.getsockname()[1]
        self.address = f"{SCHEME}{host or socket.gethostname()}:{port}"
        self._closed = threading.Event()
        self._slots = threading.BoundedSemaphore(_MAX_CLIENTS)
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
            if not self._slots.acquire(blocking=False):
                conn.close()  # more callers at once than a job has agents: not ours
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, _released(self._slots):
            conn.settimeout(_HELLO_TIMEOUT)
            try:
                key, _, request = _read_line(conn, _MAX_REQUEST).partition(b" ")
                if hmac.compare_digest(key, self.key.encode()):
                    self._send(conn, request.decode("ascii", "replace").split())
            except OSError:
                pass

    def _send(self, conn: socket.socket, request: list[str]) -> None:
        if request == ["plan"]:
            conn.sendall(self.payload)
        elif len(request) == 2 and request[0] == "replica" and request[1].isascii() \
                and request[1].isdigit() and int(request[1]) in self._replicas:
            started = time.monotonic()
            with open(self._replicas[int(request[1])], "rb") as f:
                size = conn.sendfile(f)
            self._on_sent(size, time.monotonic() - started)


@contextlib.contextmanager
def _released(slots: threading.BoundedSemaphore) -> Iterator[None]:
    try:
        yield
    finally:
        slots.release()


@contextlib.contextmanager
def serving(payload: bytes, toward: str, replicas: Mapping[int, str] = {},
            on_sent: Callable[[int, float], None] = lambda size, seconds: None
            ) -> Iterator[PayloadServer]:
    """A ``PayloadServer`` for the ``with`` block; ``on_sent(bytes, seconds)`` after each
    replica it sent."""
    server = PayloadServer(payload, toward, replicas, on_sent)
    try:
        yield server
    finally:
        server.close()


def fetch(address: str, key: str, request: str = "plan", timeout: float = _CONNECT_TIMEOUT,
          limit: int = MAX_PAYLOAD_BYTES) -> bytes:
    """What the launcher at ``address`` (``tcp://host:port``) serves for ``request`` (``plan``,
    ``replica <rank>``), at most ``limit`` bytes; ``LaunchError`` when it cannot be had within
    ``timeout`` (the launcher is gone, the key is wrong, it has no such thing)."""
    parts: list[bytes] = []
    fetch_into(address, key, request, parts.append, timeout, limit)
    return b"".join(parts)


def fetch_into(address: str, key: str, request: str, sink: Callable[[bytes], object],
               timeout: float = _CONNECT_TIMEOUT, limit: int = MAX_PAYLOAD_BYTES) -> int:
    """``fetch``, handing the bytes to ``sink`` as they come (a file: a replica may be larger
    than memory); returns how many came."""
    host, _, port = address.removeprefix(SCHEME).rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=_HELLO_TIMEOUT)
        except (OSError, ValueError) as e:
            if time.monotonic() > deadline:
                raise LaunchError(f"cannot fetch {request!r} from the launcher at {address}: "
                                  f"{e}") from None
            time.sleep(0.2)
            continue
        with conn:
            try:
                conn.sendall(f"{key} {request}\n".encode())
                conn.settimeout(timeout)
                size = _read_all(conn, sink, limit)
            except OSError as e:
                raise LaunchError(f"fetching {request!r} from the launcher at {address}: "
                                  f"{e}") from None
        if size:
            return size
        raise LaunchError(f"the launcher at {address} sent nothing for {request!r} "
                          "(a wrong key, or nothing to send)")


def _read_line(conn: socket.socket, limit: int) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) <= limit:
        chunk = conn.recv(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return data.rstrip(b"\n")


def _read_all(conn: socket.socket, sink: Callable[[bytes], object], limit: int) -> int:
    size = 0
    while chunk := conn.recv(1 << 20):
        size += len(chunk)
        if size > limit:
            raise LaunchError(f"the launcher sent more than {limit} bytes")
        sink(chunk)
    return size


def _address_toward(peer: str) -> str:
    """This host's address on the interface that reaches ``peer`` (no packet is sent); "" when
    no route says."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return ""
