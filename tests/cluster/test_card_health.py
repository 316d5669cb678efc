"""Card health (``launcher.cluster.card_health``, ``launcher.cluster.card_checks``) on this machine, with the
fake driver tools of ``tests/fixtures/ascend_tools`` (recorded real output) and real processes
holding the fake device nodes."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from helpers import (
    RANK_SCRIPTS,
    TESTS,
    assert_no_job_processes,
    assert_one_line_error,
    fake_devfs,
    initialised,
    npu_launch_argv,
    run_launcher,
    wait_for,
)

from launcher.cluster.card_checks import judge_at_start, skipped_note
from launcher.cluster.card_health import CardProblem, CardReport, check_cards, holders_of, parse_npu_smi_info
from launcher.cluster.preflight import HostCheck
from launcher.cluster.probe import HostFacts
from launcher.errors import LaunchError

TOOLS = TESTS / "fixtures" / "ascend_tools"
RECORDED = (TOOLS / "npu-smi-info.txt").read_text()


@pytest.fixture
def host(weird_tmp: Path) -> dict:
    """This machine as a fake 2-card host: device nodes, the fake tools first on PATH, their
    fault folder."""
    faults = weird_tmp / "faults"
    faults.mkdir()
    return {**os.environ, "NPU_LAUNCH_DEVFS": str(fake_devfs(weird_tmp / "dev", range(2))),
            "PATH": f"{TOOLS / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "NPL_FAKE_ASCEND_FAULTS": str(faults)}


def _fault(env: dict, name: str, value: str) -> None:
    Path(env["NPL_FAKE_ASCEND_FAULTS"], name).write_text(value + "\n")


def test_the_recorded_npu_smi_table_parses() -> None:
    health, processes, idle = parse_npu_smi_info(RECORDED)
    assert health == {n: "OK" for n in range(8)}
    assert processes == {2: [(1333928, "")]}
    assert idle == {0, 1, 3, 4, 5, 6, 7}


def test_the_fake_npu_smi_prints_the_recorded_device_table(host: dict) -> None:
    out = subprocess.run(["npu-smi", "info"], env=host, capture_output=True, text=True,
                         check=True).stdout
    head = RECORDED.split("| NPU     Chip")[0]
    assert out.startswith(head)
    assert parse_npu_smi_info(out)[2] == set(range(8)), "no process without a fault file"


def test_healthy_cards_pass_with_their_device_ips(host: dict) -> None:
    report = check_cards([0, 1], host)
    assert report.ok and report.skipped == ()
    assert report.ips == {0: "192.168.100.100", 1: "192.168.100.101"}


@pytest.mark.parametrize("fault, value, said", [
    ("link_1", "DOWN", "link DOWN (hccn_tool -i 1 -link -g)"),
    ("net_health_1", "Fault", "net health Fault (hccn_tool -i 1 -net_health -g)"),
    ("health_1", "Alarm", "health Alarm (npu-smi info)"),
    ("no_ip_1", "", "no device IP (failed (1): fake hccn_tool: device 1 has no IP address) "
                    "(hccn_tool -i 1 -ip -g)"),
])
def test_each_fault_names_the_card_and_the_tool(host: dict, fault: str, value: str,
                                                said: str) -> None:
    _fault(host, fault, value)
    report = check_cards([0, 1], host)
    assert [p.describe("node3") for p in report.problems] == [f"node3 card 1: {said}"]


def test_net_health_init_passes(host: dict) -> None:
    _fault(host, "net_health_0", "Init")
    assert check_cards([0], host).ok


def _holder(path: str) -> subprocess.Popen:
    """A real process holding ``path`` open until its stdin closes."""
    code = "import sys; f = open(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_process_holding_a_card_is_found_by_proc_and_by_npu_smi(host: dict) -> None:
    devfs = host["NPU_LAUNCH_DEVFS"]
    proc = _holder(f"{devfs}/davinci1")
    try:
        name = Path(f"/proc/{proc.pid}/comm").read_text().strip()
        assert holders_of([0, 1], devfs) == [(1, proc.pid, name)]
        said = [p.describe("h") for p in check_cards([0, 1], host).problems]
        assert said == [f"h card 1: held by pid {proc.pid} ({name}) ({devfs}/davinci1)"]
        _fault(host, "process_1", f"{proc.pid} python")  # npu-smi sees it too: told once
        said = [p.describe("h") for p in check_cards([0, 1], host).problems]
        assert said == [f"h card 1: held by pid {proc.pid} (python) (npu-smi info)"]
    finally:
        proc.stdin.close()
        proc.wait()


def test_a_restart_check_waits_until_the_card_is_let_go(host: dict) -> None:
    devfs = host["NPU_LAUNCH_DEVFS"]
    proc = _holder(f"{devfs}/davinci0")
    seen = threading.Event()

    def let_go_once_seen() -> None:
        while not holders_of([0], devfs):
            pass
        seen.set()
        proc.stdin.close()
    threading.Thread(target=let_go_once_seen, daemon=True).start()
    report = check_cards([0], host, free_within=600)
    proc.wait()
    assert seen.is_set() and report.ok, report


def test_a_card_never_let_go_is_reported_held(host: dict) -> None:
    proc = _holder(f"{host['NPU_LAUNCH_DEVFS']}/davinci0")
    try:
        report = check_cards([0], host, free_within=0.3)
        assert [p.held for p in report.problems] == [True]
    finally:
        proc.stdin.close()
        proc.wait()


def test_a_stop_signal_ends_the_wait_for_held_cards_at_once(host: dict, weird_tmp: Path) -> None:
    """As above, but ``--card-free-timeout 600`` and SIGTERM once the re-check waits: the job
    ends then, as a stop signal between attempts does (exit 143, nothing was running), not
    after the wait and its verdict; nothing of the job is left."""
    logs, err_path = weird_tmp / "logs", weird_tmp / "err.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(npu_launch_argv(
            "--device", "npu", "--max-restarts", "1", "--restart-backoff", "0", "--job-id",
            "held-card-stop", "--card-free-timeout", "600", "--log-dir", str(logs),
            str(RANK_SCRIPTS / "plain_job.py"), "--sleep-after-init", "3",
            "--fail-at-attempt", "0:1"), env=host, stdout=subprocess.DEVNULL, stderr=err)
    holder = None
    try:
        wait_for(lambda: initialised(logs, range(2)) or proc.poll() is not None, "2 ranks up")
        holder = _holder(f"{host['NPU_LAUNCH_DEVFS']}/davinci1")
        wait_for(lambda: "before the restart (waiting up to 600 s" in err_path.read_text()
                 or proc.poll() is not None, "the re-check waiting for card 1")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)  # a wait not cut short would still be waiting: 600 s
    finally:
        if proc.poll() is None:
            proc.kill()
        if holder is not None:
            holder.stdin.close()
            holder.wait()
    said = err_path.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, said[-3000:]
    assert "job held-card-stop stopped by SIGTERM while waiting to restart" in said, said[-3000:]
    assert "not restarted" not in said and "restart 1 of 1" in said
    assert_no_job_processes("held-card-stop")


def test_the_probe_waiting_for_a_card_ends_when_its_input_does(host: dict) -> None:
    """The probe node 0 runs over ssh for a re-check: while it waits for a held card, the end
    of its standard input (node 0 stopped and closed its ssh) ends it, with no answer."""
    holder = _holder(f"{host['NPU_LAUNCH_DEVFS']}/davinci0")
    try:
        probe = subprocess.Popen([sys.executable, "-m", "launcher.cluster.probe", "--check-cards",
                                  "0", "--wait-free", "600"], env=host, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        wait_for(lambda: psutil.Process(probe.pid).num_threads() >= 2,
                 "the probe reading its input as it waits")
        assert probe.poll() is None, "it waits for card 0"
        probe.stdin.close()
        probe.wait(timeout=300)  # not cut short, it would wait 600 s
        out = probe.stdout.read()
    finally:
        holder.stdin.close()
        holder.wait()
    assert (probe.returncode, out) == (1, "")


def test_a_host_without_the_tools_skips_and_says_which(host: dict) -> None:
    bare = {**host, "PATH": "/nonexistent"}
    report = check_cards([0], bare)
    assert report.ok and report.skipped == ("health and processes: no npu-smi",
                                            "link, network health, device IP: no hccn_tool")
    assert skipped_note({"a": report, "b": report, "c": CardReport((0,))}) == (
        "npu-launch: card checks skipped on a, b (health and processes: no npu-smi; link, "
        "network health, device IP: no hccn_tool)")


def _check(host: str, *problems: CardProblem, other: str = "") -> HostCheck:
    said = tuple(f"card {p.card}: {p.problem} ({p.source})" for p in problems)
    return HostCheck(host, HostFacts(), ((other,) if other else ()) + said, None,
                     CardReport((0, 1), problems))


def test_start_up_refuses_or_leaves_out_the_host_of_a_bad_card() -> None:
    down = CardProblem(5, "link DOWN", "hccn_tool -i 5 -link -g")
    checks = [_check("node1"), _check("node2"), _check("node3", down)]
    with pytest.raises(LaunchError) as refused:
        judge_at_start(checks, None)
    assert refused.value.message == ("node3 card 5: link DOWN (hccn_tool -i 5 -link -g): "
                                     "nothing was started")
    with pytest.raises(LaunchError, match=r"\(--min-nodes 3: 2 host\(s\) left\)"):
        judge_at_start(checks, 3)
    verdict = judge_at_start(checks, 2)
    assert verdict.left_out == ("node3",)
    assert verdict.notes == ("npu-launch: leaving node3 out at start-up: node3 card 5: link "
                             "DOWN (hccn_tool -i 5 -link -g); 2 host(s) go on (--min-nodes 2)",)
    unreachable = [_check("node1", other="unreachable: x"), _check("node3", down)]
    assert judge_at_start(unreachable, 1).left_out == (), "preflight's table tells the rest"


def test_a_single_node_with_a_bad_card_starts_nothing(host: dict, weird_tmp: Path) -> None:
    _fault(host, "link_1", "DOWN")
    script = weird_tmp / "job.py"
    script.write_text("print('ran')\n")
    result = run_launcher("--device", "npu", "--log-dir", str(weird_tmp / "logs"), str(script),
                          env=host)
    assert_one_line_error(result, "card 1: link DOWN (hccn_tool -i 1 -link -g): nothing was "
                                  "started")
    assert not (weird_tmp / "logs").exists()


def test_a_card_still_held_after_the_timeout_stops_the_restart(host: dict,
                                                                weird_tmp: Path) -> None:
    """One node, 2 ranks on fake cards: rank 1 fails in attempt 0; a stray process took card 1
    meanwhile and never lets go: the re-check before the restart waits ``--card-free-timeout``
    and stops the job, naming the card, instead of restarting. The ranks are plain Python
    (``plain_job.py``): the re-check is the launcher's, whatever the ranks run."""
    script = RANK_SCRIPTS / "plain_job.py"
    logs = weird_tmp / "logs"
    proc = subprocess.Popen(npu_launch_argv(
        "--device", "npu", "--max-restarts", "1", "--restart-backoff", "0",
        "--card-free-timeout", "0.5", "--log-dir", str(logs), str(script),
        "--sleep-after-init", "3", "--fail-at-attempt", "0:1"), env=host,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: initialised(logs, range(2)) or proc.poll() is not None, "2 ranks up")
        holder = _holder(f"{host['NPU_LAUNCH_DEVFS']}/davinci1")
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    holder.stdin.close()
    holder.wait()
    assert proc.returncode == 1, err[-3000:]
    name = socket.gethostname()
    assert f"npu-launch: checking {name}'s card(s) 0, 1 before the restart" in err
    assert (f"not restarted: {name} card 1: held by pid {holder.pid} (") in err, err[-3000:]
    assert "restart 1 of 1" in err and "rank 1 fails in attempt 0" in err
