"""``npu-launch msrun``: msrun 2.10's options as msrun spells and reads them, the npu-launch job
they become, the one line per given option that behaves differently, and bad input as one line
with exit 2 and nothing started (most through ``cli.main`` in this process, the error funnel the
command has; the issue's own examples through the real command)."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import RANK_SCRIPTS, assert_one_line_error, run_launcher

from launcher.cli import main as cli
from launcher.config import msrun_args, msrun_compat
from launcher.config.launch_config import LaunchConfig

JOB = str(RANK_SCRIPTS / "ms_job.py")


def job(*words: str) -> tuple[LaunchConfig, msrun_compat.Translation]:
    return cli.msrun_config(msrun_args.parse(words, cli.run_option_arity()))


def run_args(*words: str) -> tuple[str, ...]:
    return job(*words)[1].run_args


def notes(*words: str) -> tuple[str, ...]:
    return job(*words)[1].notes


# Reading msrun's words -----------------------------------------------------------------------------

def test_msruns_defaults_apply_where_an_option_is_not_given() -> None:
    config, translation = job(JOB)
    assert (config.cards, config.nnodes, config.startup_timeout, config.master_port) == (8, None, 600, None)
    assert (config.log_dir, str(config.console), config.device.value, config.launcher) == (
        None, "all", "auto", "local")
    assert translation.notes == ()


@pytest.mark.parametrize("option, value", [
    ("--worker_num", "4"), ("--local_worker_num", "2"), ("--master_addr", "10.1.2.3"),
    ("--master_port", "29500"), ("--node_rank", "1"), ("--log_dir", "my logs"),
    ("--join", "True"), ("--cluster_time_out", "-1"), ("--bind_core", "True"),
    ("--bind_numa", "False"), ("--rank_table_file", "table.json"), ("--worker_log_name", "w_{ip}"),
    ("--tail_worker_log", "0,1"), ("--node_rank", "-1"),
])
def test_both_spellings_of_a_value_read_alike(option: str, value: str) -> None:
    base = ("--worker_num=4", "--local_worker_num=2", "--node_rank=0")
    joined = msrun_args.parse((*base, f"{option}={value}", JOB), cli.run_option_arity())
    apart = msrun_args.parse((*base, option, value, JOB), cli.run_option_arity())
    assert joined == apart
    assert (joined.script, joined.script_args) == (JOB, ())


@pytest.mark.parametrize("text, value", [("True", True), ("False", False), ("1", True), ("0", False)])
def test_join_takes_what_msruns_literal_eval_takes(text: str, value: bool) -> None:
    assert msrun_args.parse((f"--join={text}", JOB), {}).join is value


def test_the_script_may_follow_python_or_a_double_dash_and_keeps_its_own_options() -> None:
    for words in (("python", JOB), ("python3", JOB), ("--", JOB), (JOB,)):
        parsed = msrun_args.parse(("--worker_num=1", *words, "--steps", "2", "--worker_num=9"), {})
        assert (parsed.script, parsed.script_args, parsed.worker_num) == (
            JOB, ("--steps", "2", "--worker_num=9"), 1)


def test_one_node_maps_to_cards_and_the_given_scheduler_address() -> None:
    assert run_args("--worker_num=2", "--local_worker_num=2", "--master_addr=10.0.0.5",
                    "--master_port", "29500", JOB, "--steps", "2") == (
        "--launcher", "local", "--cards", "2", "--master-addr", "10.0.0.5", "--master-port", "29500",
        "--startup-timeout", "600", JOB, "--steps", "2")


def test_several_nodes_map_to_this_nodes_share_of_a_job_started_by_hand() -> None:
    config, _ = job("--worker_num", "16", "--local_worker_num", "8", "--node_rank", "1", JOB)
    assert (config.cards, config.nnodes, config.node_rank, config.master_addr, config.master_port) == (
        8, 2, 1, "127.0.0.1", 8118)


def test_rank_table_mode_leaves_the_nodes_to_the_table() -> None:
    config, translation = job("--worker_num=16", "--local_worker_num=8", "--node_rank=1",
                              "--rank_table_file=hccl.json", JOB)
    assert (config.rank_table, config.nnodes, config.node_rank, config.cards) == ("hccl.json", None, None, 8)
    assert translation.notes == (
        "--rank_table_file hccl.json: becomes --rank-table: rank-table mode (RANK_TABLE_FILE, RANK_ID and "
        "DEVICE_ID from the table, no scheduler; msrun keeps its scheduler and only exports RANK_TABLE_FILE); "
        "this server's share is found in the table by its addresses, not --node_rank",)
    assert job("--rank_table_file=auto", JOB)[0].rank_table == "./auto", "a file named auto, not generated"


def test_npu_launch_options_msrun_has_no_word_for_pass_through() -> None:
    config, _ = job("--worker_num=2", "--dry-run", "--local_worker_num=2", "--json", "--env", "A=1",
                    "--job-id=j1", "--hang-timeout", "30", "--no-gradients-mean", JOB)
    assert (config.dry_run, config.json, config.env, config.job_id, config.hang_timeout) == (
        True, True, (("A", "1"),), "j1", 30)
    assert config.parallel.gradients_mean is False


def test_bind_core_true_is_npu_launchs_auto_binding(capsys: pytest.CaptureFixture) -> None:
    config, _ = job("--bind_core=True", JOB)
    assert (config.bind_cores, config.bind_numa) == ("auto", False)
    assert job("--bind_numa=True", JOB)[0].bind_numa is True
    assert job("--bind-cores", "0", JOB)[0].bind_cores == "0", "npu-launch's own list may be given instead"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["msrun", "--worker_num=2", "--local_worker_num=2", "--bind_core=True", "--dry-run", JOB])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.count("  cmd: taskset -c ") == 2, "each rank runs under taskset, as in msrun"


def test_help_shows_the_mapping(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["msrun", "--worker_num=2", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("Usage: npu-launch msrun")
    assert "--tail_worker_log R     --console R" in out


# One line per given option that behaves differently -------------------------------------------------

@pytest.mark.parametrize("words, note", [
    (["--join=True"], "--join True: npu-launch always waits for the job and ends with its exit code"),
    (["--join", "False"], "--join False: ignored: npu-launch always waits for the job (msrun would return "
                          "once it started the processes) and ends with its exit code"),
    (["--tail_worker_log=0"], "--tail_worker_log 0: becomes --console 0"),
    (["--tail_worker_log", "-1"], "--tail_worker_log -1: becomes --console all"),
    (["--worker_log_name=w_{hostname}"], "--worker_log_name: ignored, logs are rank_N.log"),
    (["--bind_core=True"], "--bind_core True: becomes --bind-cores auto: each card's CPU affinity from npu-smi, "
                           "else this host's allowed cores split by local rank (the cores may differ from "
                           "msrun's pick)"),
    (["--bind_numa=true"], "--bind_numa True: becomes --bind-numa: each rank's memory on the NUMA nodes of its "
                           "cores, which are bound too (as --bind-cores auto unless given)"),
    (["--cluster_time_out=300"], "--cluster_time_out 300: becomes --startup-timeout 300: a rank not "
                                 "initialised by then stops the job, named"),
    (["--cluster_time_out", "-1"], "--cluster_time_out -1: becomes --startup-timeout 0: no limit on start-up"),
    (["--log_dir=out"], "--log_dir out: becomes --log-dir; ranks log to rank_N.log (msrun: worker_N.log), "
                        "beside npu-launch's events/ and summary.json"),
    (["--node_rank=3"], "--node_rank 3: ignored: all 2 ranks run on this node (as in msrun)"),
    (["--worker_num=4", "--node_rank=1"], "--node_rank 1: node 1 of 2: npu-launch runs the scheduler on node 0, "
                                          "so start node 0 on the --master_addr host (msrun: whichever host "
                                          "owns that address)"),
])
def test_a_given_option_that_behaves_differently_says_so_in_one_line(words: list[str], note: str) -> None:
    assert notes("--worker_num=2", "--local_worker_num=2", *words, JOB) == (note,)


@pytest.mark.parametrize("words", [
    ["--master_addr=10.0.0.1"], ["--master_port=29500"], ["--bind_core=False"], ["--node_rank=0"],
    ["--node_rank=-1"], ["--dry-run"],
])
def test_options_that_behave_as_in_msrun_say_nothing(words: list[str]) -> None:
    assert notes("--worker_num=2", "--local_worker_num=2", *words, JOB) == ()


def test_notes_come_before_the_job_and_follow_the_order_given(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["msrun", "--worker_num=1", "--local_worker_num=1", "--tail_worker_log=0",
                  "--join=True", "--dry-run", "--device", "cpu", JOB])
    assert exit_.value.code == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[:2] == ["npu-launch msrun: --tail_worker_log 0: becomes --console 0",
                                    "npu-launch msrun: --join True: npu-launch always waits for the job "
                                    "and ends with its exit code"]
    assert "1 rank(s) on 1 node(s)" in out


# Bad input: one line naming the option, exit 2, nothing started --------------------------------------

@pytest.mark.parametrize("words, line", [
    (["--worker-num=2", JOB], "no such msrun option: '--worker-num' (did you mean --worker_num?)"),
    (["-x", JOB], "no such msrun option: '-x'"),
    (["--worker_num=abc", JOB], "--worker_num 'abc': expected a whole number"),
    (["--worker_num", JOB], f"--worker_num {JOB!r}: expected a whole number"),
    (["--log_dir", "--join=True", JOB], "--log_dir: expected a value (--log_dir=VALUE or --log_dir VALUE)"),
    (["--worker_num=3", "--local_worker_num=2", JOB],
     "--node_rank: needed with --worker_num 3 > --local_worker_num 2: a job of several nodes started on each "
     "node (msrun would let MindSpore number the ranks; npu-launch numbers them by node)"),
    (["--local_worker_num=2", JOB], "--node_rank: needed with --worker_num 8 (msrun's default) > "
                                    "--local_worker_num 2"),
    (["--worker_num=5", "--local_worker_num=2", "--node_rank=0", JOB],
     "--worker_num 5: not a multiple of --local_worker_num 2 (every node runs as many ranks)"),
    (["--worker_num=4", "--local_worker_num=2", "--node_rank=2", JOB], "--node_rank 2: expected 0-1 (2 nodes of 2 ranks)"),
    (["--worker_num=2", JOB], "--local_worker_num 8 (msrun's default): more than --worker_num 2"),
    (["--worker_num=0", JOB], "--worker_num 0: expected at least 1"),
    (["--worker_num=1", "--local_worker_num=0", JOB], "--local_worker_num 0: npu-launch starts at least one rank"),
    (["--worker_num=2", "--local_worker_num=2"], "no script given: npu-launch msrun [MSRUN OPTIONS]"),
    (["--worker_num=2", "--local_worker_num=2", "python"], "no script given"),
    (["--worker_num=2", "--local_worker_num=2", "no_such.py"], "script 'no_such.py': no such file"),
    (["python", "-m", "train"], "python '-m': npu-launch msrun runs a script file"),
    (["pytest", "test_x.py"], "pytest: npu-launch msrun runs a Python script"),
    (["--join=true", JOB], "--join 'true': expected True or False (msrun's spelling)"),
    (["--join=yes", JOB], "--join 'yes': expected True or False"),
    (["--sim_level=1", JOB], "--sim_level: refused: npu-launch has no simulation (dry-run compile) mode"),
    (["--sim_level=7", JOB], "--sim_level 7: expected 0, 1, 2 or 3"),
    (["--sim_rank_id=0", JOB], "--sim_rank_id: refused"),
    (["--tail_worker_log=a", JOB], "--tail_worker_log 'a': expected -1 (every rank) or ranks like 0,3"),
    (["--worker_num=2", "--local_worker_num=2", "--tail_worker_log=5", JOB],
     "--tail_worker_log: --console 5: the job has ranks 0-1, not 5"),
    (["--bind_core=maybe", JOB], "--bind_core 'maybe': expected True, False or a JSON object"),
    (['--bind_core={"gpu0": ["0"]}', JOB], "--bind_core: key 'gpu0': expected 'scheduler' or 'deviceN'"),
    (['--bind_core={"device0": "0-3"}', JOB], "--bind_core: device0: expected a list of ranges"),
    (["--bind_numa=nowhere.json", JOB], "--bind_numa 'nowhere.json': no such file"),
    (['--bind_core={"device0": ["0-3"], "scheduler": ["4"]}', JOB],
     "--bind_core: a per-card map or binding file is not supported: --bind_core=True binds each rank as "
     "npu-launch's --bind-cores auto does, or give the cores as --bind-cores LIST (split by local rank)"),
    (["--bind_core=True", "--bind-cores=0-1", JOB], "--bind_core: give it or npu-launch's --bind-cores, not both"),
    (["--local_worker_num=100", "--worker_num=100", JOB], "--local_worker_num: --cards 100: expected 1-64"),
    (["--worker_num=2", "--local_worker_num=2", "--master_port=70000", JOB],
     "--master_port: --master-port 70000: expected 1-65535"),
    (["--worker_num=2", "--local_worker_num=2", "--cluster_time_out=99999999", JOB],
     "--cluster_time_out: --startup-timeout 99999999.0: expected seconds"),
    (["--worker_num=2", "--local_worker_num=2", "--rank_table_file=none.json", JOB],
     "--rank_table_file: none.json: cannot read the rank table"),
    (["--cards", "2", JOB], "--cards: with npu-launch msrun, say it as --local_worker_num"),
    (["--console=0", JOB], "--console: with npu-launch msrun, say it as --tail_worker_log"),
    (["--hostfile", "hosts", JOB], "--hostfile: not with npu-launch msrun"),
    (["--config", "c.yaml", JOB], "--config: not with npu-launch msrun"),
    (["--worker_num=1", "--local_worker_num=1", "--json", JOB], "--json goes with --dry-run"),
    (["--worker_num=1", "--local_worker_num=1", "--kill-timeout", "soon", JOB], "Invalid value for '--kill-timeout'"),
])
def test_bad_input_is_one_line_and_exit_2(words: list[str], line: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["msrun", "--log_dir=logs", *words])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, err
    (said,) = err.strip().splitlines()
    assert said.startswith(f"npu-launch: error: {line}"), said
    assert out == "" and list(tmp_path.iterdir()) == [], "nothing started, nothing made"


@pytest.mark.parametrize("words, needle", [
    (["--worker_num=2", "--local_worker_num=2", "--no-such", JOB], "no such msrun option: '--no-such'"),
    (["--worker_num=abc", JOB], "--worker_num 'abc': expected a whole number"),
    (["--worker_num", "3", "--local_worker_num", "2", JOB], "--node_rank: needed with --worker_num 3 > "
                                                            "--local_worker_num 2"),
])
def test_the_real_command_refuses_in_one_line(words: list[str], needle: str, tmp_path: Path) -> None:
    result = run_launcher("msrun", "--log_dir", str(tmp_path / "logs"), *words, cwd=tmp_path)
    assert_one_line_error(result, needle)
    assert list(tmp_path.iterdir()) == []
