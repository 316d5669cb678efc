"""npu-launch in an operator's Kubernetes pod (``launcher/plan/pods.py``): what it detects from each
operator's environment (``tests/fixtures/pods``, golden files in ``tests/golden/pods``), the
environments and options it refuses in one line, and the wait for the operator's rank table.

After an intended change, refresh the golden files with ``NPU_LAUNCH_UPDATE_GOLDEN=1 python -m
pytest tests/plan/test_pods.py`` and review the diff (a refreshing run compares nothing, so it reports
each golden test as skipped).
"""
from __future__ import annotations

import io
import json
import os
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import GOLDEN, RANK_SCRIPTS, TESTS, assert_one_line_error, run_cli_here, run_launcher, wait_for
from helpers import assert_golden as golden

from launcher.errors import LaunchError
from launcher.plan import pod_waits, pods

FIXTURES = TESTS / "fixtures" / "pods"
PODS_GOLDEN = GOLDEN / "pods"
CASES = sorted(p.stem for p in FIXTURES.glob("*.env"))
_SHOWN_ENV = ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM", "MS_NODE_ID",
              "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod_env(case: str, tmp: Path, port: int, **extra: str) -> dict[str, str]:
    """This process's environment with the pod's of ``tests/fixtures/pods/<case>.env``, the
    rank table at ``tmp/hccl.json``, and no cards (an empty device folder)."""
    env = {k: v for k, v in os.environ.items() if k not in
           ("MS_ROLE", "MASTER_ADDR", "WORLD_SIZE", "RANK", "KUBERNETES_SERVICE_HOST")}
    for line in (FIXTURES / f"{case}.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value.replace("{FREE_PORT}", str(port))
    devfs = tmp / "dev"
    devfs.mkdir(exist_ok=True)
    env.update({pods.RANK_TABLE_ENV: str(tmp / "hccl.json"), "NPU_LAUNCH_DEVFS": str(devfs),
                **extra})
    return env


def script(tmp: Path) -> Path:
    path = tmp / "train.py"
    path.write_text("print('hello')\n")
    return path


def detected(case: str, tmp: Path) -> str:
    """The ``detected:`` line and the plan's nodes, master and ranks, as the golden files hold
    them (this host's name, the free port and the table's path written as placeholders)."""
    port = free_port()
    result = run_cli_here("--dry-run", "--json", "--job-id", "pod", "--log-dir",
                          str(tmp / "logs"), str(script(tmp)), cwd=tmp, env=pod_env(case, tmp, port))
    assert result.returncode == 0, result.stderr
    header = [line for line in result.stderr.splitlines() if "detected:" in line]
    plan = json.loads(result.stdout)
    lines = [header[0].removeprefix("npu-launch: "),
             f"nnodes {plan['nnodes']}, world size {plan['world_size']}, "
             f"master {plan['master_addr']}:{plan['master_port']}"]
    sched = plan["scheduler"]
    lines.append("scheduler: " + (f"node {sched['node_rank']} ({sched['host']})" if sched
                                  else "not in this pod"))
    for spec in plan["ranks"]:
        env = " ".join(f"{k}={spec['env'][k]}" for k in _SHOWN_ENV if k in spec["env"])
        lines.append(f"rank {spec['rank']} node {spec['node_rank']} local {spec['local_rank']} "
                     f"host {spec['host']}: {env}")
    text = "\n".join(lines) + "\n"
    return (text.replace(socket.gethostname(), "<this host>").replace(str(port), "<free port>")
            .replace(str(tmp / "hccl.json"), f"<{pods.RANK_TABLE_ENV}>"))


def assert_golden(name: str, text: str) -> None:
    golden(PODS_GOLDEN / f"{name}.txt", text, f"what was detected in {name}")


@pytest.mark.parametrize("case", CASES)
def test_what_is_detected_in_each_operators_pod(case: str, weird_tmp: Path) -> None:
    assert_golden(case, detected(case, weird_tmp))


def test_dry_run_starts_with_the_detected_line(weird_tmp: Path) -> None:
    env = pod_env("ascend_worker_1_of_2", weird_tmp, 0)
    result = run_cli_here("--dry-run", "--job-id", "pod", str(script(weird_tmp)), cwd=weird_tmp,
                          env=env)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first == (f"detected: ascend-operator pod (MS_ROLE=MS_WORKER), node 1 of 2, scheduler "
                     f"10.96.12.34:2222 in the scheduler pod, rank table {weird_tmp / 'hccl.json'}")
    assert "detected:" not in result.stderr  # said once, in the plan
    assert result.stdout.splitlines()[1].startswith("job pod: 2 rank(s) on 2 node(s)")


def test_outside_a_pod_or_with_an_explicit_launcher_nothing_is_detected(weird_tmp: Path) -> None:
    env = pod_env("ascend_worker_1_of_2", weird_tmp, 0)
    for args, drop in ((["--launcher", "local"], ()), ([], ("KUBERNETES_SERVICE_HOST",))):
        run_env = {k: v for k, v in env.items() if k not in drop}
        result = run_cli_here("--dry-run", *args, str(script(weird_tmp)), cwd=weird_tmp,
                              env=run_env)
        assert result.returncode == 0, result.stderr
        assert "detected" not in result.stdout + result.stderr
        assert "1 rank(s) on 1 node(s)" in result.stdout and "master 127.0.0.1:" in result.stdout


@pytest.mark.parametrize("case, change, needles", [
    ("ascend_pytorch_worker", {"WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "2"},
     ["WORLD_SIZE=3: not a multiple of LOCAL_WORLD_SIZE=2"]),
    ("kubeflow_master", {"RANK": "2"}, ["RANK=2: the job has 2 node(s)", "WORLD_SIZE=2"]),
    ("kubeflow_worker_pet", {"WORLD_SIZE": "3"}, ["WORLD_SIZE=3: not a multiple of PET_NNODES=2"]),
    ("kubeflow_worker_pet", {"PET_NNODES": "1:4"}, ["PET_NNODES='1:4': an elastic range"]),
    ("kubeflow_worker_pet", {"WORLD_SIZE": "65", "PET_NNODES": "1", "RANK": "0"},
     ["WORLD_SIZE=65 / PET_NNODES=1: 65 ranks per pod; expected 1-64"]),
    ("kubeflow_master", {"WORLD_SIZE": "two"}, ["WORLD_SIZE='two': expected a whole number"]),
    ("kubeflow_master", {"MASTER_PORT": "0"}, ["MASTER_PORT='0': expected a whole number 1-65535"]),
    ("ascend_worker_1_of_2", {"MS_WORKER_NUM": "3", "MS_LOCAL_WORKER": "2"},
     ["MS_WORKER_NUM=3: not a multiple of MS_LOCAL_WORKER=2"]),
    ("ascend_worker_1_of_2", {"MS_WORKER_NUM": "１６"}, ["MS_WORKER_NUM='１６': expected a whole"]),
    ("ascend_worker_1_of_2", {"MS_NODE_RANK": "2"},
     ["MS_NODE_RANK=2: the job has 2 node(s) (MS_WORKER_NUM=2 / MS_LOCAL_WORKER=1)"]),
    ("ascend_worker_1_of_2", {"MS_ROLE": "MS_PSERVER"}, ["MS_ROLE='MS_PSERVER'"]),
    ("ascend_worker_1_of_2", {"MS_SERVER_NUM": "1"}, ["MS_SERVER_NUM='1': parameter servers"]),
    ("ascend_worker_1_of_2", {"MS_SCHED_HOST": ""}, ["MS_SCHED_HOST: not set in this pod"]),
    ("ascend_worker_1_of_2", {"MS_SCHED_HOST": "a b"}, ["MS_SCHED_HOST='a b': expected a host"]),
    # A service name is waited for until it resolves; one that never could is refused at once.
    ("kubeflow_master", {"MASTER_ADDR": "%%%"}, ["MASTER_ADDR='%%%': expected a host name"]),
    ("kubeflow_master", {"MASTER_ADDR": "a..svc"}, ["MASTER_ADDR='a..svc': expected a host"]),
])
def test_inconsistent_operator_environment_is_one_line(case: str, change: dict, needles: list,
                                                       weird_tmp: Path) -> None:
    env = {**pod_env(case, weird_tmp, free_port()), **change}
    result = run_cli_here("--dry-run", str(script(weird_tmp)), cwd=weird_tmp, env=env)
    assert_one_line_error(result, *needles)


@pytest.mark.parametrize("args, needles", [
    (["--cards", "4"], ["--cards 4: this ascend-operator pod says 1", "give --launcher local"]),
    (["--master-port", "2223"], ["--master-port 2223: this ascend-operator pod says 2222"]),
    (["--nnodes", "3", "--node-rank", "1", "--master-addr", "10.96.12.34", "--master-port",
      "2222"], ["--nnodes 3: this ascend-operator pod says 2"]),
    (["--hostfile", "hosts"], ["--hostfile: this is an ascend-operator pod (MS_ROLE=MS_WORKER)",
                               "--launcher ssh"]),
    (["--rank-table", "t.json"], ["--rank-table: in an ascend-operator pod"]),
])
def test_options_that_contradict_the_pod_are_one_line(args: list, needles: list,
                                                      weird_tmp: Path) -> None:
    (weird_tmp / "hosts").write_text("a slots=1\n")
    env = pod_env("ascend_worker_1_of_2", weird_tmp, 0)
    result = run_cli_here("--dry-run", *args, str(script(weird_tmp)), cwd=weird_tmp, env=env)
    assert_one_line_error(result, *needles)


def test_options_that_agree_with_the_pod_are_taken(weird_tmp: Path) -> None:
    env = pod_env("ascend_worker_1_of_2", weird_tmp, 0)
    result = run_cli_here("--dry-run", "--cards", "1", "--nnodes", "2", "--node-rank", "1",
                          "--master-addr", "10.96.12.34", "--master-port", "2222",
                          str(script(weird_tmp)), cwd=weird_tmp, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("detected: ascend-operator pod (MS_ROLE=MS_WORKER), node 1")


def test_rank_table_timeout_outside_a_pod_is_refused(weird_tmp: Path) -> None:
    result = run_cli_here("--dry-run", "--rank-table-timeout", "5", str(script(weird_tmp)),
                          cwd=weird_tmp)
    assert_one_line_error(result, "--rank-table-timeout waits for the rank table of an "
                          "operator's Kubernetes pod; this is none")
    bad = run_cli_here("--dry-run", "--rank-table-timeout", "nan", str(script(weird_tmp)),
                       cwd=weird_tmp, env=pod_env("ascend_worker_1_of_2", weird_tmp, 0))
    assert_one_line_error(bad, "--rank-table-timeout nan: expected seconds between 0 and")


# The wait for the operator's rank table ----------------------------------------------------------

def test_wait_goes_on_through_missing_cut_and_initializing_tables_until_completed(
        tmp_path: Path) -> None:
    table = tmp_path / "hccl.json"
    written: dict[str, float] = {}

    def operator() -> None:  # what the ascend-operator does to the file, in order
        for text in ("", '{"status": "initializing"}', '{"status": "initializing", "server_',
                     '{"status": "completed", "server_count": "2", "server_list": []}'):
            time.sleep(0.3)
            table.write_text(text)
            written[text[:24]] = time.monotonic()

    thread = threading.Thread(target=operator)
    err = io.StringIO()
    thread.start()
    waited = pod_waits.wait_for_rank_table(str(table), 30, err, poll=0.02)
    returned = time.monotonic()
    thread.join()
    assert returned >= written['{"status": "completed", '], "returned before the table was completed"
    assert 1.0 < waited < 10, waited
    lines = err.getvalue().splitlines()
    assert lines == [f'npu-launch: waiting for the operator\'s rank table {table} to read "status": '
                     f'"completed" (now missing), up to 30 s',
                     f"npu-launch: rank table {table} completed after {waited:.1f} s"]


def test_a_completed_table_is_not_waited_for(tmp_path: Path) -> None:
    table = tmp_path / "hccl.json"
    table.write_text('{"status": "completed"}')
    err = io.StringIO()
    assert pod_waits.wait_for_rank_table(str(table), 5, err) == 0.0
    assert err.getvalue() == ""


@pytest.mark.parametrize("text, said", [
    (None, "missing"), ("", "empty"), ('{"status": "initia', "not JSON"),
    ("[1]", "not a JSON object"), ('{"server_count": "2"}', 'without a "status"'),
    ('{"status": "initializing"}', '"initializing"'), ("[" * 100000, "not JSON"),
])
def test_the_last_status_is_named_when_the_wait_runs_out(text, said: str,
                                                          tmp_path: Path) -> None:
    table = tmp_path / "hccl.json"
    if text is not None:
        table.write_text(text)
    clock = iter(range(0, 1000, 2))
    with pytest.raises(LaunchError) as caught:
        pod_waits.wait_for_rank_table(str(table), 10, io.StringIO(), clock=lambda: float(next(clock)),
                                 sleep=lambda s: None)
    assert caught.value.message.startswith(f"rank table {table}: still {said} after 10 s")


def test_timeout_in_a_pod_is_one_line_naming_the_file_and_nothing_starts(weird_tmp: Path) -> None:
    (weird_tmp / "hccl.json").write_text('{"status": "initializing"}')
    env = pod_env("ascend_worker_1_of_2", weird_tmp, 0)
    started = time.monotonic()
    result = run_launcher("--rank-table-timeout", "1.5", "--job-id", "late", "--log-dir",
                          str(weird_tmp / "late"), str(script(weird_tmp)), cwd=weird_tmp, env=env)
    assert time.monotonic() - started >= 1.5
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [result.stderr.splitlines()[-1]] and errors[0] == (
        f"npu-launch: error: rank table {weird_tmp / 'hccl.json'}: still \"initializing\" after "
        "1.5 s (the operator writes \"completed\" once every pod of the job is placed; "
        "--rank-table-timeout waits longer): nothing was started")
    assert "detected: ascend-operator pod" in result.stderr
    assert not (weird_tmp / "late").exists(), "a job that never started made its log directory"


def test_the_mounted_table_is_waited_for_only_where_its_folder_is(monkeypatch) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "m", "MASTER_PORT": "23456",
           "WORLD_SIZE": "2", "RANK": "1"}
    folders: list[str] = []
    monkeypatch.setattr(pods.os.path, "isdir", lambda path: path in folders)
    assert pods.read_pod(env).rank_table is None
    folders.append("/user/serverid/devindex/config")
    assert pods.read_pod(env).rank_table == "/user/serverid/devindex/config/hccl.json"
    assert pods.read_pod({**env, pods.RANK_TABLE_ENV: "/t/h.json"}).rank_table == "/t/h.json"
    assert pods.read_pod({k: v for k, v in env.items() if k != "KUBERNETES_SERVICE_HOST"}) is None


def test_a_pod_waits_for_its_table_then_ends_with_the_jobs_exit_code(weird_tmp: Path) -> None:
    """A one-node ascend-operator job whose scheduler pod has the cards: the rank starts only
    once the table reads completed, fails, and the pod ends with its code; no ssh is run. The
    rank is plain Python (``plain_job.py``): the wait is the launcher's."""
    table = weird_tmp / "hccl.json"
    table.write_text('{"status": "initializing"}')
    trap = weird_tmp / "bin"
    trap.mkdir()
    (trap / "ssh").write_text(f"#!/bin/sh\necho \"$@\" >> '{weird_tmp}/ssh-called'\nexit 255\n")
    (trap / "ssh").chmod(0o755)
    env = pod_env("ascend_scheduler_with_cards", weird_tmp, free_port(), MS_WORKER_NUM="1")
    env["PATH"] = f"{trap}:{env['PATH']}"
    job = weird_tmp / "plain_job.py"
    job.write_text((RANK_SCRIPTS / "plain_job.py").read_text())

    def operator() -> None:
        # 2 s after the launcher started (not after the test did): under load its start-up
        # alone can take that long, and a table completed before it looks is not waited for.
        wait_for(lambda: any("podfail" in (p.info["cmdline"] or []) for p in
                             psutil.process_iter(["cmdline"])), "the launcher of the pod's job")
        time.sleep(2)
        table.write_text('{"status": "completed", "server_count": "1", "server_list": []}')
        completed.append(time.time())

    completed: list[float] = []
    thread = threading.Thread(target=operator)
    thread.start()
    result = run_launcher("--job-id", "podfail", "--log-dir", str(weird_tmp / "logs"),
                          "--kill-timeout", "3", str(job), "--fail-rank", "0", cwd=weird_tmp,
                          env=env)
    thread.join()
    assert result.returncode == 1, result.stderr[-3000:]
    assert "ValueError: boom on rank 0" in result.stderr
    assert f"rank table {table} completed after" in result.stderr
    events = [json.loads(line) for line in
              (weird_tmp / "logs" / "events" / "rank_0.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["event"] == "started")
    assert started["time"] >= completed[0], "the rank started before the table was completed"
    assert not (weird_tmp / "ssh-called").exists(), "npu-launch ran ssh in a pod"


def test_a_master_name_is_resolved_and_waited_for(tmp_path: Path) -> None:
    """MindSpore's scheduler takes no name: Kubeflow's MASTER_ADDR (the master pod's service)
    becomes its IP, once it resolves."""
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "MASTER_ADDR": "job-master-0",
           "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
    pod = pods.read_pod(env)
    answers = iter([OSError(-2, "Name or service not known")] * 3 + ["10.244.1.7"])

    def resolve(name: str) -> str:
        answer = next(answers)
        if isinstance(answer, OSError):
            raise answer
        return answer

    err = io.StringIO()
    found = pod_waits.with_master_ip(pod, 30, err, poll=0.0, resolve=resolve)
    assert (found.master_addr, found.master_name) == ("10.244.1.7", "job-master-0")
    assert "scheduler 10.244.1.7:23456 (job-master-0) on node 0" in found.describe()
    assert err.getvalue() == ("npu-launch: waiting for MASTER_ADDR=job-master-0 to resolve (the "
                              "scheduler's pod may not run yet): Name or service not known\n")

    def never(name: str) -> str:
        raise OSError(-2, "Name or service not known")

    assert pod_waits.with_master_ip(pod, None, err, resolve=never) == pod  # a dry run asks once
    clock = iter(range(0, 100, 5))
    with pytest.raises(LaunchError) as caught:
        pod_waits.with_master_ip(pod, 10, io.StringIO(), resolve=never, sleep=lambda s: None,
                            clock=lambda: float(next(clock)))
    assert caught.value.message.startswith("MASTER_ADDR=job-master-0: the name does not resolve "
                                           "after 10 s (Name or service not known;")
    ip_pod = pods.read_pod({**env, "MASTER_ADDR": "10.0.0.9"})
    assert pod_waits.with_master_ip(ip_pod, 10, err, resolve=never) == ip_pod
