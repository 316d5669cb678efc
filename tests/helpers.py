"""What the tests share: paths, running npu-launch for real, finding the processes a job left
behind (by the job id in their environment, as the launcher does), reading what ranks wrote, fake
Ascend hosts, the parallel-layout strategy, and reading a test module's marks without importing it.

Tests import it as ``from helpers import ...``: pytest puts ``tests/`` on ``sys.path`` because
``tests/conftest.py`` sits in a folder without ``__init__.py`` (also for ``tests/multinode``).
Nothing here imports MindSpore.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional

import psutil
import pytest
from _pytest.mark.expression import Expression
from hypothesis import strategies as st
from polling import wait_for  # noqa: F401  (re-exported: the tests' one poll)

from launcher.cli.main import main
from launcher.run.strays import GUARDIAN_OF
from parallel import contract
from parallel.config import ParallelConfig, ParallelMode, ShardPolicy

if TYPE_CHECKING:
    from launcher.observe.monitor import JobMonitor

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
RANK_SCRIPTS = TESTS / "rank_scripts"
ASCEND_FIXTURES = TESTS / "fixtures" / "ascend"
RANK_TABLE_EXAMPLES = REPO / "rank_tables" / "examples"

# Running npu-launch ------------------------------------------------------------------------------

def npu_launch_argv(*args: str) -> list[str]:
    """``npu-launch ARGS`` as this interpreter runs it (never a ``python3`` found on PATH)."""
    return [sys.executable, "-m", "launcher.cli", *args]


def run_launcher(*args: str, cwd: Optional[Path] = None, env: Optional[dict] = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """Run npu-launch to the end; a generous timeout only guards the test run itself."""
    return subprocess.run(npu_launch_argv(*args), cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


class HangGuard(BaseException):
    """Raised in a command ``run_cli_here`` runs that outlived its guard: a ``BaseException``,
    so that npu-launch's last line of defence (``except Exception``) cannot take it for a bug."""


def run_cli_here(*args: str, cwd: Path, env: Optional[Mapping[str, str]] = None,
                 guard: float = 60.0) -> subprocess.CompletedProcess:
    """npu-launch's ``main`` run in this process, in ``cwd`` and with ``env`` as its whole
    environment (this one's when None): the exit code, stdout and stderr a process of it gives,
    without an interpreter that imports npu-launch each time (about a third of a second a
    case). Only for input that ends before any process starts: refused input, a dry run,
    ``report``, ``rank-table``. A launch is processes, and a test of one runs npu-launch as one
    (``run_launcher``), as do tests of what only a process has (argv bytes, closed descriptors,
    signals, memory bounds). ``guard``: seconds after which the command is interrupted and the
    test fails, as a hang (not a speed check)."""
    def interrupt(signum: int, frame: object) -> None:
        raise HangGuard(f"npu-launch {' '.join(args)[:200]} ran for {guard:g} s")

    cwd_before, env_before = os.getcwd(), dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        signal.setitimer(signal.ITIMER_REAL, guard)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(args))
        raise AssertionError(f"main({list(args)!r}) returned instead of exiting")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(cwd_before)
        os.environ.clear()
        os.environ.update(env_before)
    return subprocess.CompletedProcess(["npu-launch", *args], code, out.getvalue(), err.getvalue())


def start_job(log_dir: Path, job_id: str, script: str, *script_args: str, cards: int = 2,
              options: Iterable[str] = (), env: Optional[dict] = None) -> subprocess.Popen:
    """A job of ``cards`` CPU ranks on this host, started and not waited for (its output piped):
    ``npu-launch --device cpu --cards N --job-id ID --log-dir DIR --kill-timeout 3 OPTIONS
    SCRIPT ARGS``. The one way the single-node tests start a job they watch, signal or kill
    while it runs; ``run_launcher`` runs one to the end."""
    argv = npu_launch_argv("--device", "cpu", "--cards", str(cards), "--job-id", job_id,
                           "--log-dir", str(log_dir), "--kill-timeout", "3", *options, script,
                           *script_args)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


UNWRITABLE_STDOUTS = ("/dev/full", "closed", "a pipe nobody reads")
"""The standard outputs a command cannot write to, as ``run_unwritable`` makes them."""


