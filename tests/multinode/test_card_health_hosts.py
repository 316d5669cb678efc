"""Card health on the multi-host test world, with fake Ascend cards (``ascend.py``): the
driver's tools are fakes that print recorded real output (``tests/fixtures/ascend_tools``),
the device nodes plain files; the processes that hold them are real.

* A card whose HCCL link is down is refused before anything starts, in one line, exit 2; with
  ``--min-nodes`` its host is left out at start-up and the job finishes on the other host, its
  data-parallel replicas equal.
* A host without the tools is named once as unchecked.
* A mixed cluster: an Atlas A3 host (16 devices, two dies per NPU) has its 16 cards checked per
  die (an alarmed die refuses the job, naming that die), and a host whose npu-smi prints a layout
  no rule reads (Ascend 950) is named once as unchecked, refusing nothing.
* A stray process holding a failed host's card delays the restart until it lets go; the job
  then resumes and finishes.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from helpers import checksums, wait_for

from .ascend import break_card, give_cards, hold_card_argv, node0_env, take_cards
from .jobs import assert_no_job_processes, initialised, job_dir, launch_on, run_on_node0, write_hostfile

pytestmark = pytest.mark.multinode
JOB = "plain_job.py"
"""Plain-Python ranks that write the contract's events (card checks are the launcher's)."""


@pytest.fixture
def cards(ssh_cluster):
    """Two fake cards with tools on every host; taken away afterwards."""
    for host in ssh_cluster.names:
        give_cards(ssh_cluster, host, (0, 1))
    yield ssh_cluster
    take_cards(ssh_cluster, ssh_cluster.names)


def _args(cluster, work: Path, job: str, *extra: str) -> list[str]:
    return ["--hostfile", str(work / "hosts"), "--ssh-option", f"-F {cluster.ssh_config_path}",
            "--device", "npu", "--job-id", job, "--log-dir", str(work / job),
            "--kill-timeout", "3", *extra]


def test_link_down_refused_then_left_out_with_min_nodes(cards, tmp_path_factory) -> None:
    cluster = cards
    work = tmp_path_factory.mktemp("link-down")
    write_hostfile(work, cluster, slots=2)
    job_dir(cluster, work, scripts=(JOB,))
    a, b = cluster.names
    break_card(cluster, b, "link_1", "DOWN")
    refused = run_on_node0(cluster, _args(cluster, work, "cards-refused", JOB),
                           cwd=work, env=node0_env(cluster))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"npu-launch: error: {b} card 1: link DOWN (hccn_tool -i 1 -link -g): nothing was "
        "started"]
    assert not any(cluster.exists(h, work / "cards-refused") for h in cluster.names)
    assert_no_job_processes(cluster, "cards-refused")

    table = run_on_node0(cluster, ["preflight", "--hostfile", str(work / "hosts"),
                                   "--ssh-option", f"-F {cluster.ssh_config_path}",
                                   "--device", "npu"], cwd=work, env=node0_env(cluster))
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert table.returncode == 1, table.stdout + table.stderr
    assert rows[a].rstrip().endswith("ok") and "ok (2, " in rows[a], rows
    assert "1 bad" in rows[b] and "FAIL: card 1: link DOWN (hccn_tool -i 1 -link -g)" in rows[b]

    shrunk = run_on_node0(cluster, _args(cluster, work, "cards-shrunk", "--min-nodes", "1",
                                         "--max-restarts", "1", JOB, "--steps", "3"),
                          cwd=work, env=node0_env(cluster))
    assert shrunk.returncode == 0, shrunk.stderr[-3000:]
    assert (f"npu-launch: leaving {b} out at start-up: {b} card 1: link DOWN (hccn_tool -i 1 "
            "-link -g); 1 host(s) go on (--min-nodes 1)") in shrunk.stderr
    sums = checksums(shrunk.stdout)
    assert set(sums) == {f"[{a}:0]", f"[{a}:1]"} and len(set(sums.values())) == 1, sums
    assert not cluster.exists(b, work / "cards-shrunk"), "nothing ran on the left-out host"
    assert_no_job_processes(cluster, "cards-shrunk")


def test_a_host_without_tools_is_named_once(cards, tmp_path_factory) -> None:
    cluster = cards
    work = tmp_path_factory.mktemp("no-tools")
    write_hostfile(work, cluster, slots=2)
    job_dir(cluster, work, scripts=(JOB,))
    a, b = cluster.names
    give_cards(cluster, b, (0, 1), tools=False)
    result = run_on_node0(cluster, _args(cluster, work, "cards-unchecked", "--dry-run",
                                         JOB), cwd=work, env=node0_env(cluster))
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "skipped" in line]
    assert said == [f"npu-launch: card checks skipped on {b} (health and processes: no npu-smi; "
                    "link, network health, device IP: no hccn_tool)"], result.stderr


def _failing_once(cluster, work: Path, job: str, *extra: str):
    """A job of one rank per host whose rank 1 fails in attempt 0 (after 4 s), restarted once
    with no backoff: started on node 0 and waited for until both ranks initialised."""
    write_hostfile(work, cluster, slots=1)
    job_dir(cluster, work, scripts=(JOB,))
    proc = launch_on(cluster, cluster.names[0],
                     _args(cluster, work, job, "--max-restarts", "1", "--restart-backoff", "0",
                           *extra, JOB, "--sleep-after-init", "4", "--fail-at-attempt", "0:1"),
                     cwd=work, env=node0_env(cluster))
    wait_for(lambda: initialised(cluster, work / job, range(2)) or proc.poll() is not None,
             f"{job}: 2 ranks initialised", 180, every=0.5)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    return proc


def test_a_held_card_delays_the_restart_until_it_is_free(cards, tmp_path_factory) -> None:
    cluster = cards
    work = tmp_path_factory.mktemp("held")
    a, b = cluster.names
    job = "cards-held"
    proc = _failing_once(cluster, work, job)
    stamp = "/tmp/npl-ascend/let-go"
    stray = cluster.popen_on(b, hold_card_argv(0, 8, stamp))  # not the job's: a stray
    out, err = proc.communicate(timeout=300)
    stray.wait(timeout=60)
    assert proc.returncode == 0, err[-4000:]
    assert (f"npu-launch: checking {b}'s card(s) 0 before the restart (waiting up to 60 s for "
            "them to be free)") in err
    let_go = float(cluster.read_text(b, Path(stamp)))
    summary = json.loads(cluster.read_text(a, work / job / "summary.json"))
    attempts = summary["attempts"]
    assert [x["outcome"] for x in attempts] == ["failed", "succeeded"], attempts
    assert attempts[1]["started_at"] > let_go > attempts[0]["ended_at"], (let_go, attempts)
    assert len(set(checksums(out).values())) == 1
    assert_no_job_processes(cluster, job)


def test_a_stop_signal_while_a_host_waits_for_a_held_card_ends_the_job_and_its_probe(
        cards, tmp_path_factory) -> None:
    """As above, but the stray never lets go within ``--card-free-timeout 600``, and node 0's
    launcher gets SIGTERM while the probe waits on the other host: the job ends at once (exit
    143, as between attempts), node 0 closes the probe's ssh, and the probe there ends too."""
    cluster = cards
    work = tmp_path_factory.mktemp("held-stop")
    a, b = cluster.names
    job = "cards-held-stop"
    proc = _failing_once(cluster, work, job, "--card-free-timeout", "600")
    stray = None
    try:
        stray = cluster.popen_on(b, hold_card_argv(0, 3600, "/tmp/npl-ascend/let-go-never"))
        wait_for(lambda: _probes_waiting(cluster, b) or proc.poll() is not None,
                 f"the re-check's probe waiting on {b}", 180, every=0.5)
        proc.send_signal(signal.SIGTERM)  # inside node 0, to the launcher itself
        _, err = proc.communicate(timeout=300)  # a wait not cut short would take 600 s
    finally:
        if proc.poll() is None:
            proc.kill()
        if stray is not None:
            stray.kill()
    assert proc.returncode == 143, err[-4000:]
    assert f"job {job} stopped by SIGTERM while waiting to restart" in err, err[-4000:]
    assert _probes_waiting(cluster, b) == [], "the probe outlived the job"
    assert_no_job_processes(cluster, job)


