"""What preflight's card checks cost per host (issue 25): ``npu-launch preflight`` from the first
of N real test hosts, with and without the checks, side by side.

    sudo python bench/bench_card_checks.py [--hosts 4 8 12] [--runs 5] [--cards 2]

Each host (``tests/multinode/cluster.py``) gets ``--cards`` fake cards and the fake driver tools
(``tests/multinode/ascend.py``: ``npu-smi``/``hccn_tool`` printing recorded real output, POSIX
sh). Per size, in turn (so drift hits both alike): ``preflight --device cpu`` (no card checks)
and ``preflight --device npu`` (the checks on every host, in parallel), medians over ``--runs``
of the command's wall time; and, from the ``npu`` runs, the median of what each host's probe
reported its checks took (the table's ``card checks`` column). Prints a table.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_nodes import load_cluster

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cards", type=int, default=2)
    args = parser.parse_args()
    module = load_cluster()
    sys.path.insert(0, str(HERE.parent / "tests"))
    from multinode.ascend import give_cards, node0_env  # noqa: E402 (needs tests/ on sys.path)
    rows = []
    with module.Cluster(max(args.hosts), tag=module.unique_tag("cc")) as cluster:
        cluster.start_ssh(timeout=120)
        for host in cluster.names:
            give_cards(cluster, host, range(args.cards))
        work = Path(tempfile.mkdtemp(prefix="bench-cards-"))
        cluster.put(work)
        for n in args.hosts:
            hostfile = work / f"hosts{n}"
            hostfile.write_text("".join(f"{h} slots={args.cards}\n" for h in cluster.names[:n]))
            cluster.put(work)
            times: dict[str, list[float]] = {"cpu": [], "npu": []}
            checks: list[float] = []
            for _ in range(args.runs):
                for device in ("cpu", "npu"):
                    seconds, own = _preflight(cluster, work, hostfile, device, node0_env(cluster))
                    times[device].append(seconds)
                    checks += own
            rows.append((n, statistics.median(times["cpu"]), statistics.median(times["npu"]),
                         statistics.median(checks)))
    print("hosts  preflight without (s)  with card checks (s)  added per host (s)  "
          "checks on a host (s)")
    for n, cpu, npu, own in rows:
        print(f"{n:5d}  {cpu:21.3f}  {npu:20.3f}  {(npu - cpu) / n:18.4f}  {own:20.3f}")


def _preflight(cluster, work: Path, hostfile: Path, device: str,
               env: dict) -> tuple[float, list[float]]:
    argv = [sys.executable, "-m", "launcher.cli", "preflight", "--hostfile", str(hostfile),
            "--ssh-option", f"-F {cluster.ssh_config_path}", "--device", device]
    started = time.monotonic()
    done = cluster.run_on(cluster.names[0], argv, cwd=work, env=env)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"preflight --device {device} failed: {done.stdout}{done.stderr}")
    return seconds, _check_seconds(done.stdout)


def _check_seconds(stdout: str) -> list[float]:
    """The checks' own time on each host, from the table's ``card checks`` column."""
    return [float(m.group(1)) for m in re.finditer(r"ok \(\d+, ([\d.]+) s\)", stdout)]


if __name__ == "__main__":
    main()