def run_unwritable(argv: list[str], stdout: str, cwd: Optional[Path] = None,
                   timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``argv`` to the end with one of ``UNWRITABLE_STDOUTS`` as its standard output (and
    its stderr captured)."""
    if stdout == "a pipe nobody reads":
        read, write = os.pipe()
        os.close(read)
        out = os.fdopen(write, "wb")
    else:
        out = open(os.devnull if stdout == "closed" else stdout, "wb")
    with out:
        return subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.PIPE, text=True,
                              timeout=timeout,
                              preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None)


def run_torchrun(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 script``; if it outlives the guard, its whole
    session is killed (torchrun's workers would outlive a torchrun killed alone)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            script]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)

def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, no traceback, and one line ``npu-launch: error: ...`` holding every needle: the
    bad-input rule. Returns the line."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:] + result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("npu-launch: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


_MERGED = re.compile(r"^\[((?:[^\]\s:]+:[0-9,-]+ ?)+)\] (.*)$")


def per_rank(stdout: str) -> str:
    """``stdout`` with each line that the console merged for several ranks (``[vm:0-1] x``,
    ``[a:0 b:1] x``) written out once per rank (``[vm:0] x``, ``[vm:1] x``)."""
    lines = []
    for line in stdout.splitlines():
        match = _MERGED.match(line)
        if match is None:
            lines.append(line)
            continue
        for group in match.group(1).split():
            host, _, runs = group.rpartition(":")
            for run in runs.split(","):
                first, _, last = run.partition("-")
                lines += [f"[{host}:{r}] {match.group(2)}"
                          for r in range(int(first), int(last or first) + 1)]
    return "\n".join(lines)


GOLDEN = TESTS / "golden"
UPDATE_GOLDEN = "NPU_LAUNCH_UPDATE_GOLDEN"


def assert_golden(path: Path, text: str, what: str) -> None:
    """``text`` must equal the golden file ``path`` (under ``tests/golden``); with
    ``NPU_LAUNCH_UPDATE_GOLDEN=1`` the file is rewritten instead and the test skipped, to review
    the diff."""
    if os.environ.get(UPDATE_GOLDEN) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.skip(f"rewrote the golden file {path} instead of comparing: review the diff")
    refresh = f"{UPDATE_GOLDEN}=1 python -m pytest {path.relative_to(GOLDEN)}'s test"
    assert path.exists(), f"no golden file {path}: create it with {refresh}"
    assert text == path.read_text(encoding="utf-8"), (
        f"{what} differs from the golden file {path}. If the change is intended, refresh with "
        f"{refresh} and review the diff.")


def checksums(stdout: str) -> dict[str, str]:
    """``{"[host:rank]": checksum}`` from the ``checksum`` lines the rank scripts print (merged
    console lines counted for each of their ranks)."""
    return {line.split("]")[0] + "]": line.split()[-1] for line in per_rank(stdout).splitlines()
            if " checksum " in line}


# Processes of a job ------------------------------------------------------------------------------

_WORKER = "PYTEST_XDIST_WORKER"


def _of_another_worker(proc: psutil.Process) -> bool:
    """Whether ``proc`` was started by another pytest-xdist worker (its environment names
    that worker): tests of two workers may use the same job id at once, and one worker's
    churn may give a pid a finished job had to the other's process. Processes started over
    ssh name no worker, and every multi-node test runs on one worker."""
    theirs = proc.environ().get(_WORKER)
    return theirs is not None and theirs != os.environ.get(_WORKER)


def job_pids(job_id: str, variable: str = contract.JOB_ID) -> list[int]:
    """Processes of this test run's worker whose environment carries ``variable=job_id``
    (``NPU_LAUNCH_JOB_ID``: the job's own processes)."""
    pids = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(variable) == job_id and proc.status() != "zombie" \
                    and not _of_another_worker(proc):
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


def worker_pid(job_id: str, rank: int) -> int:
    """The pid of the job's MindSpore worker ``rank``; fails the test when there is none."""
    for pid in job_pids(job_id):
        try:
            env = psutil.Process(pid).environ()
        except psutil.Error:
            continue
        if is_worker(env, rank):
            return pid
    raise AssertionError(f"job {job_id} runs no worker of rank {rank}")


def is_worker(env: Mapping[str, str], rank: int) -> bool:
    """Whether a process of that environment is the MindSpore worker ``rank`` (not the
    scheduler, a spare or a guardian)."""
    return env.get("RANK_ID") == str(rank) and env.get("MS_ROLE") == "MS_WORKER"


def alive(pid: int) -> bool:
    """Running (a zombie, or a process gone while we looked, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def guardian_pids(job_id: str) -> list[int]:
    """This test run's guardians of the job (``launcher.run.strays.Guardian``)."""
    return job_pids(job_id, GUARDIAN_OF)


def assert_no_job_processes(job_id: str, pids: tuple[int, ...] = ()) -> None:
    """Nothing of the job runs: neither by job id nor any pid seen while it ran, nor the job's
    guardian."""
    left = job_pids(job_id) + guardian_pids(job_id)
    running = [p for p in pids if alive(p) and not _another_workers_pid(p)]
    assert not left and not running, \
        f"job {job_id} left processes: {[_described(p) for p in left or running]}"


def _another_workers_pid(pid: int) -> bool:
    try:
        return _of_another_worker(psutil.Process(pid))
    except psutil.Error:
        return False


def _described(pid: int) -> str:
    """``pid (status) command line``, for a message."""
    try:
        proc = psutil.Process(pid)
        return f"{pid} ({proc.status()}, parent {proc.ppid()}) {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"{pid} (gone)"


# What ranks wrote --------------------------------------------------------------------------------

def read_events(log_dir: Path, rank: int) -> list[dict]:
    """Rank ``rank``'s events: in ``log_dir/events`` (one node) or ``log_dir/hosts/*/events``."""
    name = f"rank_{rank}.jsonl"
    candidates = [log_dir / "events" / name, *sorted(log_dir.glob(f"hosts/*/events/{name}"))]
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def initialised(log_dir: Path, ranks: range) -> bool:
    """Every rank in ``ranks`` reported ``initialised``."""
    return all(any(e["event"] == "initialised" for e in read_events(log_dir, r)) for r in ranks)


# Fake Ascend hosts (tests/fixtures/ascend/README.md) ---------------------------------------------

DRIVER_NODES = ("davinci_manager", "devmm_svm", "hisi_hdc")
"""Device nodes the Ascend driver adds beside ``davinciN``; readers must ignore them."""


def sparse(size: int) -> Callable[[Path], None]:
    """A maker of a file that claims ``size`` bytes and holds none (a hostile-input fixture)."""
    def make(path: Path) -> None:
        with open(path, "wb") as f:
            f.truncate(size)
    return make


def to_dev_zero(path: Path) -> None:
    """Make ``path`` a link to ``/dev/zero``: endless bytes, not a regular file."""
    path.symlink_to("/dev/zero")


def feed(monitor: "JobMonitor", record: dict) -> None:
    """Hand ``record`` to ``monitor`` as the launcher's edge does: parsed into an ``Event``, or
    dropped when it names no event kind or no rank."""
    event = contract.Event.parse(record)
    if event is not None:
        monitor.on_event(event)


def exited(monitor: "JobMonitor", rank: int, returncode: Optional[int],
           hosts: Mapping[int, str] = {}, at: float = 1000.0) -> None:
    """What a supervisor tells ``monitor`` when ``rank``'s process ended."""
    monitor.on_event(contract.Event.exited(rank, hosts.get(rank, "?"), returncode, at))


def fake_devfs(directory: Path, devices: Iterable[int]) -> Path:
    """A stand-in for an Ascend host's ``/dev``: ``davinciN`` plain files plus the driver's nodes."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in [f"davinci{n}" for n in devices] + list(DRIVER_NODES):
        (directory / name).touch()
    return directory


def fake_ascend_env(root: Path, devices: Iterable[int], kind: str = "a2_host") -> dict[str, str]:
    """Environment variables that make this machine a fake Ascend host of ``kind``.

    ``kind`` is a folder of ``tests/fixtures/ascend`` (``a2_host``, ``a3_host``): its devfs is made
    under ``root``, the fake ``hccn_tool``/``npu-smi`` come first on ``PATH`` and read that
    folder's files. Merge the result into ``os.environ`` for subprocesses.
    """
    return {"NPU_LAUNCH_DEVFS": str(fake_devfs(root / f"{kind} dev", devices)),
            "PATH": f"{ASCEND_FIXTURES / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "FAKE_ASCEND_NIC_CONF": str(ASCEND_FIXTURES / kind / "hccn.conf"),
            "FAKE_NPU_SMI_DIR": str(ASCEND_FIXTURES / kind)}


# Parallel layouts ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """A world of ``world`` ranks on ``nnodes`` nodes and a ``ParallelConfig`` that fits it."""

    world: int
    nnodes: int
    config: ParallelConfig


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _stages_fit_nodes(pp: int, nnodes: int) -> bool:
    return pp == 1 or nnodes == 1 or nnodes % pp == 0 or pp % nnodes == 0


@st.composite
def layouts(draw: st.DrawFn, max_world: int = 16, nnodes: Optional[st.SearchStrategy] = None,
            full_batch: st.SearchStrategy = st.booleans()) -> Layout:  # noqa: B008 (immutable)
    """Valid layouts: every rule in ``parallel/config.py``'s docstring holds for them.

    ``dp*mp*pp == world`` (``dp`` given or left out), ``micro_batches >= pp``, the global batch
    (when given) divides by ``dp*micro_batches``, pipeline stages align with nodes, mode ``data``
    only with ``mp == pp == 1``, ``full_batch`` only in ``semi``/``auto``. ``nnodes`` defaults to
    one node; pass a strategy for several.
    """
    world = draw(st.integers(1, max_world))
    node_count = draw(nnodes if nnodes is not None else st.just(1))
    pp = draw(st.sampled_from([d for d in _divisors(world) if _stages_fit_nodes(d, node_count)]))
    mp = draw(st.sampled_from(_divisors(world // pp)))
    dp = world // (mp * pp)
    modes = [ParallelMode.SEMI, ParallelMode.AUTO] + ([ParallelMode.DATA] if mp == pp == 1 else [])
    mode = draw(st.sampled_from(modes))
    micro_batches = pp * draw(st.integers(1, 3)) + draw(st.integers(0, pp - 1))
    global_batch = draw(st.none() | st.integers(1, 8).map(lambda k: k * dp * micro_batches))
    config = ParallelConfig(
        mode=mode, dp=draw(st.sampled_from([None, dp])), mp=mp, pp=pp, micro_batches=micro_batches,
        optimizer_shard=draw(st.booleans()), gradients_mean=draw(st.booleans()),
        full_batch=mode is not ParallelMode.DATA and draw(full_batch), global_batch=global_batch,
        seed=draw(st.integers(0, 2**31)), shard_policy=draw(st.sampled_from(ShardPolicy)))
    return Layout(world, node_count, config)


# A process started by hand ------------------------------------------------------------------------

def launcher_variables(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` that would make a process a rank of some job: the rank identity
    of every launcher ``contract.RankIdentity`` reads, MindSpore's ``MS_*`` and npu-launch's own."""
    identity = {name for names in contract.RankIdentity.SOURCES.values() for name in names}
    return [name for name in environ
            if name in identity or name.startswith(("MS_", contract.PREFIX))]


# Test modules -------------------------------------------------------------------------------------

def module_marks(path: Path) -> frozenset[str]:
    """The marks a test module puts on all its tests (``pytestmark = pytest.mark.X`` or a list
    of them), read from its source: the module is not imported."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return frozenset()
    marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            marks.update(_mark_name(v) for v in values if _mark_name(v))
    return frozenset(marks)


def _mark_name(node: ast.expr) -> str:
    """``pytest.mark.NAME`` (optionally called) -> ``NAME``; anything else -> ``""``."""
    if isinstance(node, ast.Call):
        node = node.func
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "mark"):
        return node.attr
    return ""


_IDENT = re.compile(r"(?:\w|:|\+|-|\.|\[|\]|\\|/)+")  # pytest's -m identifier
_KEYWORDS = {"and", "or", "not", "True", "False", "None"}


def rejects_marks(markexpr: str, marks: frozenset[str]) -> bool:
    """True when no test carrying ``marks`` can match the ``-m`` expression, whatever other
    marks it has (every combination of the other names in the expression is tried)."""
    expression = Expression.compile(markexpr)
    others = sorted(set(_IDENT.findall(markexpr)) - _KEYWORDS - marks)
    for chosen in itertools.product((False, True), repeat=len(others)):
        present = marks | {name for name, on in zip(others, chosen) if on}
        if expression.evaluate(lambda name, present=present, **kwargs: name in present):
            return False
    return True
