"""Run a rank script (the rest of argv) so that its hang leaves a mark: bench_torch.py's helper.

    python bench/torch_hang_mark.py tests/rank_scripts/torch_ddp.py --hang-rank 1 --hang-at 5

Writes ``pid_<RANK>`` (this process's pid) into $BENCH_HANG_MARK at start, and ``hang_<RANK>``
(the unix time) just before any sleep of 10 minutes or more, which is how the DDP script hangs
(``hang_here``). The script itself runs unchanged, as ``__main__``, so torch, the rank hook and
the stacks see it as they would without this wrapper (plus this file's two frames).
"""
import os
import runpy
import sys
import time

_REAL_SLEEP = time.sleep


def _mark(name: str, text: str) -> None:
    path = os.path.join(os.environ["BENCH_HANG_MARK"], f"{name}_{os.environ.get('RANK', 'x')}")
    with open(path, "w") as f:
        f.write(f"{text}\n")


def _marked_sleep(seconds: float) -> None:
    if seconds >= 600:
        _mark("hang", repr(time.time()))
    _REAL_SLEEP(seconds)


def main() -> None:
    _mark("pid", str(os.getpid()))
    time.sleep = _marked_sleep  # type: ignore[assignment]
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
