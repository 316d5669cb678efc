"""Warm spares: the next attempt's processes on this node, started during this one with the
framework already imported, so a restart does not pay MindSpore's import again (1.8 s of its
5.5 s from the fault to the next first step on this machine, BENCHMARKS.md).

A node's ``LocalRanks`` asks for them once its ranks all trained a first step (or initialised
10 s ago), when another attempt may follow and every rank said it began importing MindSpore
with the environment and ``sys.path`` it was started with (``RankRecord.kept``): a script that
sets ``GLOG_v`` or puts another MindSpore on ``sys.path`` before its import would not run the
same in a process that imported MindSpore already. One spare per process of the node: each
rank, and the scheduler where the node runs it. Each runs the process's own command in its
own session with its environment, plus ``NPU_LAUNCH_SPARE`` and a token of its own; the rank
side (``parallel.hook.spare``) imports the framework and waits on its stdin.

The next attempt's ``LocalRanks`` takes the spare of each process whose command, working
directory and environment are the same but for what names the attempt (``ATTEMPT_KEYS``), and
its ``ProcessGroup`` adopts it: the go (that attempt's environment, one line), then the output
pumped and the process watched and closed like any it started. A spare that ended, or differs,
is ended and the process started anew. What is left at the end of the launch is ended by
``close``; a launcher that dies takes them with it (their parent-death signal, set before the
import). The failed attempt's stray sweep passes them by: they carry their own token, which
``close`` sweeps.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import secrets
import signal
import subprocess
from typing import Mapping, Optional

import psutil

from launcher.plan.launch_plan import ProcessSpec
from launcher.run.strays import kill_job_strays
from parallel import contract

ATTEMPT_KEYS = frozenset({contract.RESTART, contract.TORCHELASTIC_RESTART_COUNT,
                          contract.RESUME_STEP, contract.CHECKPOINT})
"""What differs between two attempts' environments of one process. (A ``{checkpoint}``
argument that changed is no spare's: the spare's own arguments were read at its start.)"""


def process_env(base_env: Mapping[str, str], spec: ProcessSpec) -> dict[str, str]:
    """``spec``'s environment: this launcher as its parent, and no rank's pid inherited (a
    launcher started inside a rank would otherwise leave its own ranks unhooked), nor a spare's
    mark (every rank would wait for a go that never comes, and end 0 without running)."""
    env = {**base_env, **spec.env, contract.PARENT_PID: str(os.getpid())}
    env.pop(contract.RANK_PID, None)
    env.pop(contract.SPARE, None)
    return env


@dataclasses.dataclass
class Spare:
    """One warm process: what it stands in for, and the ends of its pipes this launcher holds."""

    spec: ProcessSpec
    proc: subprocess.Popen
    output: int
    """The read end of its stdout and stderr (nothing reads it until it is adopted)."""
    go_pipe: Optional[int]
    """The write end of its stdin, until the go is written."""

    def go(self, env: Mapping[str, str]) -> bool:
        """Write the go; False when it could not be written whole at once (a spare that ended,
        an environment larger than the pipe takes): the spare is then ended by its end of file."""
        fd, self.go_pipe = self.go_pipe, None
        if fd is None:
            return False
        data = (json.dumps(dict(env)) + "\n").encode()
        try:
            os.set_blocking(fd, False)
            return os.write(fd, data) == len(data)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EPIPE):
                raise
            return False
        finally:
            os.close(fd)

    def end(self) -> None:
        """SIGKILL its session (it ran nothing of the user's yet), reap it, close its pipes."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
        for fd in (self.output, self.go_pipe):
            if fd is not None:
                os.close(fd)
        self.go_pipe = None


class Spares:
    """This node's warm spares, for the launch's life (an attempt's group ends with it)."""

    def __init__(self, base_env: Mapping[str, str], workdir: str, node_rank: int) -> None:
        self._base_env = dict(base_env)
        self._workdir = workdir
        self._node_rank = node_rank
        self._token = secrets.token_hex(16)
        self._spares: dict[str, Spare] = {}
        self.wanted = True
        """Whether another attempt may follow the running one: spares stand by only then."""

    def stand_by(self, specs: tuple[ProcessSpec, ...], framework: str) -> None:
        """Start a spare for each of ``specs`` that has none, if ``wanted``."""
        if not self.wanted:
            return
        for spec in specs:
            if spec.label not in self._spares:
                spare = self._start(spec, framework)
                if spare is not None:
                    self._spares[spec.label] = spare

    def take(self, spec: ProcessSpec) -> Optional[Spare]:
        """The spare that can become ``spec``, now this launch's to adopt; None when there is
        none (one that ended or differs is ended)."""
        spare = self._spares.pop(spec.label, None)
        if spare is None:
            return None
        if spare.proc.poll() is None and _same_but_attempt(spare.spec, spec):
            return spare
        spare.end()
        return None

    def close(self) -> None:
        """End every spare not taken; idempotent."""
        spares, self._spares = list(self._spares.values()), {}
        for spare in spares:
            spare.end()
        if spares:
            psutil.wait_procs(kill_job_strays(self._token, self._node_rank), timeout=5.0)

    def __contains__(self, label: object) -> bool:
        """Whether a spare stands by for the process of that label."""
        return label in self._spares

    def _start(self, spec: ProcessSpec, framework: str) -> Optional[Spare]:
        env = {**process_env(self._base_env, spec), contract.TOKEN: self._token,
               contract.SPARE: framework}
        output, write_end = os.pipe()
        go_read, go_pipe = os.pipe()
        try:
            proc = subprocess.Popen(list(spec.command), env=env, cwd=self._workdir,
                                    stdin=go_read, stdout=write_end, stderr=write_end,
                                    start_new_session=True)
        except OSError:  # the restart starts it anew, and says why if it cannot
            os.close(output)
            os.close(go_pipe)
            return None
        finally:
            os.close(write_end)
            os.close(go_read)
        return Spare(spec, proc, output, go_pipe)


def _same_but_attempt(a: ProcessSpec, b: ProcessSpec) -> bool:
    def bare(spec: ProcessSpec) -> ProcessSpec:
        env = {k: v for k, v in spec.env.items() if k not in ATTEMPT_KEYS}
        return dataclasses.replace(spec, env=env)
    return bare(a) == bare(b)