def _probes_waiting(cluster, host: str) -> list[str]:
    """The re-check probes running on ``host`` (``launcher.cluster.probe --wait-free``)."""
    return [" ".join(p["cmdline"]) for p in cluster.processes(host)
            if "launcher.cluster.probe" in p["cmdline"] and "--wait-free" in p["cmdline"]]


def test_an_a3_host_is_checked_per_die_and_an_unknown_layout_is_skipped(ssh_cluster, tmp_path_factory) -> None:
    cluster = ssh_cluster
    work = tmp_path_factory.mktemp("a3")
    write_hostfile(work, cluster, slots=16)
    job_dir(cluster, work, scripts=(JOB,))
    a, b = cluster.names
    try:
        for host, recording in ((a, "npu-smi-info-a3.txt"), (b, "npu-smi-info-950.txt")):
            give_cards(cluster, host, range(16))
            break_card(cluster, host, "recording", recording)
        planned = run_on_node0(cluster, _args(cluster, work, "a3-planned", "--dry-run", JOB),
                               cwd=work, env=node0_env(cluster))
        assert planned.returncode == 0, planned.stderr
        said = [line for line in planned.stderr.splitlines() if "card checks" in line]
        assert said == [
            f"npu-launch: card checks ran {a}, {b} (/tmp/npl-ascend/bin/hccn_tool, /tmp/npl-ascend/bin/npu-smi)",
            f"npu-launch: card checks skipped on {b} (health and processes: /tmp/npl-ascend/bin/npu-smi info "
            "(npu-smi 25.7.rc1) not understood: no '| NPU  Name | Health |' header)"], planned.stderr
        break_card(cluster, a, "health_9", "Alarm")  # NPU 4's second die
        refused = run_on_node0(cluster, _args(cluster, work, "a3-refused", "--dry-run", JOB),
                               cwd=work, env=node0_env(cluster))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines()[-1] == (
            f"npu-launch: error: {a} card 9: health Alarm (npu-smi info): nothing was started")
    finally:
        take_cards(cluster, cluster.names)
