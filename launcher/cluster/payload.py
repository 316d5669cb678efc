"""What agents fetch from the launcher (the plan for srun and mpirun, checkpoint replicas) and
what they send it (checkpoint files node 0 collects).

ssh feeds each agent its plan on stdin. srun and mpirun start every agent with one command
line, so for the job's life the launcher serves the payload on a TCP port of its own host, on
the interface that reaches node 0 (``PayloadServer``). Each agent connects (``fetch``), proves
it belongs to this launch with a key (in its environment for srun and mpirun: an environment,
unlike a command line, is private to its owner; srun passes it on by default, mpirun with
``-x``; in the payload for ssh), and asks for the plan, or, on a restart, for the replica that
stands in for a rank whose checkpoint file its host lacks (``launcher.checkpoints.ledger``). A wrong
key, a bad request, or a client that says nothing for a few seconds is disconnected with
nothing sent. One request per connection: ``<key> plan``, ``<key> replica <rank>``, or
``<key> upload <rank> <step> <size> <sha256> <name>`` followed by the file's bytes: a checkpoint
file an agent sends node 0 in the background of its ranks (``launcher.cluster.collect``). The server
takes it only if every field is sane (ASCII digits, a sha256 in hex, a plain file name) and its
``UploadReceiver`` (node 0's ledger) accepts the rank, step and size; it receives the bytes into
the receiver's staging folder, checks their count and sha256 against what it was told, and only
then hands the file to the receiver, which moves it into place atomically, and answers ``ok``.
Anything else is dropped with nothing written.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import tempfile
import threading
import time
from typing import BinaryIO, Callable, Iterator, Mapping, Optional

from launcher.checkpoints.uploads import Upload, UploadReceiver, digits
from launcher.errors import LaunchError

SCHEME = "tcp://"
_HELLO_TIMEOUT = 5.0
_BODY_TIMEOUT = 60.0
"""An upload that sends nothing for this long is dropped."""
_MAX_REQUEST = 400
_MAX_CLIENTS = 1100
"""Connections served at once: every agent of the largest job (1024 nodes) may ask together."""
_CONNECT_TIMEOUT = 60.0
MAX_PAYLOAD_BYTES = 1 << 30
"""A plan larger than this is not a plan."""
_OK = b"ok\n"


class PayloadServer:
    """Serves ``payload``, and the files of ``replicas`` (rank -> path), to every client that
    sends ``key``, and hands the uploads it takes to ``receiver``, until ``close``."""

    def __init__(self, payload: bytes, toward: str, replicas: Mapping[int, str] = {},
                 on_sent: Callable[[int, float], None] = lambda size, seconds: None,
                 receiver: Optional[UploadReceiver] = None) -> None:
        self.key = secrets.token_hex(16)
        self.payload = payload
        """What ``plan`` requests get; may be set once the server's address is known."""
        self._on_sent = on_sent
        self._replicas = dict(replicas)
        self._receiver = receiver
        self._answering: set[threading.Thread] = set()
        self._answering_lock = threading.Lock()
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
        """Stop taking connections; give those being answered (an upload ending as its agent
        stops) until the hello timeout to finish."""
        self._closed.set()
        self._thread.join()
        self._sock.close()
        deadline = time.monotonic() + _HELLO_TIMEOUT
        with self._answering_lock:
            answering = list(self._answering)
        for thread in answering:
            thread.join(max(deadline - time.monotonic(), 0.0))

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
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            with self._answering_lock:
                self._answering.add(thread)
            thread.start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, _released(self._slots):
            conn.settimeout(_HELLO_TIMEOUT)
            try:
                line, body = _read_line(conn, _MAX_REQUEST)
                key, _, request = line.partition(b" ")
                if hmac.compare_digest(key, self.key.encode()):
                    self._send(conn, request.decode("ascii", "replace").split(), body)
            except OSError:
                pass
            finally:
                with self._answering_lock:
                    self._answering.discard(threading.current_thread())

    def _send(self, conn: socket.socket, request: list[str], body: bytes) -> None:
        if request == ["plan"]:
            conn.sendall(self.payload)
        elif len(request) == 2 and request[0] == "replica" and digits(request[1]) \
                and int(request[1]) in self._replicas:
            started = time.monotonic()
            with open(self._replicas[int(request[1])], "rb") as f:
                size = conn.sendfile(f)
            self._on_sent(size, time.monotonic() - started)
        elif request[:1] == ["upload"] and self._receiver is not None:
            upload = Upload.parse(request[1:])
            if upload is not None and self._receiver.accepts(upload):
                self._receive(conn, upload, body, self._receiver)

    def _receive(self, conn: socket.socket, upload: Upload, body: bytes,
                 receiver: UploadReceiver) -> None:
        """The upload's bytes into a file of ``receiver.staging``, checked, then handed over;
        ``ok`` once it is in place. Whatever fails leaves no file behind."""
        started = time.monotonic()
        conn.settimeout(_BODY_TIMEOUT)
        os.makedirs(receiver.staging, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".rank_{upload.rank}.", dir=receiver.staging)
        try:
            with os.fdopen(fd, "wb") as f:
                intact = _receive_exactly(conn, f, upload, body)
                if intact:
                    f.flush()
                    os.fsync(f.fileno())
            if intact and receiver.received(upload, tmp, time.monotonic() - started):
                conn.sendall(_OK)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


