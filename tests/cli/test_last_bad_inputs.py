"""Issue 26's last bad inputs, one test per kind: kernel limits met where the input enters, an
option contradicted by ``--env``, pods with two operators' variables, ``report`` on odd output
names and unreadable summaries, a command without what it needs, a script that is not Python,
a host name for ``--master-addr``, and a scheduler's own ERROR lines in its root-cause block.

Each refusal runs the CLI's ``main`` in this process (``helpers.run_cli_here``): one line, exit
2, no traceback, nothing started (the script leaves a marker when it runs) and no log directory
made. What only a process shows (a command without what it needs, as a shell prints its help;
limits met on a launch) runs npu-launch as one.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest
from helpers import assert_one_line_error, npu_launch_argv, run_cli_here, run_launcher

from launcher import limits
from launcher.cli.main import msrun_config, run_option_arity
from launcher.cluster.workdir_sync import LaunchDir
from launcher.config import msrun_args
from launcher.errors import LaunchError
from launcher.job import make_job
from launcher.run.failures import last_lines_block

MARKER = "import os\nopen('ran-' + str(os.getpid()), 'w').close()\n"
CPU = ("--device", "cpu")


def _script(folder: Path, text: str = MARKER, name: str = "train.py") -> str:
    (folder / name).write_text(text)
    return name


def _refused(folder: Path, *args: str, needles: tuple[str, ...] = (), env: dict | None = None
             ) -> str:
    result = run_cli_here("--log-dir", str(folder / "logs"), *args, cwd=folder, env=env)
    line = assert_one_line_error(result, *needles)
    assert not (folder / "logs").exists() and not (folder / "npu_launch_logs").exists()
    assert not list(folder.glob("ran-*")), "a refused launch started its script"
    return line


# Limits the kernel imposes ---------------------------------------------------------------------

def test_a_path_past_path_max_in_a_synced_dir_is_named_before_any_host_is_asked(
        tmp_path: Path) -> None:
    """A directory chain deeper than PATH_MAX can be made step by step; lstat on it fails."""
    os.chdir(tmp_path)
    try:
        for _ in range(18):
            os.mkdir("d" * 250)
            os.chdir("d" * 250)
        Path("deep.py").write_text("x = 1\n")
    finally:
        os.chdir(tmp_path)
    with pytest.raises(LaunchError) as refused:
        LaunchDir.of(str(tmp_path), None).measure()
    assert "--sync-workdir: " in refused.value.message
    assert f"the system takes at most {limits.MAX_PATH_BYTES}" in refused.value.message
    assert len(refused.value.message) < 400


def test_an_env_value_past_max_arg_strlen_is_one_line(tmp_path: Path) -> None:
    """Too long for the command line itself, it comes from a config file (as the hostile
    battery's case did), and used to end in an internal error after the log dir was made."""
    (tmp_path / "job.yaml").write_text("env:\n  BIG: " + "x" * limits.MAX_ARG_STRLEN + "\n")
    _refused(tmp_path, *CPU, "--config", "job.yaml", _script(tmp_path),
             needles=("job.yaml:1: --env BIG:", "131071", "MAX_ARG_STRLEN"))


def test_script_arguments_and_env_past_arg_max_together_are_one_line(tmp_path: Path) -> None:
    """Each fits, and the launcher itself starts; together (the arguments on the command line,
    the variables from a config file) they leave a rank no room in ARG_MAX."""
    values = "".join(f"  V{i}: {'x' * 120_000}\n" for i in range(7))
    (tmp_path / "job.yaml").write_text(f"env:\n{values}")
    words = ["y" * 100_000] * (limits.arg_max() // 2 // 100_000 - 7)
    _refused(tmp_path, *CPU, "--config", "job.yaml", _script(tmp_path), *words,
             needles=("the script's arguments and --env values", "bytes together", "ARG_MAX"))


def test_an_environment_that_leaves_a_rank_no_room_is_one_line(tmp_path: Path) -> None:
    """The launcher's environment fills ARG_MAX but for 600 bytes: the launcher starts, and the
    plan's variables would not fit into a rank's (execve's E2BIG, an internal error once the
    log dir was made)."""
    env = dict(os.environ)
    argv = npu_launch_argv("--device", "cpu", "--log-dir", str(tmp_path / "logs"), "train.py")

    def cost(text: str) -> int:
        return len(text.encode()) + 1 + 8

    room = limits.arg_max() - sum(cost(f"{k}={v}") for k, v in env.items()) - \
        sum(cost(a) for a in argv) - 600
    for index in range(room // 130_000 + 1):
        key, size = f"NPU_TEST_FILL_{index}", min(130_000, room - 40)
        if size <= 0:
            break
        env[key] = "x" * (size - len(key) - 10)
        room -= cost(f"{key}={env[key]}")
    _refused(tmp_path, *CPU, _script(tmp_path), env=env,
             needles=("its arguments and environment would take", "ARG_MAX", "NPU_TEST_FILL_"))


def test_an_integer_past_a_float_in_a_config_file_is_one_line(tmp_path: Path) -> None:
    """Found by test_cli_properties: a YAML integer of 4300 digits for a number of seconds was
    an internal OverflowError."""
    (tmp_path / "job.yaml").write_text("kill-timeout: " + "9" * 4300 + "\n")
    _refused(tmp_path, *CPU, "--config", "job.yaml", "--dry-run", _script(tmp_path),
             needles=("job.yaml:1: kill_timeout:", "too large for a number of seconds"))


def test_a_path_past_name_max_is_one_line(tmp_path: Path) -> None:
    _refused(tmp_path, *CPU, "--hostfile", "h" * 300, _script(tmp_path),
             needles=("--hostfile", "a name of 300 bytes", "255"))


def test_a_log_dir_whose_files_would_pass_path_max_is_refused_before_it_is_made(
        tmp_path: Path) -> None:
    """The default log dir under a launch folder 4051 bytes deep: npu_launch_logs/ was made,
    then the lock file's path was too long."""
    deep = tmp_path
    while len(os.fsencode(deep)) < 3800:
        deep = deep / ("d" * 250)
    deep = deep / ("e" * (4050 - len(os.fsencode(deep)) - 1))
    os.makedirs(deep)
    result = run_launcher(*CPU, "--cards", "2", _script(deep), cwd=deep)
    assert_one_line_error(result, "the job's files in it reach paths of", "give a shorter --log-dir")
    assert sorted(p.name for p in deep.iterdir()) == ["train.py"]


# An option contradicted by the environment it sets -----------------------------------------------

@pytest.mark.parametrize("pair", ["MS_COMPILER_CACHE_ENABLE=1", "MS_COMPILER_CACHE_PATH=/tmp/c"])
def test_no_compile_cache_with_env_turning_it_on_is_refused(tmp_path: Path, pair: str) -> None:
    _refused(tmp_path, *CPU, "--no-compile-cache", "--env", pair, "--dry-run", _script(tmp_path),
             needles=(f"--env {pair.split('=')[0]}", "--no-compile-cache", "give one of them"))


def test_the_contradiction_from_a_config_file_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("compile-cache: false\nenv:\n  MS_COMPILER_CACHE_ENABLE: '1'\n")
    _refused(tmp_path, *CPU, "--config", "job.yaml", "--dry-run", _script(tmp_path),
             needles=("job.yaml:", "--env MS_COMPILER_CACHE_ENABLE", "--no-compile-cache"))


def test_env_that_agrees_with_the_option_is_taken(tmp_path: Path) -> None:
    result = run_launcher(*CPU, "--no-compile-cache", "--env", "MS_COMPILER_CACHE_ENABLE=0",
                          "--dry-run", _script(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "MS_COMPILER_CACHE_ENABLE=0" in result.stdout


def test_env_naming_other_cards_is_refused(tmp_path: Path) -> None:
    _refused(tmp_path, *CPU, "--env", "ASCEND_RT_VISIBLE_DEVICES=4,5", "--dry-run",
             _script(tmp_path), needles=("--env ASCEND_RT_VISIBLE_DEVICES", "its own environment"))


def test_env_binding_threads_with_bind_cores_none_is_refused(tmp_path: Path) -> None:
    _refused(tmp_path, *CPU, "--bind-cores", "none", "--env", "MSRUN_CPU_LIST=[0]", "--dry-run",
             _script(tmp_path), needles=("--env MSRUN_CPU_LIST", "--bind-cores none"))


def test_an_inherited_thread_binding_with_bind_cores_none_is_refused(tmp_path: Path) -> None:
    """Found by test_cli_properties: the ranks inherited MSRUN_CPU_LIST under --bind-cores none."""
    _refused(tmp_path, *CPU, "--bind-cores", "none", "--dry-run", _script(tmp_path),
             env={**os.environ, "MSRUN_CPU_LIST": "[0]"},
             needles=("--bind-cores none: MSRUN_CPU_LIST='[0]' in npu-launch's environment",))


@pytest.mark.parametrize("inherited, needles", [
    ({"MS_COMPILER_CACHE_ENABLE": "1"}, ["--no-compile-cache: MS_COMPILER_CACHE_ENABLE='1' in "
                                         "npu-launch's environment", "unset it"]),
    ({"NPU_LAUNCH_RESUME_STEP": "40"}, ["NPU_LAUNCH_RESUME_STEP='40' in npu-launch's environment",
                                        "left from another job"]),
    ({"NPU_LAUNCH_PROGRESS": "1"}, ["NPU_LAUNCH_PROGRESS='1'"]),
])
def test_an_inherited_variable_that_contradicts_the_job_is_refused(tmp_path: Path, inherited: dict,
                                                                    needles: list) -> None:
    _refused(tmp_path, *CPU, "--no-compile-cache", "--hang-timeout", "0", _script(tmp_path),
             env={**os.environ, **inherited}, needles=tuple(needles))


def test_a_config_files_env_and_env_flags_add_up(tmp_path: Path) -> None:
    """A flag used to replace the file's whole ``env:``, dropping its other variables unsaid;
    now they add up, and a flag's value for the same variable wins."""
    (tmp_path / "job.yaml").write_text("env:\n  A: 'file'\n  B: 'file'\n")
    result = run_launcher(*CPU, "--config", "job.yaml", "--env", "B=flag", "--env", "C=flag",
                          "--dry-run", "--json", _script(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)["ranks"][0]["env"]
    assert (env["A"], env["B"], env["C"]) == ("file", "flag", "flag")


# Pods whose variables come from two operators ----------------------------------------------------

ASCEND_WORKER = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MS_ROLE": "MS_WORKER",
                 "MS_SCHED_HOST": "10.96.12.34", "MS_SCHED_PORT": "2222", "MS_WORKER_NUM": "2",
                 "MS_LOCAL_WORKER": "1", "MS_NODE_RANK": "1", "MS_SERVER_NUM": "0",
                 "NPU_POD": "true"}
"""tests/fixtures/pods/ascend_worker_1_of_2.env (MindCluster's ascend-operator, worker pod 1)."""
KUBEFLOW_SAME = {"MASTER_ADDR": "10.96.12.34", "MASTER_PORT": "2222", "WORLD_SIZE": "2",
                 "RANK": "1"}
"""Kubeflow-style variables (tests/fixtures/pods/kubeflow_master.env's names) for that job."""


def _pod_env(tmp: Path, **change: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MS_ROLE", "MASTER_ADDR",
                                                           "WORLD_SIZE", "RANK")}
    (tmp / "dev").mkdir(exist_ok=True)
    return {**env, **ASCEND_WORKER, **KUBEFLOW_SAME, "NPU_LAUNCH_DEVFS": str(tmp / "dev"),
            "NPU_LAUNCH_POD_RANK_TABLE": str(tmp / "hccl.json"), **change}


@pytest.mark.parametrize("change, needles", [
    ({"MASTER_ADDR": "10.96.12.35"}, ["MS_SCHED_HOST=10.96.12.34 and MASTER_ADDR=10.96.12.35"]),
    ({"MASTER_PORT": "23456"}, ["MS_SCHED_PORT=2222 and MASTER_PORT=23456"]),
    ({"WORLD_SIZE": "4", "RANK": "1"}, ["2 node(s) by MS_WORKER_NUM", "4 by WORLD_SIZE=4 pods"]),
    ({"RANK": "0"}, ["MS_NODE_RANK=1 and RANK=0"]),
])
def test_two_operators_that_disagree_are_refused_naming_both(tmp_path: Path, change: dict,
                                                             needles: list) -> None:
    _refused(tmp_path, "--dry-run", _script(tmp_path), env=_pod_env(tmp_path, **change),
             needles=(*needles, "two operators", "--launcher local"))


def test_a_pod_rank_table_path_the_kernel_refuses_is_not_waited_for(tmp_path: Path) -> None:
    """It could never appear: refused at once instead of after --rank-table-timeout."""
    env = _pod_env(tmp_path, NPU_LAUNCH_POD_RANK_TABLE=str(tmp_path / ("t" * 300)))
    _refused(tmp_path, _script(tmp_path), env=env,
             needles=("NPU_LAUNCH_POD_RANK_TABLE=", "a name of 300 bytes"))


def test_two_operators_that_agree_run_as_the_ascend_operator_says(tmp_path: Path) -> None:
    result = run_launcher("--dry-run", _script(tmp_path), cwd=tmp_path, env=_pod_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "detected: ascend-operator pod (MS_ROLE=MS_WORKER), node 1 of 2" in result.stdout + \
        result.stderr


# A Slurm allocation's node list that is not text ---------------------------------------------------

def _fake_scontrol(tmp: Path, answer: bytes) -> dict[str, str]:
    """An environment inside an allocation whose ``scontrol show hostnames`` prints ``answer``."""
    tools = tmp / "bin"
    tools.mkdir()
    scontrol = tools / "scontrol"
    scontrol.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write({answer!r})\n")
    scontrol.chmod(0o755)
    return {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "123"}


@pytest.mark.parametrize("nodelist, answer, needles", [
    (b"node\xff", b"node\xff\n", ("--launcher slurm: SLURM_JOB_NODELIST 'node\\udcff': not ASCII text",)),
    (b"node1", b"node\xff\n", ("--launcher slurm: scontrol expands SLURM_JOB_NODELIST 'node1' to names "
                                 "that are not UTF-8 text",)),
], ids=["the variable", "scontrol's answer"])
def test_a_slurm_node_list_that_is_not_text_is_one_line(tmp_path: Path, nodelist: bytes, answer: bytes,
                                                        needles: tuple) -> None:
    env = {**_fake_scontrol(tmp_path, answer), "SLURM_JOB_NODELIST": os.fsdecode(nodelist)}
    _refused(tmp_path, *CPU, "--dry-run", "--cards", "1", _script(tmp_path), env=env, needles=needles)


@pytest.mark.parametrize("nodelist, needles", [
    ("node1,NODE1", ("--launcher slurm: 'node1,NODE1': duplicate node 'NODE1' (given before as 'node1'; "
                     "names ignore case)",)),
    ("a,b,a", ("--launcher slurm: 'a,b,a': duplicate node 'a' (given before)",)),
])
def test_a_slurm_node_list_naming_a_host_twice_is_one_line(tmp_path: Path, nodelist: str,
                                                           needles: tuple) -> None:
    """It made a plan of two nodes on one host; a hostfile refuses the same."""
    answer = "".join(f"{name}\n" for name in nodelist.split(",")).encode()
    env = {**_fake_scontrol(tmp_path, answer), "SLURM_JOB_NODELIST": nodelist}
    _refused(tmp_path, *CPU, "--dry-run", "--cards", "1", "--master-addr", "127.0.0.1",
             _script(tmp_path), env=env, needles=needles)


# npu-launch report on odd inputs -------------------------------------------------------------------

def _report(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli_here("report", *args, cwd=folder)


def _job_with_steps(folder: Path, message: str = "") -> Path:
    job = folder / "job"
    job.mkdir()
    records = [{"event": "job", "job_id": "j", "time": 1796122166.5, "ranks": {"0": "vm"}},
               *({"event": "step", "rank": 0, "step": s, "loss": 1.0 / s, "samples": 32,
                  "time": 1796122167.0 + s} for s in range(1, 4))]
    (job / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)))
    if message:
        (job / "summary.json").write_text(json.dumps({"job_id": "j", "outcome": "failed",
                                                      "message": message}))
    return job


def test_report_names_the_fields_it_skipped_when_none_could_be_read(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "summary.json").write_text(
        '{"job_id": 5, "outcome": [], "exit_code": NaN, "started_at": -1, "world_size": "x"}')
    line = assert_one_line_error(_report(tmp_path, "job"), "no field could be read",
                                 "job_id: not text, got 5", "(and 4 more skipped)")
    assert "no field of a job summary" not in line


@pytest.mark.parametrize("name", ["plot.xyz", "plot.", "plot.png.exe"])
def test_report_refuses_an_image_type_it_cannot_write(tmp_path: Path, name: str) -> None:
    job = _job_with_steps(tmp_path)
    assert_one_line_error(_report(tmp_path, str(job), "-o", name), "--output", "cannot write a .")
    assert not (tmp_path / name).exists()


def test_report_writes_a_name_without_extension_as_png_under_that_name(tmp_path: Path) -> None:
    job = _job_with_steps(tmp_path)
    result = _report(tmp_path, str(job), "-o", "plot")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "plot: plot"
    assert (tmp_path / "plot").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "plot.png").exists()


def test_report_writes_the_type_its_extension_names(tmp_path: Path) -> None:
    job = _job_with_steps(tmp_path)
    assert _report(tmp_path, str(job), "-o", "plot.SVG").returncode == 0
    assert b"<svg" in (tmp_path / "plot.SVG").read_bytes()[:2000]


def test_report_keeps_the_lines_of_the_jobs_message(tmp_path: Path) -> None:
    job = _job_with_steps(tmp_path, "npu-launch: job j failed: rank 0\n  ValueError: boom\x1b[2J")
    out = _report(tmp_path, str(job), "--no-plot").stdout
    assert "npu-launch: job j failed: rank 0\n  ValueError: boom\\x1b[2J\n" in out
    assert "\\n" not in out


# A command without what it needs --------------------------------------------------------------------

@pytest.mark.parametrize("words, usage", [
    ([], "Usage: npu-launch [OPTIONS] [SCRIPT] [SCRIPT_ARGS]..."),
    (["rank-table"], "Usage: npu-launch rank-table [OPTIONS] COMMAND [ARGS]..."),
])
def test_a_group_without_its_command_prints_its_help_as_click_does(tmp_path: Path, words: list,
                                                                   usage: str) -> None:
    """click (8.2 and later) shows a group's help on stderr with exit 2 when it is given no
    command (``no_args_is_help``); so does npu-launch, instead of one error line."""
    @click.group()
    def group() -> None:
        pass

    @group.command()
    def sub() -> None:
        pass

    with pytest.raises(click.exceptions.NoArgsIsHelpError) as clicks:
        group.main(args=[], standalone_mode=False)
    result = subprocess.run(npu_launch_argv(*words), cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == clicks.value.exit_code == 2
    assert result.stdout == "" and result.stderr.startswith(usage)
    assert "\\n" not in result.stderr and "error" not in result.stderr.splitlines()[0]
    assert len(result.stderr.splitlines()) > 8 and not list(tmp_path.iterdir())


# A script that is not Python ----------------------------------------------------------------------

@pytest.mark.parametrize("name, text, needles", [
    ("run.sh", "#!/bin/bash\necho hi\n", ["script 'run.sh': a bash script", "not Python"]),
    ("run.py", "#!/usr/bin/env sh\necho hi\n", ["a sh script ('#!/usr/bin/env sh')"]),
    ("train.py", "echo hi\nls -l\n", ["script 'train.py':1: not Python", "invalid syntax"]),
    ("train.py", "import os\n\ndef f(:\n    pass\n", ["script 'train.py':3: not Python"]),
    ("train.py", "x = 1\x00\n", ["script 'train.py'", "not Python"]),
])
def test_a_script_that_is_not_python_is_refused_before_anything_starts(
        tmp_path: Path, name: str, text: str, needles: list) -> None:
    _refused(tmp_path, *CPU, "--cards", "2", _script(tmp_path, text, name), needles=tuple(needles))


@pytest.mark.parametrize("script, needles", [
    ("fifo.py", ["script 'fifo.py': not a regular file"]),  # every rank would wait on it
    ("/dev/zero", ["script '/dev/zero': not a regular file"]),  # ... or read it until no memory
    ("/proc/self/environ", ["script '/proc/self/environ':1: not Python"]),  # sized 0, read whole
])
def test_a_script_that_is_no_file_python_reads_is_refused(tmp_path: Path, script: str,
                                                          needles: list) -> None:
    os.mkfifo(tmp_path / "fifo.py")
    _refused(tmp_path, *CPU, "--cards", "2", script, needles=tuple(needles))


@pytest.mark.parametrize("text", [
    '#!/bin/sh\n"exec" "python3" "$0" "$@"\nimport os\nopen("ran-" + str(os.getpid()), "w")\n',
    "#!/usr/bin/env -S python3 -u\nprint(1)\n",
    "#!/usr/bin/pypy3\nprint(1)\n",
])
def test_a_shebang_python_runs_is_taken(tmp_path: Path, text: str) -> None:
    """A shell and Python polyglot, ``env -S``, PyPy: Python runs each (a #! line is a comment
    to it)."""
    result = run_launcher(*CPU, "--dry-run", _script(tmp_path, text, "tool"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_program_is_refused_and_python_that_is_no_source_is_taken(tmp_path: Path) -> None:
    shutil.copy("/bin/true", tmp_path / "prog")
    _refused(tmp_path, *CPU, "prog", needles=("script 'prog': an executable program",))
    _script(tmp_path, "#!/usr/bin/env python3\nprint(1)\n", "__main__.py")
    shutil.make_archive(str(tmp_path / "app"), "zip", tmp_path, "__main__.py")
    result = run_launcher(*CPU, "--dry-run", "app.zip", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


# A host name where an address is asked for ---------------------------------------------------------

def test_a_master_host_name_is_resolved_once_and_named_in_the_plan(tmp_path: Path) -> None:
    address = socket.gethostbyname("localhost")
    result = run_launcher(*CPU, "--master-addr", "localhost", "--dry-run", _script(tmp_path),
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"master {address}:" in result.stdout and "(localhost)" in result.stdout
    assert f"MS_SCHED_HOST={address}" in result.stdout and "MS_SCHED_HOST=localhost" not in \
        result.stdout


def test_an_msrun_master_addr_name_is_resolved_as_msrun_does(tmp_path: Path,
                                                              monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with socket.socket() as free:  # msrun's default 8118 may be another test's
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    parsed = msrun_args.parse(("--worker_num", "1", "--local_worker_num", "1", "--master_addr",
                                 "localhost", "--master_port", port, _script(tmp_path)),
                                run_option_arity())
    config, _ = msrun_config(parsed)
    plan = make_job(config, os.environ, io.StringIO()).plan
    assert (plan.master_addr, plan.master_name) == (socket.gethostbyname("localhost"), "localhost")
    assert plan.ranks[0].env["MS_SCHED_HOST"] == plan.master_addr


def test_a_master_name_that_does_not_resolve_is_one_line(tmp_path: Path) -> None:
    _refused(tmp_path, *CPU, "--master-addr", "no-such-host.invalid", _script(tmp_path),
             needles=("--master-addr no-such-host.invalid: cannot resolve the name",
                      "IP address"))


# The scheduler's own ERROR lines in its root-cause block ---------------------------------------------

SCHEDULER_LOG = """\
[WARNING] DISTRIBUTED(9212,7f1ac38aab80,python):2026-12-02-02:28:43.180.040 [mindspore/ccsrc/cluster/topology/meta_server_node.cc:58] Initialize] Begin to Initialize MetaServerNode.
[ERROR] DISTRIBUTED(9212,7f1ac38aab80,python):2026-12-02-02:28:43.182.315 [mindspore/ccsrc/cluster/rpc/tcp/socket_operation.cc:305] GetSockAddr] Parse ip failed, result: 0, url: localhost:40975
[ERROR] DISTRIBUTED(9212,7f1ac38aab80,python):2026-12-02-02:28:43.182.437 [mindspore/ccsrc/cluster/init.cc:114] InitializeCluster] Failed to initialize cluster.
Traceback (most recent call last):
  File "/work/parallel/scheduler.py", line 23, in main
    init()
RuntimeError: Failed to initialize distributed job cluster because some processes in the cluster are not successfully spawned.
""" + "\n".join(f"line {i} of the C++ call stack" for i in range(20)) + "\n"
"""MindSpore 2.10's scheduler.log when MS_SCHED_HOST is a host name (recorded here, from a
launch with --master-addr localhost before names were resolved)."""


def test_a_root_cause_block_shows_the_logs_error_lines(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    log.write_text(SCHEDULER_LOG)
    block = "\n".join(last_lines_block(str(log), 15))
    assert block.index(f"errors in {log}:") < block.index(f"last lines of {log}:")
    assert "Parse ip failed, result: 0, url: localhost:40975" in block
    assert block.count("[ERROR]") == 2 and "[WARNING]" not in block


def test_error_lines_already_in_the_tail_are_not_shown_twice(tmp_path: Path) -> None:
    log = tmp_path / "rank_0.log"
    log.write_text("start\n[ERROR] ME(1): the one error\nend\n")
    block = last_lines_block(str(log), 15)
    assert sum("the one error" in line for line in block) == 1
    assert not any(line.startswith("  errors in") for line in block)
