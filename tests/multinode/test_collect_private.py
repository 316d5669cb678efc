"""Node 0 collects a sliced checkpoint from hosts that share no storage, and gives a wiped host
its slice back: 2 hosts x 1 rank, a model-parallel layout (``--parallel semi --mp 2``, so the
plan is not replicated: no rank's file can stand in for another's).

The rank script (tests/rank_scripts/slice_ckpt.py) needs no MindSpore, which runs model
parallelism only on Ascend: the launcher accepts the layout on CPU, and only ``parallel.init()``
in a rank would refuse it, which this script never calls. Each step it writes its own slice and
reports it as the trainer does; host 2's agent sends rank 1's slices to node 0 as they come.

In the wiped variant rank 1 waits, after its checkpoint of step 2, until the test has seen that
slice arrive in node 0's log directory (and the step complete), deletes its host's checkpoints
and fails; the restart must give it its own slice back, byte for byte. With
``--no-checkpoint-collect`` nothing is sent, and the same restart stops with the line naming
rank, step and host. A data-parallel job whose launcher runs no rank gets one replica
collected; on storage every host shares, nothing is sent, and host 2's agent says why.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import pytest
from helpers import RANK_SCRIPTS, wait_for

from .jobs import assert_no_job_processes, job_dir, launch_on, run_on_node0, write_hostfile

pytestmark = [pytest.mark.multinode]
SCRIPT = RANK_SCRIPTS / "slice_ckpt.py"
STEPS, FAIL_AT = 4, 2
LAST_MB = 64
"""The last step's slices: large enough that sending one takes longer than the job's end."""
SLICE = "slice_rank1.bin"


def _content(rank: int, step: int) -> bytes:
    spec = importlib.util.spec_from_file_location("slice_ckpt", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.content(rank, step, LAST_MB << 20 if step == STEPS else module.SLICE_BYTES)


def _sha(rank: int, step: int) -> str:
    return hashlib.sha256(_content(rank, step)).hexdigest()


def _job_dir(cluster, tmp_path_factory, name: str) -> Path:
    """A job directory with the hostfile in it, on every host."""
    work = tmp_path_factory.mktemp(name)
    write_hostfile(work, cluster, slots=1)
    return job_dir(cluster, work, scripts=())


def _args(cluster, work: Path, job: str, log_dir: Path, *extra: str) -> list[str]:
    return ["--hostfile", str(work / "hosts"),
            "--ssh-option", f"-F {cluster.ssh_config_path}", "--device", "cpu",
            "--console", "none", "--job-id", job, "--log-dir", str(log_dir),
            "--startup-timeout", "0", "--parallel", "semi", "--mp", "2", *extra]


def _run_gated(cluster, work: Path, args: list[str], ready: list[Path],
               failing_host: str, also: Callable[[], bool] = lambda: True) -> tuple[int, str]:
    """Run the job from node 0 until every path in ``ready`` is there and ``also`` holds (the
    failing rank waits for ``work/go`` on its host, so the state the test checks is reached
    before it fails), then let the rank go on; the ended launcher's exit code and stderr."""
    node0 = cluster.names[0]
    launcher = launch_on(cluster, node0, args, cwd=work)
    try:
        wait_for(lambda: launcher.poll() is not None
                    or (all(cluster.exists(node0, path) for path in ready) and also()),
                    f"{', '.join(map(str, ready))} on node 0", timeout=60, every=0.5)
        assert launcher.poll() is None, launcher.communicate()[1][-4000:]
        assert cluster.run_on(failing_host, ["touch", str(work / "go")]).returncode == 0
        _, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return launcher.returncode, err


def _fail_args(rank: int) -> list[str]:
    return [str(SCRIPT), "--steps", str(STEPS), "--fail-rank", str(rank), "--fail-at",
            str(FAIL_AT), "--go", "go", "--wipe"]


def _sha_on(cluster, host: str, path: Path) -> str:
    res = cluster.run_on(host, ["sha256sum", str(path)])
    assert res.returncode == 0, f"no {path} on {host}: {res.stderr}"
    return res.stdout.split()[0]