@contextlib.contextmanager
def _released(slots: threading.BoundedSemaphore) -> Iterator[None]:
    try:
        yield
    finally:
        slots.release()


def _receive_exactly(conn: socket.socket, sink: BinaryIO, upload: Upload, body: bytes) -> bool:
    """Exactly ``upload.size`` bytes (``body`` came with the request line), then the end of
    the stream, written to ``sink``; whether their sha256 is the one the upload named."""
    digest = hashlib.sha256()
    if len(body) > upload.size:
        return False
    remaining = upload.size - len(body)
    chunk = body
    while True:
        digest.update(chunk)
        sink.write(chunk)
        if not remaining:
            break
        chunk = conn.recv(min(remaining, 1 << 20))
        if not chunk:
            return False  # the agent stopped short
        remaining -= len(chunk)
    return conn.recv(1) == b"" and hmac.compare_digest(digest.hexdigest(), upload.sha256)


@contextlib.contextmanager
def serving(payload: bytes, toward: str, replicas: Mapping[int, str] = {},
            on_sent: Callable[[int, float], None] = lambda size, seconds: None,
            receiver: Optional[UploadReceiver] = None) -> Iterator[PayloadServer]:
    """A ``PayloadServer`` for the ``with`` block; ``on_sent(bytes, seconds)`` after each
    replica it sent; uploads go to ``receiver`` (none: refused)."""
    server = PayloadServer(payload, toward, replicas, on_sent, receiver)
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
    while True:
        conn = _connect(address, f"fetch {request!r} from", timeout)
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


def upload_file(address: str, key: str, upload: Upload, path: str,
                timeout: float = _BODY_TIMEOUT) -> None:
    """Send the first ``upload.size`` bytes of ``path`` to the launcher at ``address``;
    ``LaunchError`` unless it answers that the file is in place (it refused the upload, the
    bytes were not what the upload said, the launcher is gone)."""
    with _connect(address, f"send {path} to", timeout) as conn:
        try:
            conn.sendall(f"{key} {upload.request()}\n".encode())
            conn.settimeout(timeout)
            with open(path, "rb") as f:
                sent = conn.sendfile(f, 0, upload.size) if upload.size else 0
            conn.shutdown(socket.SHUT_WR)
            answer = b""
            while len(answer) < len(_OK) and (chunk := conn.recv(len(_OK))):
                answer += chunk
        except (OSError, OverflowError) as e:  # the launcher hung up on it, or is gone
            raise LaunchError(f"the launcher at {address} did not take {path}: {e}") from None
    if answer != _OK:
        short = f" ({sent} of {upload.size} bytes were there)" if sent < upload.size else ""
        raise LaunchError(f"the launcher at {address} did not take {path}{short}")


def _connect(address: str, what: str, timeout: float) -> socket.socket:
    """A connection to the launcher at ``address``, tried again until ``timeout``; the error
    says ``cannot <what> the launcher``."""
    host, _, port = address.removeprefix(SCHEME).rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=_HELLO_TIMEOUT)
        except (OSError, ValueError) as e:
            if time.monotonic() > deadline:
                raise LaunchError(f"cannot {what} the launcher at {address}: {e}") from None
            time.sleep(0.2)


def _read_line(conn: socket.socket, limit: int) -> tuple[bytes, bytes]:
    """The first line (up to ``limit`` bytes, without its newline) and what came after it."""
    data = b""
    while b"\n" not in data and len(data) <= limit:
        chunk = conn.recv(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


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
