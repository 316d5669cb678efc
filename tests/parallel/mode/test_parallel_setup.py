"""parallel.init() and the parallel context, each in a fresh interpreter (MindSpore's context is global).

Semi-auto, auto and pipeline parallelism cannot execute on CPU, so their tests check what MindSpore
reports back from ``get_auto_parallel_context`` after the context is set without communication init,
and that a model-parallel script stops at ``init()`` with a message saying it needs Ascend.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
from helpers import REPO

from parallel import contract
from parallel.config import DeviceTarget, ParallelConfig

pytestmark = pytest.mark.mindspore
GRAPH_MODE, PYNATIVE_MODE = 0, 1  # mindspore.GRAPH_MODE, mindspore.PYNATIVE_MODE
CONTEXT_KEYS = ["parallel_mode", "device_num", "global_rank", "gradients_mean", "full_batch",
                "enable_parallel_optimizer", "pipeline_stages"]


def _clean_environ(**extra: str) -> Dict[str, str]:
    """This environment without any rank identity, so the child is a process started by hand."""
    identity = {name for names in contract.RankIdentity.SOURCES.values() for name in names}
    environ = {key: value for key, value in os.environ.items()
               if key not in identity and not key.startswith(("MS_", contract.PREFIX))}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ["GLOG_v"] = "3"  # MindSpore's C++ log: errors only, so stderr stays readable
    return {**environ, **extra}


def _python(code: str, environ: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, cwd=cwd,
                          capture_output=True, text=True)


def _last_json(result: subprocess.CompletedProcess):
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


CONTEXT_CASES = [
    (ParallelConfig(mode="semi", dp=2, mp=4, pp=2, micro_batches=2), 16, 5,
     {"parallel_mode": "semi_auto_parallel", "device_num": 16, "global_rank": 5,
      "gradients_mean": True, "full_batch": False, "enable_parallel_optimizer": False,
      "pipeline_stages": 2}),
    (ParallelConfig(mode="auto", mp=2, optimizer_shard=True, full_batch=True, gradients_mean=False),
     8, 7, {"parallel_mode": "auto_parallel", "device_num": 8, "global_rank": 7,
            "gradients_mean": False, "full_batch": True, "enable_parallel_optimizer": True,
            "pipeline_stages": 1}),
    (ParallelConfig(mode="semi", pp=4, micro_batches=8), 4, 3,
     {"parallel_mode": "semi_auto_parallel", "device_num": 4, "global_rank": 3,
      "gradients_mean": True, "full_batch": False, "enable_parallel_optimizer": False,
      "pipeline_stages": 4}),
    (ParallelConfig(), 4, 2,
     {"parallel_mode": "data_parallel", "device_num": 4, "global_rank": 2, "gradients_mean": True,
      "full_batch": False, "enable_parallel_optimizer": False, "pipeline_stages": 1}),
]


def test_mindspore_reports_the_context_each_config_asks_for(tmp_path):
    cases = [[config.validate(world).to_json(), world, rank] for config, world, rank, _ in CONTEXT_CASES]
    result = _python(f"""
        import json
        import mindspore as ms
        from mindspore.communication import GlobalComm
        from parallel.config import ParallelConfig
        from parallel.mode.setup import apply_parallel_context
        reports = []
        for text, world, rank in {cases!r}:
            ms.reset_auto_parallel_context()
            apply_parallel_context(ParallelConfig.from_json(text), world, rank)
            reports.append({{key: ms.get_auto_parallel_context(key) for key in {CONTEXT_KEYS!r}}})
        print(json.dumps({{"inited": GlobalComm.INITED, "reports": reports}}))
        """, _clean_environ(), tmp_path)
    answer = _last_json(result)
    assert answer["inited"] is False
    assert answer["reports"] == [expected for *_, expected in CONTEXT_CASES]


MODEL_PARALLEL_SCRIPT = """
import numpy as np
import mindspore as ms
from mindspore import nn, ops

import parallel

info = parallel.init()
print("init returned", flush=True)


class ShardedMatMul(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones((8, 8), np.float32)))
        self.matmul = ops.MatMul().shard(((1, 2), (2, 1)))

    def construct(self, x):
        return self.matmul(x, self.weight)


