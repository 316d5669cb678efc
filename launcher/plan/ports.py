"""Where the ranks meet: the scheduler's address (``MS_SCHED_HOST``, ``MASTER_ADDR``) and port
(``MASTER_PORT``)."""
from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Optional

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


def first_host_address(host: str) -> str:
    """The address of the job's first host, where the scheduler runs (no ``--master-addr``)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ConfigError(f"cannot resolve {host} (the first host, where the scheduler runs); "
                          "give --master-addr") from None


def master_address(given: Optional[str]) -> tuple[str, str]:
    """The scheduler's address as MindSpore takes it (an IP: it cannot parse a host name), and
    the name it was given as ("" for an address). A name is resolved here, once, on node 0 (or
    on each node of a job started by hand), to its IPv4 address, as msrun resolves
    ``--master_addr``; every rank then gets that address."""
    if not given:
        return "127.0.0.1", ""
    try:
        ipaddress.ip_address(given.strip("[]"))
        return given, ""
    except ValueError:
        pass
    try:
        return socket.gethostbyname(given), given
    except (OSError, UnicodeError) as e:
        raise ConfigError(f"--master-addr {given}: cannot resolve the name "
                          f"({getattr(e, 'strerror', None) or e}); give the scheduler host's "
                          "IP address") from None
