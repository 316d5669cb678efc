"""A job's id when none is given: the name of its log directory (``npu_launch_logs/<id>``).

A new launch gets a new id (``20261130-101500-3fa2``). A Slurm batch job is the exception: when
Slurm requeues it (preemption, ``scontrol requeue``, a node failure with ``--requeue``) it runs
the same batch script again under the same ``SLURM_JOB_ID``, and the same command must find
its own log directory to resume from its checkpoints and continue its history. So inside a
batch script (Slurm sets ``ENVIRONMENT=BATCH`` there, and not in an ``salloc`` shell) the id is
``slurm-<SLURM_JOB_ID>-<8 hex digits of the command>``: the same command in the requeued job
gets the same id, and two commands of one batch script (train, then evaluate) get two.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import time
from typing import Mapping, Optional, Sequence

from launcher.errors import ConfigError
from launcher.limits import shown

JOB_ID = "SLURM_JOB_ID"
_BATCH = ("ENVIRONMENT", "BATCH")
_MAX_DIGITS = 18


def new_job_id() -> str:
    """Sortable and unique enough across one cluster: ``20261130-101500-3fa2``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def batch_job_id(environ: Mapping[str, str], script: str, script_args: Sequence[str]
                 ) -> Optional[str]:
    """``slurm-<SLURM_JOB_ID>-<command>`` inside a Slurm batch script, else None. A job id
    that is not ASCII digits is a ``ConfigError`` (it names a folder)."""
    if environ.get(_BATCH[0]) != _BATCH[1] or JOB_ID not in environ:
        return None
    job = environ[JOB_ID]
    if not (job.isascii() and job.isdigit() and len(job) <= _MAX_DIGITS):
        raise ConfigError(f"{JOB_ID} {shown(job)}: not a Slurm job id (at most {_MAX_DIGITS} "
                          "ASCII digits); give --job-id or --log-dir")
    command = "\0".join([os.path.abspath(script), *script_args])
    # A file name or argument that is not UTF-8 reaches Python as surrogate escapes ($'\xff'
    # is "\udcff"): "surrogatepass" gives every text the same bytes each time, so the
    # requeued job still finds its id.
    digest = hashlib.sha256(command.encode("utf-8", "surrogatepass")).hexdigest()
    return f"slurm-{job}-{digest[:8]}"
