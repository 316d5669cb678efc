"""Ports for the job's rendezvous (MindSpore's scheduler, ``MASTER_PORT``)."""
from __future__ import annotations

import errno
import socket

from launcher.errors import ConfigError


def free_port(host: str) -> int:
    """A port the kernel says is free now on ``host``'s interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_bind_address(host), 0))
        return int(s.getsockname()[1])


def require_free(host: str, port: int, option: str = "--master-port") -> None:
    """Refuse a port something already listens on, before any process starts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((_bind_address(host), port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"{option} {port}: already in use on {host}") from None
            raise ConfigError(f"{option} {port}: cannot bind on {host}: {e.strerror}") from None


def _bind_address(host: str) -> str:
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return ""
    # A host name that resolves to another machine's address cannot be bound here: bind to all.
    return address if _is_local(address) else ""


def _is_local(address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
            return True
        except OSError:
            return False
