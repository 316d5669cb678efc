"""One rank of ``bench/bench_scale.py``: no MindSpore, so what is measured is the launcher.

Appends ``WORD TIME`` lines (``time.time()``) to ``$BENCH_OUT/rank_<RANK_ID>.txt`` on its own
host: ``start`` first thing. ``BENCH_MODE=ok``: holds ``BENCH_HOLD`` seconds, writes ``end`` and
exits 0. ``BENCH_MODE=fail``: rank ``BENCH_FAIL_RANK`` waits for ``$BENCH_OUT/go`` (the benchmark
writes it on this host once every rank has started), writes ``raise`` and raises; every other
rank sleeps until it is stopped.
"""
import os
import time

START = time.time()
RANK = int(os.environ["RANK_ID"])
OUT = os.environ["BENCH_OUT"]


def mark(word: str, when: float) -> None:
    with open(os.path.join(OUT, f"rank_{RANK}.txt"), "a") as f:
        f.write(f"{word} {when:.6f}\n")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    mark("start", START)
    if os.environ.get("BENCH_MODE", "ok") == "ok":
        time.sleep(float(os.environ.get("BENCH_HOLD", "2")))
        mark("end", time.time())
        return
    if RANK != int(os.environ["BENCH_FAIL_RANK"]):
        time.sleep(3600)
        return
    go = os.path.join(OUT, "go")
    while not os.path.exists(go):
        time.sleep(0.01)
    mark("raise", time.time())
    raise RuntimeError(f"bench_scale: rank {RANK} fails on purpose")


if __name__ == "__main__":
    main()
