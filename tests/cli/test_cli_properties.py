"""The CLI surface under generated and mutated input (issue 10's property).

For every input, run through the real ``npu-launch`` in its own process under a memory bound:
exit 0 or 2, no traceback, and on exit 2 one ``npu-launch: error:`` line, no process started
(the script leaves a marker when it runs) and no log directory made. The inputs are options
(the command's own, misspelt ones, values of every kind), hostfiles, YAML job configs, rank
tables and report directories, each written fresh for the example.

Issue 26 added values at the kernel's bounds (NAME_MAX, PATH_MAX, MAX_ARG_STRLEN, ARG_MAX,
Python's 4300-digit integers) and an option contradicted by the environment the ranks get
(``--env``, a config file's ``env:`` or the launcher's own environment): refused, or a plan
in which the option holds.

How an input is run: what the property is about is parsing and refusing, so an input that
ends before any process starts (``--dry-run``, ``report``, ``rank-table``) runs through
``launcher.cli.main`` in this process (``run_in_process``: the same error funnel, exit code and
stderr, about 100 times cheaper than an interpreter that imports npu-launch each time). Only the
examples that really launch (``real_run``) start npu-launch as its own process, under a memory
bound, since a launch is processes; ``test_hostile_inputs_in_a_real_process`` runs the hostile
inputs of every kind once through a real process too (the memory bound, argv as exec passes it).

``NPU_LAUNCH_PROPERTY_EXAMPLES`` sets the number of examples per test (default 60); the real runs
of ``test_options`` and ``test_kernel_sized_values`` draw a quarter of that.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import psutil
import pytest
import yaml
from helpers import RANK_TABLE_EXAMPLES, npu_launch_argv, run_cli_here
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.cli.main import run_command

EXAMPLES = int(os.environ.get("NPU_LAUNCH_PROPERTY_EXAMPLES", "60"))
MEMORY_BOUND = 1 << 30
"""Address space of the launcher process: an input that makes it allocate without bound fails
the example instead of the machine."""
HANG_GUARD = 60.0
"""Seconds; not a speed check, only what tells a hang from a slow machine."""

MARKER_SCRIPT = "import os, sys\nopen(f'ran-{os.getpid()}', 'w').write(repr(sys.argv))\n"
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REAL_RUNS = settings(PROPERTY, max_examples=max(1, EXAMPLES // 4))
"""For examples that start a job: each costs a launcher and a rank (about a second)."""

HOSTILE = ["", "-", "--", "²", "١٢", "9" * 5000, "9" * 30, "-1", "0", "1", "2", "nan", "inf",
           "1e308", "a;touch PWNED", "$(touch PWNED)", "`touch PWNED`", "'", '"', "a\nb",
           "x" * 20_000, "..", "../..", "/", "node1:²", "node1:0,2@node2", "all", "none", "0,3",
           "\x01", "🙂", "-x.py", "data", "semi", "cpu", "npu", "auto", "ssh", "local", "K=V",
           "1X=1", "PYTHONPATH=/x", "RANK=1"]
VALUE = st.one_of(st.sampled_from(HOSTILE), st.integers(-3, 70).map(str),
                  st.text(max_size=40).filter(lambda t: "\0" not in t))
RUN_OPTIONS = [p for p in run_command.params if hasattr(p, "opts")]
FLAGS = [p.opts[0] for p in RUN_OPTIONS if getattr(p, "is_flag", False)]
VALUED = [p.opts[0] for p in RUN_OPTIONS if not getattr(p, "is_flag", False)
          and p.opts[0] not in ("--hostfile", "--config", "--rank-table")]


@dataclasses.dataclass
class Outcome:
    code: int
    stderr: str
    workdir: Path
    ran: bool
    stdout: str = ""


def run_in(workdir: Path, args: list[str], env: Optional[dict[str, str]] = None) -> Outcome:
    """npu-launch in ``workdir`` as its own process, under the memory bound; whether the marker
    script ran."""
    def bound() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))

    proc = subprocess.run(npu_launch_argv(*args), cwd=workdir, capture_output=True, text=True,
                          errors="replace", timeout=HANG_GUARD, preexec_fn=bound, env=env)
    return Outcome(proc.returncode, proc.stderr, workdir,
                   any(workdir.glob("**/ran-*")), proc.stdout)


def run_in_process(workdir: Path, args: list[str],
                   env: Optional[dict[str, str]] = None) -> Outcome:
    """npu-launch's ``main`` in this process (``helpers.run_cli_here``). Only for inputs that
    end before a job starts (dry runs, ``report``, ``rank-table``): a launch is processes."""
    assert "--dry-run" in args or args[0] in ("report", "rank-table"), args
    result = run_cli_here(*args, cwd=workdir, env=env, guard=HANG_GUARD)
    return Outcome(result.returncode, result.stderr, workdir, any(workdir.glob("**/ran-*")),
                   result.stdout)


def assert_contract(outcome: Outcome, one_line: bool = True) -> None:
    err = outcome.stderr
    assert "Traceback" not in err, err[-3000:]
    assert outcome.code in (0, 2), f"exit {outcome.code}: {err[-2000:]}"
    if outcome.code == 2:
        lines = err.strip().splitlines()
        assert lines and lines[-1].startswith("npu-launch: error: "), err[-2000:]
        if one_line:
            assert len(lines) == 1, err[-2000:]
        assert not outcome.ran, "a refused launch started its script"
        assert not list(outcome.workdir.glob("**/npu_launch_logs")), "a refused launch made logs"
        assert not (outcome.workdir / "given_logs").exists(), "a refused launch made --log-dir"
    assert not list(outcome.workdir.glob("**/PWNED")), "a value reached a shell"
    assert not _processes_in(outcome.workdir), "a process of the launch outlived it"


def _processes_in(workdir: Path) -> list[psutil.Process]:
    left = []
    for proc in psutil.process_iter(["cwd"]):
        cwd = proc.info.get("cwd") or ""
        if cwd.startswith(str(workdir)):
            left.append(proc)
    return left


@st.composite
def option_words(draw: st.DrawFn, real_run: bool) -> list[str]:
    """A few options of the run command with values of every kind, and misspelt ones."""
    words: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["flag", "valued", "valued", "misspelt"]))
        if real_run:
            option = draw(st.sampled_from(["--console", "--job-id", "--env", "--cards"]))
            value = draw(VALUE)
            if option == "--env":
                value = f"NPU_TEST_VALUE={value}"
            if option == "--cards":
                value = draw(st.sampled_from(["1", "2", "0", "65", "²", "9" * 40]))
            words += [option, value]
        elif kind == "flag":
            words.append(draw(st.sampled_from(FLAGS)))
        elif kind == "valued":
            words += [draw(st.sampled_from(VALUED)), draw(VALUE)]
        else:
            words += [draw(st.sampled_from(VALUED + FLAGS)) + draw(st.sampled_from(["s", "x"])),
                      draw(VALUE)]
    return words


def _script(workdir: Path) -> str:
    (workdir / "train.py").write_text(MARKER_SCRIPT)
    return "train.py"


@contextlib.contextmanager
def fresh_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="npu-prop-") as folder:
        yield Path(folder)


def _options(real_run: bool, data: st.DataObject) -> Outcome:
    with fresh_dir() as workdir:
        words = data.draw(option_words(real_run))
        fixed = ["--device", "cpu", "--log-dir", str(workdir / "given_logs")]
        tail = [] if real_run else ["--dry-run"]
        args = [*fixed, *words, *tail, _script(workdir), *data.draw(st.lists(VALUE, max_size=3))]
        assert_contract((run_in if real_run else run_in_process)(workdir, args))


@given(data=st.data())
@PROPERTY
def test_options(data: st.DataObject) -> None:
    _options(False, data)


@given(data=st.data())
@REAL_RUNS
def test_options_of_a_real_run(data: st.DataObject) -> None:
    _options(True, data)


HOST_LINES = ["node1 slots=2", "admin@node2 slots=8", "# comment", "", "node3 slots=²",
              "node4 slots=" + "9" * 5000, "NODE1 slots=1", "-oProxyCommand=x slots=1",
              "a;b slots=1", "node5", "node6 slots=1 extra", "x" * 300 + " slots=1",
              "node7 slots=1000000000", "u$(x)@node8 slots=1"]


@given(lines=st.lists(st.one_of(st.sampled_from(HOST_LINES), st.text(max_size=60)),
                      max_size=8),
       junk=st.binary(max_size=64), data=st.data())
@PROPERTY
def test_hostfiles(lines: list[str], junk: bytes, data: st.DataObject) -> None:
    with fresh_dir() as workdir:
        (workdir / "hosts").write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") +
                                        (junk if data.draw(st.booleans()) else b""))
        filters = data.draw(st.lists(st.sampled_from(["--include", "--exclude", "--nnodes"]),
                                     max_size=2, unique=True))
        words = [w for f in filters for w in (f, data.draw(VALUE))]
        args = ["--device", "cpu", "--hostfile", "hosts", "--no-preflight", "--master-addr",
                "127.0.0.1", "--log-dir", str(workdir / "given_logs"), *words, "--dry-run",
                _script(workdir)]
        assert_contract(run_in_process(workdir, args))


YAML_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True),
              st.sampled_from(HOSTILE)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["mode", "dp", "A", "1X", "seed"]),
                                            inner, max_size=3)),
    max_leaves=6)
CONFIG_KEYS = ["cards", "device", "console", "kill-timeout", "env", "script", "script_args",
               "parallel", "job-id", "hostfile", "seed", "dry-run", "max-restarts", "shards"]
RAW_YAML = ["a: &a [*a, *a]\n", "cards: !!python/object/apply:os.system ['touch PWNED']\n",
            "cards: !!int abc\n", "a: " + "[" * 2000 + "]" * 2000 + "\n", "? [a]\n: 1\n",
            "cards: 1\ncards: 2\n", "- a\n- b\n", "\tcards: 1\n", "cards: 0x10\n",
            "env: {A: 1, A: 2}\n", "parallel: {mode: semi, mp: 3}\n"]


@given(values=st.dictionaries(st.sampled_from(CONFIG_KEYS), YAML_VALUE, max_size=4),
       raw=st.one_of(st.none(), st.sampled_from(RAW_YAML)))
@PROPERTY
def test_config_files(values: dict[str, Any], raw: Optional[str]) -> None:
    with fresh_dir() as workdir:
        text = raw if raw is not None else yaml.safe_dump(values)
        (workdir / "job.yaml").write_text(text)
        args = ["--device", "cpu", "--log-dir", str(workdir / "given_logs"), "--config", "job.yaml",
                "--dry-run", _script(workdir)]
        assert_contract(run_in_process(workdir, args))


def _mutate(document: Any, data: st.DataObject) -> Any:
    """One value somewhere in a JSON document replaced by another of any type."""
    if isinstance(document, (dict, list)) and document and data.draw(st.booleans()):
        keys = list(document) if isinstance(document, dict) else list(range(len(document)))
        key = data.draw(st.sampled_from(keys))
        document[key] = _mutate(document[key], data)
        return document
    return data.draw(st.one_of(st.none(), st.booleans(), st.integers(-2, 10**20),
                               st.floats(allow_nan=True), st.sampled_from(HOSTILE),
                               st.just([]), st.just({})))


@given(example=st.sampled_from(sorted(p.name for p in RANK_TABLE_EXAMPLES.glob("*.json"))),
       mutations=st.integers(0, 3), raw=st.one_of(st.none(), st.sampled_from(
           ["", "{", "[" * 100_000, '{"version": "9.9"}', "\xff", "1e999999", "9" * 5000])),
       data=st.data())
@PROPERTY
def test_rank_tables(example: str, mutations: int, raw: Optional[str],
                     data: st.DataObject) -> None:
    with fresh_dir() as workdir:
        document = json.loads((RANK_TABLE_EXAMPLES / example).read_text())
        for _ in range(mutations):
            document = _mutate(document, data)
        text = raw if raw is not None else json.dumps(document)
        (workdir / "table.json").write_text(text, errors="surrogateescape")
        use = data.draw(st.sampled_from(["launch", "validate", "show"]))
        if use == "launch":
            args = ["--device", "cpu", "--rank-table", "table.json", "--server-id", "10.0.0.1",
                    "--log-dir", str(workdir / "given_logs"), "--dry-run", _script(workdir)]
        else:
            args = ["rank-table", use, "table.json"]
        assert_contract(run_in_process(workdir, args), one_line=use != "validate")


SUMMARY = {
    "job_id": "j", "outcome": "succeeded", "exit_code": 0, "message": "finished",
    "started_at": 1796122166.5, "ended_at": 1796122170.8, "duration_s": 4.3, "stall": None,
    "world_size": 2, "global_samples_per_s": 800.0, "last_step": 3, "exec_mode": "graph",
    "ranks": [{"rank": r, "host": "vm", "exit_code": 0, "steps": 3, "final_loss": 0.5,
               "samples_per_s": 400.0, "exec_mode": "graph",
               "eval": {"epoch": 1, "step": 3, "loss": 0.4, "accuracy": 0.9, "samples": 10},
               "evals": [], "last_event": "finished", "last_event_time": 1796122170.0}
              for r in range(2)],
    "checkpoints": [{"step": 3, "path": "ckpt/rank0/s3.ckpt", "rank": 0}],
}
METRICS = [{"event": "job", "job_id": "j", "time": 1796122166.5, "ranks": {"0": "vm", "1": "vm"}},
           *({"event": "step", "rank": r, "step": s, "loss": 1.0 / s, "samples": 32,
              "time": 1796122167.0 + s} for r in range(2) for s in range(1, 4)),
           {"event": "eval", "rank": 0, "epoch": 1, "step": 3, "loss": 0.4, "accuracy": 0.9,
            "samples": 10, "time": 1796122170.0}]


@given(mutations=st.integers(0, 4), junk_lines=st.lists(st.text(max_size=40), max_size=3),
       summary_raw=st.one_of(st.none(), st.sampled_from(["", "{", "[]", "NaN", "1e999"])),
       data=st.data())
@PROPERTY
def test_report_directories(mutations: int, junk_lines: list[str],
                            summary_raw: Optional[str], data: st.DataObject) -> None:
    summary = json.loads(json.dumps(SUMMARY))
    metrics = [json.loads(json.dumps(m)) for m in METRICS]
    for _ in range(mutations):
        summary = _mutate(summary, data)
        index = data.draw(st.integers(0, len(metrics) - 1))
        metrics[index] = _mutate(metrics[index], data)
    with fresh_dir() as workdir:
        job = workdir / "job"
        job.mkdir()
        (job / "summary.json").write_text(summary_raw if summary_raw is not None
                                          else json.dumps(summary))
        lines = [json.dumps(m) for m in metrics] + junk_lines
        (job / "metrics.jsonl").write_text("\n".join(lines), errors="surrogateescape")
        # Half the examples plot too (matplotlib takes most of an example's time): the plot
        # reads the same mutated records as the table.
        plot = [] if data.draw(st.booleans()) else ["--no-plot"]
        assert_contract(run_in_process(workdir, ["report", "job", *plot]))


# Values at the kernel's bounds (issue 26) -------------------------------------------------------

NAME_MAX, PATH_MAX, ARG_STRLEN = 255, 4096, 32 * 4096
"""Linux's bounds on one file name, one path (with its NUL) and one argument or variable."""
RAW_YAML_KEY = "raw YAML"
DIGITS = 4300
"""Python's ``sys.get_int_max_str_digits()`` default: int() of a longer string raises."""


