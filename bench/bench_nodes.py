"""Start-up cost per extra node: command to all ranks initialised, 1, 2 and 3 nodes over ssh.

    sudo python bench/bench_nodes.py [--runs 3] [--nodes 1 2 3]

Makes real hosts (network namespaces with their own sshd, disks and process tables,
tests/multinode/cluster.py), writes a hostfile of N of them with one card each, and runs
bench/tiny_job.py through npu-launch from the first of them; also a plain one-node local launch
of one rank for reference. Every host shares this machine's 2 cores,
so the figures include N MindSpore imports competing for them.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "tiny_job.py"


def load_cluster():
    path = HERE.parent / "tests" / "multinode" / "cluster.py"
    spec = importlib.util.spec_from_file_location("npl_cluster", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["npl_cluster"] = module
    spec.loader.exec_module(module)
    return module


def run(argv: list[str], env: dict, cluster=None, n: int = 1) -> tuple[float, float]:
    """(seconds to all ranks initialised, whole run) for one launch: here, or from the first of
    ``cluster``'s hosts, which have private disks (the work directory is copied to each, as a
    user's rsync would, and each rank's marks are read back from its own host)."""
    work = Path(tempfile.mkdtemp(prefix="bench-nodes-"))
    marks = work / "marks"
    marks.mkdir()
    hosts = cluster.names[:n] if cluster else []
    if cluster:
        (work / "hosts").write_text("".join(f"{h} slots=1\n" for h in hosts))
        cluster.put(work, hosts)
        argv = cluster.enter_argv(hosts[0], work) + argv + ["--hostfile", str(work / "hosts")]
    start = time.time()
    # --env: other hosts get only what is forwarded (see README, Hostfile).
    subprocess.run(argv + ["--log-dir", str(work / "logs"), "--env", f"BENCH_OUT={marks}",
                           "--env", "BENCH_MODE=ok", str(JOB)], cwd=work, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600)
    end = time.time()
    texts = [cluster.read_text(h, marks / f"rank_{r}.txt") for r, h in enumerate(hosts)] if cluster \
        else [f.read_text() for f in marks.glob("rank_*.txt")]
    inits = [float(line.split()[1]) for text in texts for line in (text or "").splitlines()
             if line.startswith("init")]
    shutil.rmtree(work, ignore_errors=True)
    return max(inits) - start, end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    cluster_module = load_cluster()
    base = [sys.executable, "-m", "launcher.cli", "--device", "cpu", "--console", "none"]
    local = [run(base + ["--cards", "1"], dict(os.environ)) for _ in range(args.runs)]
    print(f"{'launch':<22} {'to-init s':>10} {'whole s':>9}")
    print(f"{'local, 1 rank':<22} {statistics.median(t for t, _ in local):>10.2f} "
          f"{statistics.median(w for _, w in local):>9.2f}", flush=True)
    with cluster_module.Cluster(max(args.nodes), tag=cluster_module.unique_tag("b")) as cluster:
        cluster.start_ssh()
        for n in args.nodes:
            argv = base + ["--ssh-option", f"-F {cluster.ssh_config_path}"]
            times = [run(argv, cluster.env, cluster, n) for _ in range(args.runs)]
            print(f"{f'ssh, {n} node(s) x 1':<22} {statistics.median(t for t, _ in times):>10.2f} "
                  f"{statistics.median(w for _, w in times):>9.2f}", flush=True)


if __name__ == "__main__":
    main()
