"""The launcher's own cost from 4 to 64 hosts: start-up, failure teardown, clean exit, CPU.

    sudo python bench/bench_scale.py [--hosts 4 8 16 32 64] [--runs 3] [--fanout K ...]
                                     [--before DIR ...] [--out DIR] [--replot]

Makes the largest number of real hosts once (``tests/multinode/cluster.py``: network namespaces,
each with its own sshd, private ``/tmp`` and PID namespace) and runs each size on the first N of
them, one rank per host (``slots=1 --cards 1 --device cpu``), launched from the first host (node 0
is one of the job's hosts, as for users). The ranks run ``bench/scale_rank.py``, which never
imports MindSpore, so what is measured is npu-launch: preflight, ssh, the node agents, teardown.
(MindSpore's scheduler still starts on node 0, as in every dynamic-cluster job, and imports
MindSpore there: "scheduler CPU".) Every host shares this machine's cores: what each host does
for itself (its sshd, its probe, agent and rank starting Python) adds up here, where real hosts
would do it side by side.

Per size (and way of launching), medians over ``--runs`` of a clean run and a failing one:

* **start**: launch -> every rank started: the latest ``start`` mark (``time.time()`` as the
  rank script's first line), each read back from its own host's private ``/tmp``, less the
  time just before the launcher was started. Hosts share one kernel, so one clock.
* **teardown**: a rank's failure -> every process of the job on every host gone. The last rank
  writes ``raise`` with its time just before it raises (told to once every rank has started:
  node 0's ``metrics.jsonl`` counts the ``started`` events). Every host's process table is then
  scanned every 10 ms, from the root namespace by each host's PID namespace (asking each host
  with ``Cluster.pids_in`` takes about 50 ms per host, too coarse for 64 of them), leaving out
  the hosts' init and sshd listeners and, on node 0, the launcher itself; the time is that of
  the scan that first finds all of them empty. Once the launcher has exited, ``pids_in`` on
  every host confirms that nothing is left (``left`` in the JSON).
* **fail exit**: the same raise -> the launcher's exit.
* **finish**: clean finish -> launcher exit: the latest ``end`` mark (each rank holds 2 s after
  its start) -> the launcher's exit.
* **launcher CPU**: user + system CPU seconds of the launcher's process tree on node 0
  (``/usr/bin/time``: the launcher with its ssh clients and preflight's), and its peak RSS.
* **hosts' CPU**: what every host's sshd and init reaped: its ssh sessions with the probe, the
  agent, the rank and (node 0) the scheduler. **other CPU**: what the machine spent besides the
  job and the launcher (other work, and this benchmark's polling): large values mean the figures
  of that run are not the launcher's alone.
* In the failing runs, once every rank has started: the launcher's threads, open file
  descriptors, its ssh clients and the PSS of the launcher plus its ssh clients; the
  scheduler's CPU so far; when the first and the last agent's ssh client began (after the
  launch: the first marks the end of preflight, the spread is how the agents' start went).

Before the runs, one ssh connection from node 0 to the second host is measured on its own
(``connection_costs``). Writes the table to stdout, the raw figures to ``OUT/scale.json`` and
the curves to ``OUT/scale.png`` (``--replot`` draws them again from the JSON). Several
``--fanout`` values, and ``--before DIR ...`` (the launcher of other trees: ``git archive`` of an
older commit), are launched in turn, round by round, so that the machine's drift hits all alike.
Each is launched from a job directory of its own that holds a copy of its tree's packages (for
the default, this repository's, taken when the benchmark starts), first on every sys.path: what
is edited or installed while it runs does not change what it measures.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import psutil
from bench_nodes import load_cluster

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "scale_rank.py"
TIME_FORMAT = "%e %U %S %M"
SCAN_INTERVAL = 0.01


@dataclasses.dataclass
class Run:
    """One launch's figures (seconds unless named otherwise)."""

    hosts: int
    mode: str
    variant: str
    wall: float
    cpu: float
    max_rss_kib: int
    start: Optional[float] = None
    finish: Optional[float] = None
    teardown: Optional[float] = None
    fail_exit: Optional[float] = None
    threads: Optional[int] = None
    fds: Optional[int] = None
    ssh_clients: Optional[int] = None
    pss_mib: Optional[float] = None
    scheduler_cpu: Optional[float] = None
    agents_first: Optional[float] = None
    """Seconds from the launch to the first agent's ssh client (preflight is over)."""
    agents_last: Optional[float] = None
    hosts_cpu: float = 0.0
    machine_cpu: float = 0.0
    left: dict = dataclasses.field(default_factory=dict)

    @property
    def other_cpu(self) -> float:
        """CPU seconds the machine spent on neither the job's hosts nor the launcher."""
        return self.machine_cpu - self.hosts_cpu - self.cpu


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of launching, run in turn with the others: its label, the directory it is
    launched from (a ``--before`` tree's packages are in it: first on every sys.path), and
    its ``--fanout`` (None: the launcher's default)."""

    label: str
    directory: Path
    fanout: Optional[int] = None


class Bench:
    """The cluster, the job directory put on every host once, and one launch at a time."""

    def __init__(self, cluster: Any, work: Path, fail_hold: float) -> None:
        self.cluster = cluster
        self.work = work
        self.fail_hold = fail_hold
        self._count = 0

    def launch(self, n: int, mode: str, variant: Variant) -> Run:
        self._count += 1
        run_id = f"{mode}{n}-{self._count}"
        marks, logs = self.work / "marks" / run_id, self.work / "logs" / run_id
        hosts = self.cluster.names[:n]
        timing = self.work / f"time-{run_id}"
        argv = ["/usr/bin/time", "-f", TIME_FORMAT, "-o", str(timing), sys.executable, "-m",
                "launcher.cli", "--hostfile", str(self.work / f"hosts{n}"), "--cards", "1",
                "--device", "cpu", "--console", "none", "--log-dir", str(logs),
                "--ssh-option", f"-F {self.cluster.ssh_config_path}",
                "--env", f"BENCH_OUT={marks}", "--env", f"BENCH_MODE={mode}",
                "--env", f"BENCH_FAIL_RANK={n - 1}",
                # the rank hook loads before the script's directory is on sys.path
                "--env", f"PYTHONPATH={variant.directory}"]
        argv += ["--fanout", str(variant.fanout)] if variant.fanout is not None else []
        argv.append(RANK_SCRIPT.name)
        self._output = self.work / f"launcher-{run_id}.out"
        out = open(self._output, "wb")
        hosts_before, machine_before = self._hosts_cpu(hosts), _machine_cpu()
        t0 = time.time()
        proc = self.cluster.popen_on(hosts[0], argv, cwd=variant.directory, stdout=out,
                                     stderr=subprocess.STDOUT)
        try:
            run = self._watch(proc, n, mode, variant.label, marks, logs, t0)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            out.close()
        wall, user, system, rss = self.cluster.read_text(hosts[0], timing).split()[-4:]
        run.wall, run.cpu, run.max_rss_kib = float(wall), float(user) + float(system), int(rss)
        run.left = {h: pids for h in hosts if (pids := self.cluster.pids_in(h))}
        run.hosts_cpu = self._hosts_cpu(hosts) - hosts_before
        run.machine_cpu = _machine_cpu() - machine_before
        return run

    def _check_exit(self, proc: Any, expected: int) -> None:
        if proc.returncode != expected:
            text = self._output.read_text(errors="replace")
            raise SystemExit(f"the launcher exited {proc.returncode}:\n{text[-3000:]}")

    def _watch(self, proc: Any, n: int, mode: str, variant: str, marks: Path,
               logs: Path, t0: float) -> Run:
        hosts = self.cluster.names[:n]
        run = Run(n, mode, variant, 0.0, 0.0, 0)
        if mode == "ok":
            proc.wait(timeout=600)
            ended = time.time()
            self._check_exit(proc, 0)
            stamps = self._marks(hosts, marks)
            run.start = max(s["start"] for s in stamps) - t0
            run.finish = ended - max(s["end"] for s in stamps)
            return run
        self._wait_started(hosts[0], logs, n, proc)
        if proc.poll() is not None:
            self._check_exit(proc, -1)  # it ended before every rank started: say why
        time.sleep(self.fail_hold)
        self._sample_launcher(proc, run, t0)
        run.scheduler_cpu = self._scheduler_cpu(hosts[0])
        tables = HostTables(self.cluster, hosts, self._launcher_pids(proc))
        if not all(tables.counts().values()):
            raise SystemExit(f"some host runs nothing of the job: {tables.counts()}")
        self.cluster.run_on(hosts[-1], ["touch", str(marks / "go")], check=True)
        gone = tables.wait_empty(timeout=120)
        proc.wait(timeout=120)
        ended = time.time()
        self._check_exit(proc, 1)
        raised = self._marks(hosts, marks)[-1]["raise"]
        run.start = max(s["start"] for s in self._marks(hosts, marks)) - t0
        run.teardown, run.fail_exit = gone - raised, ended - raised
        return run

    def _marks(self, hosts: list[str], marks: Path) -> list[dict[str, float]]:
        found = []
        for rank, host in enumerate(hosts):
            text = self.cluster.read_text(host, marks / f"rank_{rank}.txt") or ""
            found.append({w: float(t) for w, t in (line.split() for line in text.splitlines())})
        return found

    def _wait_started(self, node0: str, logs: Path, n: int, proc: Any) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            text = self.cluster.read_text(node0, logs / "metrics.jsonl") or ""
            started = {json.loads(line).get("rank") for line in text.splitlines()
                       if '"started"' in line and line.endswith("}")}
            if len(started) >= n:
                return
            time.sleep(0.25)
        raise SystemExit("ranks did not all start within 600 s")

    def _scheduler_cpu(self, node0: str) -> Optional[float]:
        """CPU seconds MindSpore's scheduler on node 0 has used so far (it imports MindSpore,
        then waits for workers that never come: these ranks never call ``init()``)."""
        init = next(d.pid for d in self.cluster.daemons if d.role == "init" and d.host == node0)
        ns = _pid_ns(init)
        for proc in psutil.process_iter(["cmdline"]):
            if "parallel.mode.scheduler" in (proc.info["cmdline"] or []) and _pid_ns(proc.pid) == ns:
                times = proc.cpu_times()
                return times.user + times.system
        return None

    def _hosts_cpu(self, hosts: list[str]) -> float:
        """CPU seconds of everything the hosts' sshd and init have reaped: every ssh session
        (preflight's probes, the agents, their ranks and scheduler), not the launcher."""
        return sum(_cpu_reaped(d.pid) for d in self.cluster.daemons
                   if d.host in hosts and d.role in ("sshd", "init"))

    @staticmethod
    def _launcher_pids(proc: Any) -> set[int]:
        """``/usr/bin/time`` and the launcher (root-namespace pids): the rest is the job."""
        wrapper = psutil.Process(proc.pid).children()[0]
        return {wrapper.pid} | {c.pid for c in wrapper.children()}

    @staticmethod
    def _sample_launcher(proc: Any, run: Run, t0: float) -> None:
        """The launcher's resources, and when its agents' ssh clients (all alive now) began."""
        wrapper = psutil.Process(proc.pid).children()[0]
        launcher = wrapper.children()[0]
        ssh = [c for c in launcher.children() if c.name() == "ssh"]
        run.threads, run.fds, run.ssh_clients = launcher.num_threads(), launcher.num_fds(), len(ssh)
        run.pss_mib = sum(p.memory_full_info().pss for p in [launcher, *ssh]) / 2 ** 20
        began = [c.create_time() - t0 for c in ssh if "launcher.cluster.agent" in " ".join(c.cmdline())]
        run.agents_first, run.agents_last = min(began), max(began)


class HostTables:
    """Every host's process table as the root namespace sees it, by the host's PID namespace."""

    def __init__(self, cluster: Any, hosts: list[str], also_ignored: set[int]) -> None:
        inits = {d.host: d.pid for d in cluster.daemons if d.role == "init" and d.host in hosts}
        self._ns = {_pid_ns(pid): host for host, pid in inits.items()}
        self._ignored = {d.pid for d in cluster.daemons} | also_ignored
        self._hosts = hosts

    def counts(self) -> dict[str, int]:
        """The job's processes on each host: all but its init, its sshd listener, the launcher."""
        counts = dict.fromkeys(self._hosts, 0)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in self._ignored:
                continue
            host = self._ns.get(_pid_ns(int(entry.name)))
            if host is not None:
                counts[host] += 1
        return counts

    def wait_empty(self, timeout: float) -> float:
        """The time of the first scan that finds no host running anything of the job."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = time.time()
            if not any(self.counts().values()):
                return now
            time.sleep(SCAN_INTERVAL)
        raise SystemExit(f"job processes left after {timeout:.0f} s: {self.counts()}")


def _job_directory(path: Path, tree: Path) -> Path:
    """``path`` holding the rank script and a copy of ``tree``'s packages: launched from there
    (on every host: it is copied to each), every process of the job imports that copy first
    (``python -m`` and a script both put their directory first on ``sys.path``). The tree under
    test is fixed when the benchmark starts, whatever is edited or installed meanwhile."""
    path.mkdir(parents=True)
    shutil.copy(RANK_SCRIPT, path / RANK_SCRIPT.name)
    for package in ("launcher", "parallel", "rank_tables"):
        shutil.copytree(tree / package, path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return path


def connection_costs(cluster: Any, repeats: int = 10) -> dict[str, float]:
    """One ssh connection from node 0 to the second host, medians of ``repeats``: wall
    seconds, the client's CPU (node 0) and the server's (the host's sshd and session), with
    OpenSSH's default key exchange and with curve25519-sha256; and the client's CPU per MiB
    it sends (64 MiB to ``cat``)."""
    node0, other = cluster.names[0], cluster.names[1]
    sshd = next(d.pid for d in cluster.daemons if d.role == "sshd" and d.host == other)
    ssh = ["ssh", "-F", str(cluster.ssh_config_path)]

    def cost(argv: list[str], data: Optional[bytes] = None) -> tuple[float, float, float]:
        before, server = resource.getrusage(resource.RUSAGE_CHILDREN), _cpu_reaped(sshd)
        start = time.monotonic()
        cluster.run_on(node0, argv, input=data, text=False, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return time.monotonic() - start, client, _cpu_reaped(sshd) - server

    def medians(argv: list[str]) -> list[float]:
        runs = [cost(argv) for _ in range(repeats)]
        return [statistics.median(r[i] for r in runs) for i in range(3)]

    nothing = medians(["true"])  # nsenter's own share, taken off the client's
    found: dict[str, float] = {}
    for name, extra in (("default", []), ("curve25519", ["-o", "KexAlgorithms=curve25519-sha256"])):
        wall, client, server = medians(ssh + extra + [other, "true"])
        found.update({f"{name}_wall_s": wall, f"{name}_client_cpu_s": client - nothing[1],
                      f"{name}_server_cpu_s": server})
    _, client, _ = cost(ssh + [other, "cat > /dev/null"], bytes(64 << 20))
    found["client_cpu_s_per_mib"] = (client - found["default_client_cpu_s"]) / 64
    return found


def _cpu_reaped(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.children_user + times.children_system


def _machine_cpu() -> float:
    """CPU seconds this machine has been busy since it booted (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _pid_ns(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:  # gone, or a zombie
        return None


def record(run: Run) -> dict[str, Any]:
    return {**dataclasses.asdict(run), "other_cpu": round(run.other_cpu, 2)}


def median(runs: list[Run], field: str) -> Optional[float]:
    values = [v for r in runs if (v := getattr(r, field)) is not None]
    return statistics.median(values) if values else None


COLUMNS = (  # heading, mode of the runs, field, scale, decimals
    ("start s", "ok", "start", 1, 2), ("teardown s", "fail", "teardown", 1, 2),
    ("fail exit s", "fail", "fail_exit", 1, 2), ("finish s", "ok", "finish", 1, 2),
    ("launcher CPU s", "ok", "cpu", 1, 2), ("peak RSS MiB", "ok", "max_rss_kib", 1 / 1024, 0),
    ("threads", "fail", "threads", 1, 0), ("fds", "fail", "fds", 1, 0),
    ("PSS MiB", "fail", "pss_mib", 1, 0), ("hosts' CPU s", "ok", "hosts_cpu", 1, 1),
    ("scheduler CPU s", "fail", "scheduler_cpu", 1, 1),
    ("first agent s", "fail", "agents_first", 1, 1), ("last agent s", "fail", "agents_last", 1, 1),
    ("other CPU s", "ok", "other_cpu", 1, 1),
)


def table(runs: list[Run]) -> str:
    """Medians per (hosts, variant), one markdown row each."""
    lines = ["| hosts | launch | " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|" + " --- |" * (len(COLUMNS) + 2)]
    for n, variant in sorted({(r.hosts, r.variant) for r in runs}):
        mine = [r for r in runs if (r.hosts, r.variant) == (n, variant)]
        cells = []
        for _, mode, field, scale, decimals in COLUMNS:
            value = median([r for r in mine if r.mode == mode], field)
            cells.append("-" if value is None else f"{value * scale:.{decimals}f}")
        lines.append(f"| {n} | {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    """Three panels against the host count: the times, the CPU, node 0's resources."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    fig, (times, cpu, node0) = plt.subplots(1, 3, figsize=(15, 4.4))
    variants = list(dict.fromkeys(r.variant for r in runs))
    for variant in variants:
        mine = [r for r in runs if r.variant == variant]
        sizes = sorted({r.hosts for r in mine})
        label = f" ({variant})" if len(variants) > 1 else ""

        def curve(mode: str, field: str, mine: list = mine, sizes: list = sizes
                  ) -> list[Optional[float]]:
            return [median([r for r in mine if r.hosts == n and r.mode == mode], field)
                    for n in sizes]
        times.plot(sizes, curve("ok", "start"), "o-", label=f"launch -> all ranks started{label}")
        times.plot(sizes, curve("fail", "teardown"), "s-",
                   label=f"failure -> every process gone{label}")
        times.plot(sizes, curve("ok", "finish"), "^-", label=f"clean finish -> exit{label}")
        cores = os.cpu_count() or 1
        floor = [None if a is None or b is None else (a + b) / cores
                 for a, b in zip(curve("ok", "cpu"), curve("ok", "hosts_cpu"))]
        times.plot(sizes, floor, "k--", lw=1,
                   label=f"(launcher + hosts' CPU) / {cores} cores{label}")
        cpu.plot(sizes, curve("ok", "cpu"), "o-", label=f"launcher + its ssh clients{label}")
        cpu.plot(sizes, curve("ok", "hosts_cpu"), "s-", label=f"inside the hosts{label}")
        node0.plot(sizes, curve("fail", "pss_mib"), "o-", label=f"PSS MiB{label}")
        node0.plot(sizes, curve("fail", "fds"), "s-", label=f"open files{label}")
        node0.plot(sizes, curve("fail", "threads"), "^-", label=f"threads{label}")
    times.axhline(10, color="grey", ls=":", lw=1)
    times.axhline(2, color="grey", ls=":", lw=1)
    titles = ("seconds (medians; targets at 64 hosts dotted)", "CPU seconds (medians)",
              "the launcher on node 0, every rank running")
    sizes = sorted({r.hosts for r in runs})
    for ax, title in zip((times, cpu, node0), titles):
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("hosts (one rank each)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fanout", type=int, nargs="+", default=[None],
                        help="--fanout values to launch with, in turn (default: the launcher's "
                        "default)")
    parser.add_argument("--fail-hold", type=float, default=1.0,
                        help="seconds between every rank started and the failure")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--before", type=Path, nargs="+", default=[], metavar="DIR",
                        help="also launch, in turn with the others, the launcher of each DIR "
                        "(its launcher/, parallel/, rank_tables/, e.g. `git archive` of an older "
                        "commit), named by the folder's name")
    parser.add_argument("--replot", action="store_true",
                        help="only draw the PNG and print the table again from OUT/scale.json")
    args = parser.parse_args()
    if args.replot:
        replot(args.out)
        return
    runs, costs = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    raw = {"command": " ".join(sys.argv), "connection": costs, "runs": [record(r) for r in runs]}
    (args.out / "scale.json").write_text(json.dumps(raw, indent=1) + "\n")
    plot(runs, args.out / "scale.png")
    print(table(runs))


def replot(out: Path) -> None:
    raw = json.loads((out / "scale.json").read_text())
    names = {f.name for f in dataclasses.fields(Run)}
    runs = [Run(**{k: v for k, v in r.items() if k in names}) for r in raw["runs"]]
    plot(runs, out / "scale.png")
    print(table(runs))


def measure(args: argparse.Namespace) -> tuple[list[Run], dict[str, float]]:
    """Every run the options ask for, on one cluster made for the largest size."""
    cluster_module = load_cluster()
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))  # in /tmp: copied onto every host
    tree = _job_directory(work / "tree", HERE.parent)
    variants = [Variant("default" if k is None else f"fanout {k}", tree, k) for k in args.fanout]
    for i, tree in enumerate(args.before):
        directory = _job_directory(work / f"before{i}", tree)
        variants.insert(i, Variant(tree.resolve().name, directory))
    runs: list[Run] = []
    made = time.monotonic()
    with cluster_module.Cluster(max(args.hosts), tag=cluster_module.unique_tag("sc")) as cluster:
        cluster.start_ssh(timeout=120)
        for n in args.hosts:
            (work / f"hosts{n}").write_text("".join(f"{h} slots=1\n" for h in cluster.names[:n]))
        cluster.put(work)
        print(f"{cluster.n} hosts ready in {time.monotonic() - made:.0f} s", flush=True)
        costs = connection_costs(cluster)
        print(json.dumps({"one ssh connection": costs}), flush=True)
        bench = Bench(cluster, work, args.fail_hold)
        for n in args.hosts:
            for _ in range(args.runs):
                for variant in variants:  # in turn: a drift of the machine hits all alike
                    for mode in ("ok", "fail"):
                        run = bench.launch(n, mode, variant)
                        runs.append(run)
                        print(json.dumps(record(run)), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return runs, costs


if __name__ == "__main__":
    main()