def _collected(cluster, host: str, ledger: Path) -> list[str]:
    """``step_N/rank_R`` folders of collected copies in node 0's ledger."""
    res = cluster.run_on(host, ["find", str(ledger), "-mindepth", "2", "-maxdepth", "2",
                                "-type", "d", "-name", "rank_*"])
    return sorted(str(Path(p).relative_to(ledger)) for p in res.stdout.split())


def test_node_0_collects_the_slices_and_gives_a_wiped_host_its_own_back(
        ssh_cluster, tmp_path_factory) -> None:
    work = _job_dir(ssh_cluster, tmp_path_factory, "collect-wiped")
    a, b = ssh_cluster.names
    logs, job = work / "logs", "collect-wiped"
    ledger = logs / "checkpoint_ledger"
    # Sent while rank 1 still runs (it waits for the test): in the background, not at the end.
    arrived = ledger / f"step_{FAIL_AT}" / "rank_1" / SLICE
    code, err = _run_gated(ssh_cluster, work, _args(
        ssh_cluster, work, job, logs, "--max-restarts", "1", *_fail_args(1), "--last-mb",
        str(LAST_MB)), [arrived, ledger / f"step_{FAIL_AT}" / "manifest.json"], b)
    assert code == 0, err[-4000:]
    assert f"restart 1 of 1 after: job {job} failed: rank 1" in err

    node0 = lambda path: ssh_cluster.read_text(a, logs / path) or ""  # noqa: E731
    # The restarted rank 1 found its own slice of the resume step on its wiped host: node 0's.
    assert f"rank 1 resumed from step {FAIL_AT}: my slice is here, sha256 {_sha(1, FAIL_AT)}" \
        in node0("rank_1.log"), node0("rank_1.log")[-2000:]
    assert f"resume: rank 1: {len(_content(1, FAIL_AT))} bytes of step {FAIL_AT} from node 0" \
        in node0(f"agents/{b}.log")
    restored = logs / "checkpoints" / f"step_{FAIL_AT}" / SLICE
    assert _sha_on(ssh_cluster, b, restored) == _sha(1, FAIL_AT)

    # Node 0 keeps the newest complete step's slice only, and never rank 0's, on its own disk;
    # the last one came though the job ended as it was being sent (its agent sends it first).
    assert _collected(ssh_cluster, a, ledger) == [f"step_{STEPS}/rank_1"]
    assert _sha_on(ssh_cluster, a, ledger / f"step_{STEPS}" / "rank_1" / SLICE) == \
        _sha(1, STEPS)
    summary = json.loads(node0("summary.json"))
    assert summary["complete_steps"] == list(range(1, STEPS + 1))
    size, last = len(_content(1, 1)), len(_content(1, STEPS))
    moved = summary["checkpoints_collected"]
    # At least step 2's slice before the failure and step 4's after; steps a newer one
    # overtook in the agent's queue are never sent.
    assert moved["files"] >= 2 and moved["bytes"] == (moved["files"] - 1) * size + last, moved
    assert moved["seconds"] > 0, moved
    assert summary["checkpoints_sent"] == {"files": 1, "bytes": size,
                                           "seconds": summary["checkpoints_sent"]["seconds"]}
    assert summary["checkpoint_storage"] == "private"
    assert_no_job_processes(ssh_cluster, job)


def test_with_collection_off_a_wiped_host_stops_the_restart_naming_rank_step_and_host(
        ssh_cluster, tmp_path_factory) -> None:
    work = _job_dir(ssh_cluster, tmp_path_factory, "collect-off")
    a, b = ssh_cluster.names
    logs, job = work / "logs", "collect-off"
    code, err = _run_gated(ssh_cluster, work, _args(
        ssh_cluster, work, job, logs, "--max-restarts", "1", "--no-checkpoint-collect",
        *_fail_args(1)), [logs / "checkpoint_ledger" / f"step_{FAIL_AT}" / "manifest.json"], b)
    assert code == 1, err[-3000:]
    slice_path = logs / "checkpoints" / f"step_{FAIL_AT}" / SLICE
    assert (f"rank 1's checkpoint of step {FAIL_AT} is not on {b} ({slice_path}) and node 0 "
            "has no copy to stand in for it") in err
    assert _collected(ssh_cluster, a, logs / "checkpoint_ledger") == []
    summary = json.loads(ssh_cluster.read_text(a, logs / "summary.json") or "{}")
    assert summary["checkpoints_collected"]["files"] == 0
    assert_no_job_processes(ssh_cluster, job)


