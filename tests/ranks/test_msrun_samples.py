"""The msrun command lines of MindSpore's public samples (``tests/fixtures/msrun_samples``, each
with its source path and commit) under ``npu-launch msrun``, their script replaced by the small
data-parallel job ``tests/rank_scripts/ms_job.py``.

Each line becomes the npu-launch job it means: the ``npu-launch run`` options, the notes and the
``LaunchConfig`` are compared with ``tests/golden/msrun/<sample>.json`` and with an explicit
expectation. After an intended change, refresh the golden files with
``NPU_LAUNCH_UPDATE_GOLDEN=1 python -m pytest tests/ranks/test_msrun_samples.py`` and review the diff
(a refreshing run compares nothing, so it reports each of those tests as skipped).

Two of them also run for real, shrunk to 2 ranks and a free port: ``msrun_single.sh`` as one
node of 2 ranks, and ``msrun_1.sh`` with ``msrun_2.sh`` as 2 nodes of 1 CPU rank started by hand
on this host; the job succeeds and the ranks end with the same parameters. The single node runs
plain-Python ranks (``plain_job.py``: what it shows is the command, its notes and its log
folder, none of it MindSpore's); the two nodes run real MindSpore ranks, which form one cluster
through the scheduler the first node starts.
"""
from __future__ import annotations

import json
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers import GOLDEN, RANK_SCRIPTS, TESTS, checksums, npu_launch_argv
from helpers import assert_golden as golden

from launcher.cli import main as cli
from launcher.config import msrun_args, msrun_compat
from launcher.config.launch_config import LaunchConfig
from launcher.errors import ConfigError

SAMPLES = TESTS / "fixtures" / "msrun_samples"
MSRUN_GOLDEN = GOLDEN / "msrun"
JOB = "ms_job.py"
"""The samples' scripts (net.py, ...) become this job, found from ``tests/rank_scripts``."""
MASTER = "192.0.2.1"
"""What ``<node_1 ip address>`` in the samples becomes (an address reserved for documentation)."""


def sample_words(name: str, master: str = MASTER) -> list[str]:
    """The words after ``msrun`` in a sample's command line (shell continuations joined), its
    placeholder ``<node_1 ip address>`` (a shell redirection, were it run as it stands) filled
    in with ``master``."""
    lines = [line for line in (SAMPLES / name).read_text().splitlines() if not line.startswith("#")]
    text = " ".join(lines).replace("\\ ", " ").replace("<node_1 ip address>", shlex.quote(master))
    words = shlex.split(text)
    assert words[0] == "msrun", words
    return words[1:]


def source_of(name: str) -> str:
    return (SAMPLES / name).read_text().splitlines()[0].lstrip("# ")


def with_values(words: list[str], script: list[str], **values: str) -> list[str]:
    """``words`` with options set (``worker_num="2"`` sets ``--worker_num=2``) and the script
    and its arguments replaced by ``script``."""
    options = [w for w in words if w.startswith("--")]
    for key, value in values.items():
        options = [o for o in options if o.split("=", 1)[0] != f"--{key}"] + [f"--{key}={value}"]
    return [*options, *script]


def translated(words: list[str]) -> tuple[LaunchConfig, msrun_compat.Translation]:
    return cli.msrun_config(msrun_args.parse(words, cli.run_option_arity()))


SAMPLE_NAMES = sorted(p.name for p in SAMPLES.glob("*.sh"))


def _expected(cards: int, nnodes: Optional[int], node_rank: Optional[int],
              master_addr: Optional[str], master_port: Optional[int], log_dir: str) -> dict[str, Any]:
    return {"cards": cards, "nnodes": nnodes, "node_rank": node_rank, "master_addr": master_addr,
            "master_port": master_port, "log_dir": log_dir, "startup_timeout": 300.0,
            "launcher": "local", "rank_table": None, "script": JOB, "script_args": ()}


EXPECTED: dict[str, Any] = {
    "startup_method_msrun_1.sh": _expected(4, 2, 0, MASTER, 8118, "msrun_log"),
    "startup_method_msrun_2.sh": _expected(4, 2, 1, MASTER, 8118, "msrun_log"),
    "startup_method_msrun_single.sh": _expected(8, None, None, None, 8118, "msrun_log"),
    "mindio_ttp_msrun.sh": _expected(4, None, None, None, 10970, "msrun_log"),
    "high_dimension_tensor_parallel_run.sh": _expected(8, None, None, None, 8118, "log_output"),
    "startup_method_msrun_single_8x4.sh": "--node_rank: needed with --worker_num 8 > --local_worker_num 4",
}


