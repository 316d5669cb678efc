"""What preflight asks each host: ``python -m launcher.probe [--port P]`` prints one JSON line.

Runs on the remote host with the same Python node 0 uses; imports nothing heavy (MindSpore's
version comes from its installed metadata, not from importing it).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from importlib import metadata
from typing import Optional

from launcher import __version__
from launcher.devices import find_cards


def report(port: Optional[int]) -> dict:
    return {
        "hostname": socket.gethostname(),
        "npu_launch": __version__,
        "mindspore": _version("mindspore"),
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "cards": len(find_cards(os.environ)),
        "port_free": _port_free(port) if port else None,
    }


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m launcher.probe")
    parser.add_argument("--port", type=int, default=None)
    print(json.dumps(report(parser.parse_args().port)))


if __name__ == "__main__":
    main()
