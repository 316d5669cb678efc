"""The one-line notes of ``launcher.config.frameworks``, in-process: a torch job given options
that only MindSpore ranks apply, and a MindSpore rank found running without the rank hook."""
from __future__ import annotations

import io

from launcher.config.frameworks import FrameworkNote, mindspore_only
from launcher.config.launch_config import LaunchConfig
from launcher.run import hookless
from parallel import contract
from parallel.config import ParallelConfig
from parallel.contract import Event


def _config(**fields) -> LaunchConfig:
    return LaunchConfig(script=__file__, **fields)


def _framework(rank: int, name: str) -> Event:
    event = Event.parse({"event": contract.EVENT_FRAMEWORK, "rank": rank, "name": name})
    assert event is not None
    return event


def test_only_options_given_are_named() -> None:
    assert mindspore_only(_config()) == ()
    config = _config(parallel=ParallelConfig(seed=3, global_batch=64), runtime_logs=True)
    assert mindspore_only(config) == ("--global-batch", "--seed", "--runtime-logs")


def test_the_note_is_said_once_for_the_first_torch_rank() -> None:
    err = io.StringIO()
    note = FrameworkNote(("--seed",), err)
    note.see(_framework(1, "mindspore"))
    assert err.getvalue() == "", "MindSpore ranks apply --seed"
    note.see(_framework(1, "torch"))
    note.see(_framework(0, "torch"))
    assert err.getvalue().splitlines() == [
        "npu-launch: note: rank 1 uses torch: --seed only change(s) MindSpore ranks (the "
        "parallel package, MindSpore's rank-table start, its logs)"]


def test_nothing_is_said_without_such_options() -> None:
    err = io.StringIO()
    FrameworkNote((), err).see(_framework(0, "torch"))
    assert err.getvalue() == ""


def test_a_rank_found_without_the_hook_is_told_once_and_its_python_shown_safely() -> None:
    err = io.StringIO()
    note = FrameworkNote((), err)
    odd = "/opt/\x1b[2Jenv/" + "x" * 300 + "/python"
    for rank in (1, 0):
        note.see(hookless.said_for(rank, "h", odd, 1.0))
    note.see(_framework(0, "mindspore"))  # the hook's own event: nothing to say
    (line,) = err.getvalue().splitlines()
    assert line.startswith("npu-launch: note: rank 1 runs MindSpore without npu-launch's rank hook")
    assert "\x1b" not in line and "x" * 100 not in line, "the path is cut and escaped"