print(ShardedMatMul()(ms.Tensor(np.ones((4, 8), np.float32))))
"""


@pytest.mark.parametrize("layout, device, numbers", [
    ({"mode": "semi", "mp": 2}, "cpu", "parallel mode semi with dp=2 mp=2 pp=1"),
    ({"mode": "semi", "pp": 2, "micro_batches": 2}, "", "parallel mode semi with dp=2 mp=1 pp=2"),
    ({"mode": "auto"}, "cpu", "parallel mode auto with dp=4 mp=1 pp=1"),
], ids=["model-parallel", "pipeline-device-detected", "auto"])
def test_a_model_parallel_script_stops_at_init_saying_it_needs_ascend(tmp_path, layout, device, numbers):
    script = tmp_path / "model parallel's script.py"
    script.write_text(MODEL_PARALLEL_SCRIPT)
    environ = _clean_environ(**{contract.RANK: "0", contract.WORLD_SIZE: "4",
                                contract.PARALLEL: json.dumps(layout), contract.DEVICE_KIND: device})
    result = subprocess.run([sys.executable, str(script)], env=environ, cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "init returned" not in result.stdout
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"parallel.mode.setup.NeedsAscendError: {numbers} needs Ascend")
    assert "this rank's device is CPU" in last_line
    assert "Invalid communication backend" not in result.stderr


INIT_REPORT = """
    import json, os
    import mindspore as ms
    from mindspore.communication import GlobalComm
    import parallel
    asked = os.environ.get("TEST_EXEC_MODE")
    info = parallel.init(exec_mode=asked) if asked else parallel.init()
    print(json.dumps({
        "rank": info.rank, "world": info.world_size, "device": info.device_target.value,
        "dp": info.config.dp, "shard": list(info.shard), "seed": ms.get_seed(),
        "policy": info.config.shard_policy.value, "execution_mode": ms.get_context("mode"),
        "parallel_mode": ms.get_auto_parallel_context("parallel_mode"),
        "inited": GlobalComm.INITED, "same_init": parallel.init is __import__("parallel.mode.setup").mode.setup.init,
        "info_exec_mode": info.exec_mode.value, "exec_mode_source": info.exec_mode_source,
    }))
"""


def test_a_lone_process_initialises_without_a_cluster_and_reports_it(tmp_path):
    events = tmp_path / "events.jsonl"
    answer = _last_json(_python(INIT_REPORT, _clean_environ(**{
        contract.EVENTS_FILE: str(events), contract.SEED: "17", contract.DEVICE_KIND: "cpu"}), tmp_path))
    assert answer == {"rank": 0, "world": 1, "device": "CPU", "dp": 1, "shard": [1, 0], "seed": 17,
                      "policy": "drop", "execution_mode": GRAPH_MODE, "info_exec_mode": "graph",
                      "exec_mode_source": "parallel.init()", "parallel_mode": "stand_alone",
                      "inited": False, "same_init": True}
    [event] = [json.loads(line) for line in events.read_text().splitlines()]
    assert {key: event[key] for key in ("event", "rank", "world_size", "device_target", "mode",
                                        "exec_mode")} == {
        "event": contract.EVENT_LAYOUT, "rank": 0, "world_size": 1, "device_target": "CPU",
        "mode": "data", "exec_mode": "graph"}


def test_a_script_can_ask_for_pynative_and_is_told_when_it_asks_for_nonsense(tmp_path):
    answer = _last_json(_python(INIT_REPORT, _clean_environ(TEST_EXEC_MODE="PyNative"), tmp_path))
    assert (answer["execution_mode"], answer["info_exec_mode"]) == (PYNATIVE_MODE, "pynative")
    assert answer["exec_mode_source"] == "parallel.init(exec_mode='pynative')"
    result = _python(INIT_REPORT, _clean_environ(TEST_EXEC_MODE="eager"), tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ValueError: parallel.init(exec_mode='eager'): expected 'graph' or 'pynative'")


def test_debug_mode_skips_communication_and_runs_pynative_even_when_graph_is_asked_for(tmp_path):
    layout = ParallelConfig(seed=42, shard_policy="pad").to_json()
    answer = _last_json(_python(INIT_REPORT, _clean_environ(TEST_EXEC_MODE="graph", **{
        contract.DEBUG: "1", contract.RANK: "1", contract.WORLD_SIZE: "2", contract.PARALLEL: layout,
        contract.MS_ROLE: contract.ROLE_WORKER}), tmp_path))
    assert answer["inited"] is False
    assert (answer["execution_mode"], answer["info_exec_mode"]) == (PYNATIVE_MODE, "pynative")
    assert answer["exec_mode_source"] == "--debug"
    assert (answer["rank"], answer["world"], answer["shard"]) == (1, 2, [2, 1])
    assert (answer["seed"], answer["policy"], answer["parallel_mode"]) == (42, "pad", "stand_alone")


def test_a_layout_that_does_not_fit_the_world_is_a_config_error_before_anything_starts(tmp_path):
    result = _python(INIT_REPORT, _clean_environ(**{
        contract.RANK: "0", contract.WORLD_SIZE: "6",
        contract.PARALLEL: json.dumps({"mode": "semi", "dp": 2, "mp": 2})}), tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "parallel.config.LayoutError: dp*mp*pp = 2*2*1 = 4 != world size 6")


def test_device_kinds_map_to_mindspore_targets_and_cpu_is_detected_here():
    from parallel.mode.setup import select_device

    assert select_device("npu") is DeviceTarget.ASCEND
    assert select_device("cpu") is DeviceTarget.CPU
    assert select_device("") is DeviceTarget.CPU  # this machine has no CANN, so no Ascend plugin
    with pytest.raises(ValueError, match="NPU_LAUNCH_DEVICE='gpu': expected npu or cpu"):
        select_device("gpu")


def test_the_parallel_config_comes_from_the_environment():
    from parallel.mode.setup import config_from_environ

    layout = ParallelConfig(mode="semi", mp=2, seed=5)
    assert config_from_environ({contract.PARALLEL: layout.to_json()}) == layout
    assert config_from_environ({contract.SEED: "9"}) == ParallelConfig(seed=9)
    assert config_from_environ({}) == ParallelConfig()