def test_every_sample_has_an_expectation() -> None:
    assert set(SAMPLE_NAMES) == set(EXPECTED), "a sample without an expectation, or the reverse"
    for name in SAMPLE_NAMES:
        assert source_of(name).startswith("mindspore-ai/docs docs/sample_code/"), name
        assert " @ " in source_of(name) and len(source_of(name).split(" @ ")[1]) == 40, name


def _golden_record(name: str, words: list[str]) -> dict[str, Any]:
    record: dict[str, Any] = {"source": source_of(name), "msrun": shlex.join(["msrun", *words])}
    try:
        config, translation = translated(words)
    except ConfigError as e:
        return {**record, "error": e.message}
    fields = ("cards", "nnodes", "node_rank", "master_addr", "master_port", "log_dir",
              "startup_timeout", "launcher", "rank_table", "script", "script_args")
    return {**record, "npu_launch": shlex.join(["npu-launch", "run", *translation.run_args]),
            "notes": list(translation.notes),
            "config": {f: _plain(getattr(config, f)) for f in fields}
            | {"console": str(config.console), "device": config.device.value}}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def assert_golden(name: str, record: dict[str, Any]) -> None:
    golden(MSRUN_GOLDEN / name.replace(".sh", ".json"), json.dumps(record, indent=2) + "\n",
           f"{name}'s job")


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_becomes_the_expected_job(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(RANK_SCRIPTS)
    words = with_values(sample_words(name), [JOB])
    expected = EXPECTED[name]
    if isinstance(expected, str):
        with pytest.raises(ConfigError) as refused:
            translated(words)
        assert refused.value.message.startswith(expected), refused.value.message
    else:
        config, translation = translated(words)
        assert {key: getattr(config, key) for key in expected} == expected
        assert str(config.console) == "all" and config.device.value == "auto"
        assert any(note.startswith("--join ") for note in translation.notes)
        assert any(note.startswith("--log_dir ") for note in translation.notes)
    assert_golden(name, _golden_record(name, words))


def test_the_samples_placeholder_address_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    words = [*sample_words("startup_method_msrun_1.sh", "<node_1 ip address>")[:-1], str(RANK_SCRIPTS / JOB)]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["msrun", *words])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("npu-launch: error: --master_addr: --master-addr '<node_1 ip address>': expected a host "
                    "name or an IP address")


# For real: 2 CPU ranks ---------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(words: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(npu_launch_argv("msrun", *words), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_msrun_single_runs_as_one_node_of_two_ranks(weird_tmp: Path) -> None:
    job = [str(RANK_SCRIPTS / "plain_job.py"), "--steps", "2"]
    words = with_values(sample_words("startup_method_msrun_single.sh"), job, worker_num="2",
                        local_worker_num="2", master_port=str(_free_port()))
    out, err = _start(words, weird_tmp).communicate(timeout=300)
    # npu-launch's own lines first: once in about 50 runs a rank failed after its last line,
    # and the last 3000 characters held only its log's tail, not which process failed or how.
    said = "\n".join(line for line in err.splitlines() if line.startswith("npu-launch"))
    assert "finished: 2 rank(s) exited 0" in err, said[-3000:] + "\n" + err[-1500:]
    sums = checksums(out)
    assert set(sums) == {f"[{socket.gethostname()}:{r}]" for r in (0, 1)}, out[-2000:]
    assert len(set(sums.values())) == 1, f"ranks disagree: {sums}"
    logs = weird_tmp / "msrun_log"
    assert (logs / "rank_0.log").exists() and (logs / "rank_1.log").exists()
    assert json.loads((logs / "summary.json").read_text())["root_cause"] is None
    assert err.index("npu-launch msrun: --join True") < err.index("finished"), "notes come first"


@pytest.mark.mindspore
def test_msrun_1_and_2_run_as_two_nodes_started_by_hand(weird_tmp: Path) -> None:
    """Both nodes on this host, each its own launcher and log folder, as two servers would."""
    job = [str(RANK_SCRIPTS / JOB), "--steps", "2"]
    port = str(_free_port())
    procs = []
    for node, name in enumerate(("startup_method_msrun_1.sh", "startup_method_msrun_2.sh")):
        words = with_values(sample_words(name), job, worker_num="2", local_worker_num="1",
                            master_addr="127.0.0.1", master_port=port, log_dir=f"node{node}")
        procs.append(_start(words, weird_tmp))
    outs = [p.communicate(timeout=300) for p in procs]
    for proc, (_out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]
    sums = {**checksums(outs[0][0]), **checksums(outs[1][0])}
    host = socket.gethostname()
    assert set(sums) == {f"[{host}:0]", f"[{host}:1]"}, outs
    assert len(set(sums.values())) == 1, f"ranks disagree: {sums}"
    assert "--node_rank 1: node 1 of 2" in outs[1][1]
