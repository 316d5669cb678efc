"""The launch directory on every host, without a network: which files preflight compares, how a
host that differs is named, what ``--sync-workdir`` would copy and how it refuses.

The copy itself over real ssh, on hosts that share no files, is tests/multinode/test_workdir_sync.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_launcher

from launcher.cluster import probe, workdir_sync
from launcher.cluster.backends import TransportOptions
from launcher.cluster.card_health import CardProblem, CardReport
from launcher.cluster.preflight import MAX_COMPARED_FILES, HostCheck, files_problem, launch_files, render
from launcher.cluster.probe import FileFact, HostFacts
from launcher.cluster.workdir_sync import LaunchDir, sync_stale_hosts, unpack_argv
from launcher.config.hostfile import HostSelection
from launcher.errors import LaunchError


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fact(data: bytes) -> FileFact:
    return FileFact(len(data), _sha(data))


# ------------------------------------------------------------------ what a host reports
def test_a_file_is_reported_by_size_and_sha256_or_why_not(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_bytes(b"print(1)\n")
    os.mkfifo(tmp_path / "pipe")  # opening it would block the probe for ever
    (tmp_path / "folder").mkdir()
    facts = probe.file_facts(["train.py", "gone.py", "pipe", "folder"], str(tmp_path))
    assert facts == {"train.py": _fact(b"print(1)\n"), "gone.py": FileFact(problem="missing"),
                     "pipe": FileFact(problem="not a regular file"),
                     "folder": FileFact(problem="not a regular file")}


def test_a_file_over_the_hash_bound_is_reported_by_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(probe.MAX_HASHED_BYTES + 1)  # sparse: nothing is written
    assert probe.file_fact(str(big)) == FileFact(probe.MAX_HASHED_BYTES + 1, None)


@pytest.mark.parametrize("answer, fact", [
    ({"size": 3, "sha256": "ab"}, FileFact(3, "ab")),
    ({"size": 3}, FileFact(3, None)),
    ({"problem": "missing"}, FileFact(problem="missing")),
    ({"problem": "\x1b[2J rm -rf"}, FileFact(problem="not reported")),
    ({"size": True, "sha256": "ab"}, FileFact(problem="not reported")),
    ({"size": "3"}, FileFact(problem="not reported")),
    ([1, 2], FileFact(problem="not reported")),
    (None, FileFact(problem="not reported")),
])
def test_a_probe_answer_is_parsed_once_and_never_trusted(answer, fact) -> None:
    assert FileFact.from_json(answer) == fact
    assert FileFact.from_json(fact.to_json()) == fact


def test_a_probe_answer_is_typed_once_and_nonsense_is_none() -> None:
    health = CardReport((0, 1), (CardProblem(1, "link DOWN", "hccn_tool -i 1 -link -g", True),),
                        ("device IP: no hccn_tool",), {0: "10.0.0.1"}, 0.25, {"npu-smi": "/bin/npu-smi"})
    answer = {**probe.report(None, {"a.py": FileFact(3, "ab")}), "card_health": health.to_json()}
    facts = HostFacts.from_json(answer)
    assert facts is not None and facts.hostname == answer["hostname"] and facts.cards == answer["cards"]
    assert facts.files == {"a.py": FileFact(3, "ab")} and facts.card_health == health
    assert CardReport.from_json({}) == CardReport() and HostFacts.from_json({}) == HostFacts()
    for nonsense in ([1], {"cards": "8"}, {"cards": None, "hostname": 5}, {"mindspore": 2.3}):
        assert HostFacts.from_json(nonsense) is None, nonsense
    odd = HostFacts.from_json({"port_free": "yes", "files": [1], "card_health": {"cards": ["0"]}})
    assert odd == HostFacts(), "what is only shown or checked later is left out"
    for nonsense in ({"problems": "ab"}, {"problems": [{"card": 1}]}, {"ips": {"x": "1"}},
                     {"ips": [["0", "ip"]]}, {"seconds": "1"}, {"tools": {"a": 1}}, {"cards": [True]}):
        assert CardReport.from_json(nonsense) is None, nonsense


# ------------------------------------------------------------------ which files are compared
def test_the_script_and_its_file_arguments_inside_the_launch_dir_are_compared(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "conf").mkdir(parents=True)
    (work / "train.py").write_text("x")
    (work / "conf" / "job.yaml").write_text("lr: 1")
    (work / "-odd name.txt").write_text("y")
    (tmp_path / "outside.yaml").write_text("z")
    with open(work / "data.bin", "wb") as f:
        f.truncate(probe.MAX_HASHED_BYTES + 1)
    args = ["--config", "conf/job.yaml", "--lr", "0.1", str(work / "conf" / "job.yaml"),
            "../outside.yaml", str(tmp_path / "outside.yaml"), "data.bin", "conf", ".", "",
            "-odd name.txt", "x" * 5000]
    assert launch_files(str(work), "train.py", args) == ("train.py", "conf/job.yaml",
                                                         "-odd name.txt")
    assert launch_files(str(work), str(work / "train.py"), []) == ("train.py",)


def test_a_script_outside_the_launch_dir_or_a_package_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").write_text("x")
    (tmp_path / "work").mkdir()
    assert launch_files(str(tmp_path), "pkg", []) == ("pkg/__main__.py",)
    assert launch_files(str(tmp_path / "work"), str(tmp_path / "pkg"), []) == (
        str(tmp_path / "pkg" / "__main__.py"),)


def test_at_most_so_many_files_are_compared(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x")
    names = [f"f{i}.txt" for i in range(3 * MAX_COMPARED_FILES)]
    for name in names:
        (tmp_path / name).write_text(name)
    found = launch_files(str(tmp_path), "train.py", names)
    assert found == ("train.py", *names[:MAX_COMPARED_FILES - 1])


# ------------------------------------------------------------------ how a host that differs is named
NODE0_SCRIPT = b"print('node 0')\n"
OURS = {"train.py": _fact(NODE0_SCRIPT), "conf.yaml": _fact(b"lr: 1\n")}


def test_the_same_files_are_no_problem() -> None:
    assert files_problem(OURS, dict(OURS)) is None
    assert files_problem({}, {}) is None


def test_one_problem_names_every_file_missing_or_different() -> None:
    changed = b"print('node 9')\n"  # the same size: the sha256 tells them apart
    theirs = {"train.py": _fact(changed), "conf.yaml": _fact(b"lr: 10\n")}
    assert files_problem(OURS, theirs) == (
        f"train.py differs from node 0's (sha256 {_sha(changed)[:12]} vs "
        f"{_sha(NODE0_SCRIPT)[:12]}), "
        "conf.yaml differs from node 0's (size 7 vs 6 bytes)")
    assert files_problem(OURS, {"conf.yaml": FileFact(problem="missing")}) == (
        "train.py is not reported, conf.yaml is missing")


def test_files_over_the_hash_bound_are_told_apart_by_size_alone() -> None:
    big = {"data.bin": FileFact(probe.MAX_HASHED_BYTES + 1)}
    assert files_problem(big, dict(big)) is None
    assert files_problem(big, {"data.bin": FileFact(5, "ab")}) == (
        f"data.bin differs from node 0's (size 5 vs {probe.MAX_HASHED_BYTES + 1} bytes)")


def test_what_node_0_cannot_read_is_not_compared() -> None:
    assert files_problem({"x": FileFact(problem="unreadable")}, {}) is None


def test_an_odd_file_name_or_digest_keeps_the_table_one_line_per_host() -> None:
    ours = {"a\nb.py": _fact(b"1")}
    problem = files_problem(ours, {"a\nb.py": FileFact(1, "\x1b[2J" + "0" * 60)})
    assert problem == "'a\\nb.py' differs from node 0's (sha256 unknown vs " + _sha(b"1")[:12] + ")"


def test_the_table_names_the_host_and_the_files_that_differ() -> None:
    facts = HostFacts(hostname="n2", npu_launch="0.1", mindspore="2.3", cards=0)
    stale = "train.py differs from node 0's (sha256 a1b2c3d4e5f6 vs d4e5f6a1b2c3)"
    table = render([HostCheck("n1", dataclasses.replace(facts, hostname="n1"), ()),
                    HostCheck("n2", facts, (stale,), stale)])
    assert table.splitlines() == [
        "host  hostname  npu-launch  mindspore  cards  status",
        "n1    n1        0.1         2.3        0      ok",
        f"n2    n2        0.1         2.3        0      FAIL: {stale}"]


# ------------------------------------------------------------------ what --sync-workdir copies
def _tree(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    for name in ("train.py", "conf/job.yaml", "npu_launch_logs/old/rank_0.log",
                 "runs/mine/rank_0.log", "runs/kept.txt", "nested/npu_launch_logs/kept.log"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(name)
    os.symlink("train.py", work / "link.py")
    return work


def _members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_copy_leaves_out_the_log_directories_and_keeps_links(tmp_path: Path) -> None:
    work = _tree(tmp_path)
    archive, tally = LaunchDir.of(str(work), "runs/mine").archive()
    members = _members(archive)
    assert sorted(members) == ["conf", "conf/job.yaml", "link.py", "nested",
                               "nested/npu_launch_logs", "nested/npu_launch_logs/kept.log",
                               "runs", "runs/kept.txt", "train.py"]
    assert members["link.py"].issym() and members["link.py"].linkname == "train.py"
    assert tally == LaunchDir.of(str(work), "runs/mine").measure()
    assert tally.entries == len(members)


def test_a_log_directory_outside_or_the_launch_dir_itself_excludes_nothing_more(tmp_path: Path) -> None:
    work = _tree(tmp_path)
    assert LaunchDir.of(str(work), str(tmp_path / "elsewhere")).excluded == {
        str(work / "npu_launch_logs"), str(tmp_path / "elsewhere")}
    assert LaunchDir.of(str(work), ".").excluded == {str(work / "npu_launch_logs")}


def test_a_launch_dir_over_the_cap_is_refused_in_one_line(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with open(work / "data.bin", "wb") as f:
        f.truncate(workdir_sync.MAX_SYNC_BYTES + 1)
    with pytest.raises(LaunchError) as refused:
        LaunchDir.of(str(work), None).measure()
    assert refused.value.message == (
        f"--sync-workdir: the launch directory {work} holds more than 100 MiB, the most it "
        "copies (log directories left out): put data on shared storage or outside it, or copy "
        "the directory yourself")
    (work / "data.bin").unlink()
    (work / "npu_launch_logs").mkdir()  # logs do not count
    with open(work / "npu_launch_logs" / "huge.log", "wb") as f:
        f.truncate(workdir_sync.MAX_SYNC_BYTES + 1)
    assert LaunchDir.of(str(work), None).measure() == workdir_sync.Tally(0, 0)


def test_too_many_files_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workdir_sync, "MAX_SYNC_ENTRIES", 3)
    for i in range(4):
        (tmp_path / f"f{i}").write_text("x")
    with pytest.raises(LaunchError, match="holds more than 3 files and directories"):
        LaunchDir.of(str(tmp_path), None).archive()


HOSTILE = "-x; touch PWNED $(touch PWNED) `touch PWNED` 'sq' \"dq\"\nline two"


def test_the_remote_unpack_takes_the_path_as_data(tmp_path: Path) -> None:
    """The command ssh would hand the remote shell, run by a local shell: the archive lands in
    the hostile path, made on the way, and nothing else runs."""
    source = _tree(tmp_path / "src")
    dest = tmp_path / "dest" / HOSTILE
    argv = unpack_argv(HostSelection("node1", None, (0,)), str(dest),
                       TransportOptions(22, ("-F 'my config'",)))
    assert argv[:-2] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "22",
                         "-F", "my config", "--"] and argv[-2] == "node1"
    archive, _ = LaunchDir.of(str(source), None).archive()
    shell = subprocess.run(["sh", "-c", argv[-1]], input=archive, cwd=tmp_path,
                           capture_output=True)
    assert shell.returncode == 0, shell.stderr
    assert (dest / "conf" / "job.yaml").read_text() == "conf/job.yaml"
    assert os.readlink(dest / "link.py") == "train.py"
    assert not (dest / "npu_launch_logs").exists()
    assert sorted(p.name for p in tmp_path.rglob("PWNED")) == []
    assert not Path("/PWNED").exists()


# ------------------------------------------------------------------ when --sync-workdir copies
HOSTS = [HostSelection("n1", None, (0,)), HostSelection("n2", None, (0,))]
FACTS = HostFacts(hostname="x", cards=0)
STALE = "train.py is missing"


def _never(*_: object) -> list[HostCheck]:
    raise AssertionError("asked the hosts again")


def test_nothing_is_copied_when_nothing_is_stale_or_the_job_cannot_start_anyway(tmp_path: Path) -> None:
    source = LaunchDir.of(str(tmp_path), None)
    same = [HostCheck("n1", FACTS, ()), HostCheck("n2", FACTS, ())]
    assert sync_stale_hosts(source, HOSTS, same, TransportOptions(), _never, io.StringIO()) == same
    blocked = [HostCheck("n1", FACTS, ("master port in use",)),
               HostCheck("n2", FACTS, (STALE,), STALE)]
    err = io.StringIO()
    assert sync_stale_hosts(source, HOSTS, blocked, TransportOptions(), _never, err) == blocked
    assert err.getvalue() == ""


def test_a_dry_run_says_where_it_would_copy_and_copies_nothing(tmp_path: Path) -> None:
    source = LaunchDir.of(str(tmp_path), None)
    checks = [HostCheck("n1", FACTS, ()), HostCheck("n2", None, (f"no directory {tmp_path} there",),
                                                    f"no directory {tmp_path} there")]
    err = io.StringIO()
    judged = sync_stale_hosts(source, HOSTS, checks, TransportOptions(), _never, err, dry_run=True)
    assert [c.ok for c in judged] == [True, True]
    assert err.getvalue() == (f"npu-launch: --sync-workdir: would copy {tmp_path} to n2 "
                              "(--dry-run copies nothing)\n")


# ------------------------------------------------------------------ the option, refused where it cannot act
SCRIPT = "print('ran')\n"


def _launch_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "hosts").write_text("nowhere.invalid slots=1\n")
    return tmp_path


@pytest.mark.parametrize("args, needles", [
    (["--sync-workdir"], ["--sync-workdir copies the launch directory over ssh", "--hostfile; none given"]),
    (["--sync-workdir", "--hostfile", "hosts", "--no-preflight"], ["goes without --no-preflight"]),
    (["--sync-workdir", "--hostfile", "hosts", "--launcher", "slurm"],
     ["--sync-workdir copies over ssh; this job starts with srun", "on every node"]),
])
def test_sync_workdir_where_it_cannot_act_is_one_line_exit_2(tmp_path: Path, args, needles) -> None:
    work = _launch_dir(tmp_path)
    result = run_launcher("--device", "cpu", "--log-dir", str(work / "logs"), *args, "train.py",
                          cwd=work)
    assert_one_line_error(result, *needles)
    assert not (work / "logs").exists()


def test_sync_workdir_from_a_config_file_names_its_line(tmp_path: Path) -> None:
    work = _launch_dir(tmp_path)
    (work / "job.yaml").write_text("device: cpu\nsync-workdir: true\nscript: train.py\n")
    assert_one_line_error(run_launcher("--config", "job.yaml", cwd=work),
                          "job.yaml:2: --sync-workdir copies the launch directory")
    (work / "job.yaml").write_text("device: cpu\nsync_workdir: 1\nscript: train.py\n")
    assert_one_line_error(run_launcher("--config", "job.yaml", cwd=work),
                          "job.yaml:2: sync_workdir: expected true or false, got 1")


def test_a_launch_dir_over_the_cap_is_refused_before_any_host_is_asked(tmp_path: Path) -> None:
    """The host does not exist: the refusal comes before preflight would find that out."""
    work = _launch_dir(tmp_path)
    with open(work / "dataset.bin", "wb") as f:
        f.truncate(workdir_sync.MAX_SYNC_BYTES + 1)
    result = run_launcher("--device", "cpu", "--hostfile", "hosts", "--sync-workdir",
                          "--log-dir", str(work / "logs"), "train.py", cwd=work)
    line = assert_one_line_error(result, f"--sync-workdir: the launch directory {work} holds "
                                         "more than 100 MiB, the most it copies")
    assert "nowhere.invalid" not in line
    assert not (work / "logs").exists()