def _kernel_sized(draw: st.DrawFn, limit: int) -> str:
    """A value of ``limit`` bytes give or take one, in one- or two-byte characters."""
    size = limit + draw(st.sampled_from([-2, -1, 0, 1]))
    char = draw(st.sampled_from(["x", "é"]))
    return char * (size // len(char.encode()))


def _fit(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes: what one argument of the test's own exec of
    npu-launch may hold."""
    return text.encode()[:limit].decode(errors="ignore")


def _long_path(draw: st.DrawFn) -> str:
    """A relative path near PATH_MAX made of names near NAME_MAX, or one name near it."""
    if draw(st.booleans()):
        return _kernel_sized(draw, NAME_MAX)
    name = "p" * draw(st.sampled_from([NAME_MAX - 1, NAME_MAX]))
    count = PATH_MAX // (len(name) + 1) + draw(st.sampled_from([-1, 0, 1]))
    return "/".join([name] * count)


@st.composite
def kernel_sized_words(draw: st.DrawFn) -> tuple[list[str], dict[str, Any]]:
    """Command-line words and config-file settings, one of them at a kernel bound."""
    kind = draw(st.sampled_from(["path", "job-id", "env", "env-file", "arg", "arg-file",
                                 "digits", "digits-file"]))
    if kind == "path":
        option = draw(st.sampled_from(["--log-dir", "--hostfile", "--rank-table", "--config"]))
        return [option, _long_path(draw)], {}
    if kind == "job-id":
        return ["--job-id", _kernel_sized(draw, NAME_MAX)], {}
    value = _kernel_sized(draw, ARG_STRLEN - len("NPU_TEST_VALUE="))
    if kind == "env":  # through the launcher's own argv, so at most what one argument takes
        return ["--env", _fit(f"NPU_TEST_VALUE={value}", ARG_STRLEN - 1)], {}
    if kind == "env-file":
        return [], {"env": {f"NPU_TEST_{i}": value for i in range(draw(st.integers(1, 7)))}}
    if kind == "arg":
        return ["--", "train.py", _fit(value, ARG_STRLEN - 1)], {}
    if kind == "arg-file":
        return [], {"script_args": [value] * draw(st.integers(1, 7))}
    digits = "9" * (DIGITS + draw(st.sampled_from([0, 1])))
    option = draw(st.sampled_from(["--cards", "--seed", "--master-port", "--kill-timeout",
                                   "--max-restarts", "--console"]))
    if kind == "digits":
        return [option, digits], {}
    return [], {RAW_YAML_KEY: f"{option.lstrip('-')}: {digits}\n"}  # int() of it would raise


@given(drawn=kernel_sized_words())
@PROPERTY
def test_kernel_sized_values(drawn: tuple[list[str], dict[str, Any]]) -> None:
    """A value at a kernel bound is refused where it enters (one line, nothing started, no
    log directory), or planned: never an internal error."""
    _kernel_sized_values(drawn, real_run=False)


@given(drawn=kernel_sized_words())
@REAL_RUNS
def test_kernel_sized_values_of_a_real_run(drawn: tuple[list[str], dict[str, Any]]) -> None:
    """Refused where it enters, or the job runs: never an internal error once the log dir is
    made."""
    _kernel_sized_values(drawn, real_run=True)


def _kernel_sized_values(drawn: tuple[list[str], dict[str, Any]], real_run: bool) -> None:
    words, file_settings = drawn
    with fresh_dir() as workdir:
        script = _script(workdir)
        args = ["--device", "cpu", "--log-dir", str(workdir / "given_logs"), *([] if real_run
                                                                              else ["--dry-run"])]
        if file_settings:
            text = file_settings.get(RAW_YAML_KEY) or yaml.safe_dump(file_settings, width=1 << 30)
            (workdir / "job.yaml").write_text(text)
            args += ["--config", "job.yaml"]
        tail = words if words[:1] == ["--"] else [*words, script]
        run = run_in if real_run else run_in_process
        assert_contract(run(workdir, [*args, *(w for w in tail if w != "--")]))


# An option contradicted by the environment the ranks get (issue 26) -----------------------------

CONTRADICTIONS = [
    (["--no-compile-cache"], "MS_COMPILER_CACHE_ENABLE", ["1", "0", " 1", "", "true"]),
    (["--no-compile-cache"], "MS_COMPILER_CACHE_PATH", ["/tmp/cache", "", " "]),
    (["--compile-cache"], "MS_COMPILER_CACHE_ENABLE", ["0", "1"]),
    (["--bind-cores", "none"], "MSRUN_CPU_LIST", ["[0]", ""]),
    (["--bind-cores", "0"], "MSRUN_CPU_LIST", ["[0]"]),
    (["--hang-timeout", "0"], "NPU_LAUNCH_PROGRESS", ["1"]),
    (["--master-addr", "localhost"], "MS_SCHED_HOST", ["10.0.0.9", "localhost"]),
    (["--master-addr", "127.0.0.1"], "MASTER_ADDR", ["10.0.0.9"]),
    (["--cards", "2"], "RANK_SIZE", ["8"]),
    (["--device", "cpu"], "ASCEND_RT_VISIBLE_DEVICES", ["4,5"]),
]
"""An option, a variable that would contradict it in the ranks, and values to set it to."""


def _holds(option: list[str], key: str, env: dict[str, str]) -> bool:
    """Whether a rank with environment ``env`` runs as ``option`` asks."""
    value = env.get(key)
    if option == ["--no-compile-cache"]:
        return (env.get("MS_COMPILER_CACHE_ENABLE", "").strip() != "1"
                and not env.get("MS_COMPILER_CACHE_PATH", "").strip())
    if option == ["--bind-cores", "none"]:
        return value is None or value == ""
    if option == ["--hang-timeout", "0"]:
        return value is None
    if option[0] == "--master-addr":
        return env["MS_SCHED_HOST"] == env["MASTER_ADDR"] == "127.0.0.1"
    if option[0] == "--cards":
        return env["RANK_SIZE"] == "2"
    return True


@given(case=st.sampled_from(CONTRADICTIONS), data=st.data(),
       where=st.sampled_from(["--env", "config", "inherited"]))
@PROPERTY
def test_options_contradicted_by_the_environment(case: tuple[list[str], str, list[str]],
                                                 data: st.DataObject, where: str) -> None:
    """Refused in one line, or the plan's ranks (their environment over the launcher's) run as
    the option asks."""
    option, key, values = case
    value = data.draw(st.sampled_from(values))
    env = {k: v for k, v in os.environ.items() if k not in dict.fromkeys(
        ["MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH", "MSRUN_CPU_LIST",
         "ASCEND_RT_VISIBLE_DEVICES"])}
    with fresh_dir() as workdir:
        args = ["--device", "cpu", "--log-dir", str(workdir / "given_logs"), *option]
        if where == "--env":
            args += ["--env", f"{key}={value}"]
        elif where == "config":
            (workdir / "job.yaml").write_text(yaml.safe_dump({"env": {key: value}}))
            args += ["--config", "job.yaml"]
        else:
            env[key] = value
        outcome = run_in_process(workdir, [*args, "--dry-run", "--json", _script(workdir)],
                                 env)
        assert_contract(outcome)
        if outcome.code == 0:
            plan = json.loads(outcome.stdout)
            for rank in plan["ranks"]:
                seen = {**(env if where == "inherited" else {}), **rank["env"]}
                assert _holds(option, key, seen), (option, key, value, where)


# The hostile inputs of each kind once through a real process ------------------------------------

HOSTILE_FILES = {
    "options": ([*sum((["--env", f"NPU_TEST_VALUE={v}"] for v in HOSTILE[:12]), []),
                 "--cards", "9" * 5000, "--dry-run", "train.py"], {}),
    "hostfile": (["--hostfile", "hosts", "--no-preflight", "--dry-run", "train.py"],
                 {"hosts": "\n".join(HOST_LINES)}),
    "config": (["--config", "job.yaml", "--dry-run", "train.py"], {"job.yaml": RAW_YAML[0]}),
    "deep-config": (["--config", "job.yaml", "--dry-run", "train.py"], {"job.yaml": RAW_YAML[3]}),
    "rank-table": (["rank-table", "show", "table.json"], {"table.json": "[" * 100_000}),
    "report": (["report", "job"], {"job/summary.json": "1e999",
                                   "job/metrics.jsonl": "\n".join(["{", "[]", "NaN"] * 100)}),
}
"""Per kind, the command line and the files it reads: the inputs most likely to make a parser
recurse or allocate, run where the memory bound and a real argv apply."""


@pytest.mark.parametrize("kind", sorted(HOSTILE_FILES))
def test_hostile_inputs_in_a_real_process(kind: str) -> None:
    """What the in-process examples prove holds for npu-launch as its own process too, under
    the memory bound: exit 0 or 2, one line, nothing started or made."""
    args, files = HOSTILE_FILES[kind]
    with fresh_dir() as workdir:
        _script(workdir)
        for name, text in files.items():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            (workdir / name).write_text(text)
        fixed = [] if args[0] in ("report", "rank-table") else [
            "--device", "cpu", "--log-dir", str(workdir / "given_logs")]
        outcome = run_in(workdir, [*fixed, *args])
        assert_contract(outcome)
        assert outcome.code == 2 or kind in ("report",), outcome.stderr[-2000:]


def test_ctrl_c_while_the_command_loads_is_exit_130_not_a_traceback(monkeypatch) -> None:
    """SIGINT in the first 0.3 s, while ``npu-launch`` still imports its modules, printed a
    KeyboardInterrupt traceback; it now ends as Ctrl-C before anything started does."""
    import builtins
    import sys

    from launcher.cli import entry

    real_import = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "launcher.cli.main":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)
    monkeypatch.delitem(sys.modules, "launcher.cli.main", raising=False)
    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(SystemExit) as ended:
        entry()
    assert ended.value.code == 130
