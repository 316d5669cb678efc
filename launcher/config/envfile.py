"""The environment a multi-node job carries to other hosts.

A remote rank starts from its host's login environment; on top of that it gets what node 0's
environment holds under the prefixes below, then ``.npu_launch_env`` (``KEY=VALUE`` lines,
``#`` comments; in the launch directory, else the home directory), then what the plan sets
itself (a ``RANK`` or an ``NPU_LAUNCH_TOKEN`` in node 0's environment is not every rank's),
then ``--env``. The file, like ``--env``, may not name a variable npu-launch sets.
"""
from __future__ import annotations

import os
from typing import Mapping

from launcher.errors import ConfigError
from launcher.limits import ENV_NAME, read_bounded_text, shown
from parallel import contract

FORWARDED_PREFIXES = ("MS_", "HCCL_", "ASCEND_", "PYTHON", contract.PREFIX, "GLOG_", "OMP_",
                      "LD_LIBRARY_PATH")
ENV_FILE = ".npu_launch_env"
# Set per process by the plan itself; node 0's values would be wrong elsewhere.
_NOT_FORWARDED = ("PYTHONPATH",)


def forwarded_env(environ: Mapping[str, str], workdir: str) -> dict[str, str]:
    env = {k: v for k, v in environ.items()
           if k.startswith(FORWARDED_PREFIXES) and k not in _NOT_FORWARDED}
    path = env_file_path(workdir)
    if path:
        env.update(read_env_file(path))
    return env


def env_file_path(workdir: str) -> str:
    for folder in (workdir or ".", os.path.expanduser("~")):
        path = os.path.join(folder, ENV_FILE)
        if os.path.isfile(path):
            return path
    return ""


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` per line; the value is kept as written, spaces and quotes included."""
    env = {}
    for number, line in enumerate(read_bounded_text(path, "env file").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not ENV_NAME.fullmatch(key) or "\0" in value:
            raise ConfigError(f"{path}:{number}: expected KEY=VALUE, got {shown(line.strip())}")
        owner = contract.owner_of(key)
        if owner:  # as --env: every rank would get node 0's value (RANK=5 in all of them)
            raise ConfigError(f"{path}:{number}: {key}: npu-launch sets {key} in every rank "
                              f"itself ({owner})")
        env[key] = value
    return env