def test_a_data_parallel_job_whose_launcher_runs_no_rank_gets_one_replica_collected(
        ssh_cluster, tmp_path_factory) -> None:
    """The launcher on the first host, both ranks on the second (the only one in the
    hostfile): node 0 holds no rank's file, so that host's agent sends it rank 0's, and the
    wiped host resumes both ranks from it."""
    a, b = ssh_cluster.names
    work = tmp_path_factory.mktemp("collect-dp")
    (work / "hosts").write_text(f"{b} slots=2\n")
    job_dir(ssh_cluster, work, scripts=())
    logs, job = work / "logs", "collect-dp"
    ledger = logs / "checkpoint_ledger"
    data_parallel = [arg for arg in _args(ssh_cluster, work, job, logs)
                     if arg not in ("--parallel", "semi", "--mp", "2")]
    # Rank 0 fails once rank 1, on the same host, is done (its files go too).
    code, err = _run_gated(ssh_cluster, work, [
        *data_parallel, "--cards", "2", "--max-restarts", "1", *_fail_args(0), "--replicas"],
        [ledger / f"step_{FAIL_AT}" / "rank_0" / "slice_rank0.bin",
         ledger / f"step_{FAIL_AT}" / "manifest.json"], b,
        also=lambda: "rank 1 done" in (ssh_cluster.read_text(a, logs / "rank_1.log") or ""))
    assert code == 0, err[-4000:]
    assert f"restart 1 of 1 after: job {job} failed: rank 0" in err
    node0 = lambda path: ssh_cluster.read_text(a, logs / path) or ""  # noqa: E731
    agent_b = node0(f"agents/{b}.log")
    size = len(_content(0, FAIL_AT))
    for rank in (0, 1):  # host b lost both files; rank 0's copy stands in for each
        assert f"resume: rank {rank}: {size} bytes of step {FAIL_AT} from node 0" in agent_b
        assert f"rank {rank} resumed from step {FAIL_AT}: my slice is here, sha256 " \
            f"{_sha(0, FAIL_AT)} (rank 0's)" in node0(f"rank_{rank}.log")
    assert _collected(ssh_cluster, a, ledger) == [f"step_{STEPS}/rank_0"]  # rank 1's: never
    summary = json.loads(node0("summary.json"))
    assert summary["checkpoints_sent"]["files"] == 2
    assert summary["checkpoints_collected"]["files"] >= 2
    assert summary["checkpoint_storage"] == "private"
    assert_no_job_processes(ssh_cluster, job)


@pytest.fixture
def shared_dir(ssh_cluster) -> Iterator[Path]:
    """A folder every test host sees, as the same files (the cluster's own work directory)."""
    path = Path(tempfile.mkdtemp(prefix="collect-", dir=ssh_cluster.work_subdir("shared")))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_on_shared_storage_nothing_is_sent_and_the_agent_says_why(
        ssh_cluster, tmp_path_factory, shared_dir: Path) -> None:
    work = _job_dir(ssh_cluster, tmp_path_factory, "collect-shared")
    a, b = ssh_cluster.names
    logs, job = shared_dir / "logs", "collect-shared"
    result = run_on_node0(ssh_cluster, _args(ssh_cluster, work, job, logs, str(SCRIPT),
                                             "--steps", "2"), cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    agent_b = (logs / "agents" / f"{b}.log").read_text()
    assert "checkpoints: this host sees the launcher's log directory (shared storage): its " \
        "ranks' files stay where they are, none is sent to node 0" in agent_b, agent_b[-2000:]
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["complete_steps"] == [1, 2]
    assert summary["checkpoints_collected"]["files"] == 0
    assert summary["checkpoint_storage"] == "shared"
    assert not list((logs / "checkpoint_ledger").glob("step_*/rank_*"))
    assert_no_job_processes(ssh_cluster, job)
