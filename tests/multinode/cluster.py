"""Real multi-node test hosts on one machine, each with its own network, hostname, files and
processes, running sshd and slurmd.

How a launcher developer uses it (as root)::

    from tests.multinode.cluster import Cluster      # in tests: use the fixtures in conftest.py

    with Cluster(2, tag="t1") as c:                  # hosts npl-t1-1, npl-t1-2
        c.start_ssh()                                # sshd on <address>:22 in every host
        c.run_on("npl-t1-1", ["hostname"])           # -> CompletedProcess, stdout "npl-t1-1\\n"
        c.put(job_dir)                               # copy a directory to every host
        p = c.popen_on("npl-t1-1", ["npu-launch", ...], cwd=job_dir)   # node 0 is a host too
        c.start_slurm()                              # munged + slurmctld (root ns) + slurmd per host
        c.run_on("npl-t1-1", ["srun", "-N2", "hostname"])   # c.env carries SLURM_CONF
        assert c.pids_in("npl-t1-1") == []           # nothing but the host's own daemons left

What a host is, and where each part lives:

* its network (``netns.py``): a network namespace with its own address on a bridge, its name
  resolving through ``/etc/hosts`` lines;
* its hostname, filesystem and process table (``hostns.py``): a long-lived init that is PID 1
  of the host's own PID namespace and holds its UTS, IPC and mount namespaces, where ``/tmp``,
  ``/var/tmp`` and ``/dev/shm`` are private tmpfs. Everything started in a host enters all of
  them; ssh sessions and Slurm tasks inherit them. The Python, installed packages, repository
  and ``/etc`` stay shared, as on hosts built from one image;
* its files (``hostfiles.py``): a job's directory is copied onto each host (``put``), what the
  job left is read back from a host (``fetch``, ``read_text``, ``exists``);
* what it runs (``host_probe.py``, run inside the host by ``probe``): ``processes``,
  ``pids_in`` and ``all_pids_in`` list the host's own process table under the host's pids;
* its services: ``sshd.py`` (one sshd per host and the client config), ``slurm.py`` (munged and
  slurmctld in the root namespace, one slurmd per host);
* taking it down (``cleanup.py``): ``teardown()`` (also ``__exit__``) is idempotent and works
  after a partial setup; a cluster of a killed run is cleaned by the next ``setup()``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence


def _load_own_package() -> str:
    """This folder as a package of a private name, for when this file was loaded by its path
    (``scripts/test-hosts``, ``bench/bench_nodes.py``) rather than as ``multinode.cluster``."""
    name = "npl_multinode"
    if name not in sys.modules:
        here = Path(__file__).resolve().parent
        if str(here.parent) not in sys.path:  # the tests' own stdlib modules (polling.py)
            sys.path.append(str(here.parent))
        spec = importlib.util.spec_from_file_location(name, here / "__init__.py",
                                                      submodule_search_locations=[str(here)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
    return name


if not __package__:  # the relative imports below need a package to be relative to
    __package__ = _load_own_package()

from . import cleanup, hostfiles, hostns, netns, slurm, sshd  # noqa: E402
from .cleanup import Daemon, clean_stale, recorded_daemons, unique_tag  # noqa: E402
from .common import (  # noqa: E402
    SLURM_BINARIES,
    SSH_BINARIES,
    STATE_ROOT,
    TAG_RE,
    ClusterError,
    ClusterUnavailable,
    locked,
    missing_binaries,
    sbin_path,
    tail,
)
from .hostns import HostInit, HostPopen  # noqa: E402
from .netns import HOSTS_FILE, NETNS_DIR, Host  # noqa: E402

__all__ = ["Cluster", "ClusterError", "ClusterUnavailable", "Daemon", "HOSTS_FILE", "Host",
           "HostPopen", "NETNS_DIR", "SLURM_BINARIES", "SSH_BINARIES",
           "STATE_ROOT", "clean_stale", "recorded_daemons", "unavailable_reason", "unique_tag"]

_PROBE = str(Path(__file__).with_name("host_probe.py"))


def unavailable_reason(binaries: Sequence[str] = SSH_BINARIES) -> Optional[str]:
    """Why this machine cannot host fake clusters, or None if it can. Creates and deletes one
    netns, and one throw-away set of UTS, IPC, mount and PID namespaces."""
    if os.geteuid() != 0:
        return "fake hosts need root (network, mount and PID namespaces, sshd, slurmd)"
    missing = missing_binaries(binaries)
    if missing:
        return f"missing binaries: {' '.join(missing)} (run .ci/install-system-deps)"
    probe = f"npl-probe{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return _forbidden("network namespaces", f"ip netns add {probe}", res.stderr)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    argv = ["unshare", "--uts", "--ipc", "--mount", "--pid", "--fork", "--mount-proc", "true"]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        return _forbidden("mount and PID namespaces", " ".join(argv), res.stderr)
    return None


def _forbidden(what: str, command: str, stderr: str) -> str:
    """The skip reason when the machine refuses ``what``; ``ClusterError`` for other failures."""
    if re.search(r"permission denied|operation not permitted", stderr, re.I):
        return f"this machine forbids {what}: {stderr.strip()}"
    raise ClusterError(f"{command} failed: {stderr.strip()}")


class Cluster:
    """N fake hosts; ``setup()`` builds them, ``start_ssh()``/``start_slurm()`` the services."""

    def __init__(self, n: int, tag: str, *, slurm_cpus: int = 2) -> None:
        if not TAG_RE.match(tag):
            raise ClusterError(f"tag must match {TAG_RE.pattern}: {tag!r}")
        if not 1 <= n <= 200:
            raise ClusterError(f"host count must be 1..200: {n}")
        self.n = n
        self.tag = tag
        self.slurm_cpus = slurm_cpus
        self.state_dir = STATE_ROOT / tag
        self.hosts: list[Host] = []
        self.workdir: Optional[Path] = None
        self.ssh_config_path: Optional[Path] = None
        self.slurm_conf_path: Optional[Path] = None
        self.subnet: Optional[int] = None
        self.daemons: list[Daemon] = []
        self._inits: dict[str, HostInit] = {}
        self._popens: list[subprocess.Popen] = []

    # ------------------------------------------------------------------ what it is
    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]

    @property
    def bridge_address(self) -> str:
        return netns.bridge_address(self.subnet)

    @property
    def env(self) -> dict[str, str]:
        """Environment for processes that use the cluster (in a host or not: srun, ssh ...)."""
        env = dict(os.environ)
        env["PATH"] = sbin_path()
        if self.slurm_conf_path is not None:
            env["SLURM_CONF"] = str(self.slurm_conf_path)
        return env

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ClusterError(f"no host {name!r} in cluster {self.tag} (hosts: {self.names})")

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> "Cluster":
        try:
            return self.setup()
        except BaseException:
            self.teardown()
            raise

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def setup(self) -> "Cluster":
        """Clean stale clusters, then create the hosts: network, /etc/hosts lines, inits."""
        STATE_ROOT.mkdir(mode=0o755, exist_ok=True)
        # One lock around cleaning and allocating: a concurrent setup's state dir is never seen
        # half-written (and so never taken for a stale one).
        with locked(STATE_ROOT / "alloc.lock"):
            cleanup.clean_stale_locked(own_tag=self.tag)
            self.subnet = netns.free_subnet(cleanup.recorded_subnets())
            self.state_dir.mkdir(parents=True)
            # Shared by the hosts (their /tmp is their own); unique, so a stale one of the same
            # tag is never mistaken for ours.
            self.workdir = Path(tempfile.mkdtemp(prefix="work-", dir=self.state_dir))
            self.hosts = netns.make_hosts(self.tag, self.subnet, self.n)
            self._save_state()
        netns.build_network(self.tag, self.subnet, self.hosts)
        netns.edit_hosts_file(self.tag, [(h.address, h.name) for h in self.hosts])
        for h in self.hosts:
            self._start_init(h)
        return self

    def start_ssh(self, timeout: float = 20) -> None:
        """Start one sshd per host on <address>:22 (key auth, root) and write the ssh client config."""
        if self.ssh_config_path is None:
            self.ssh_config_path = sshd.start_ssh(self, timeout)

    def start_slurm(self, timeout: float = 60) -> None:
        """Start a private munged and slurmctld in the root ns and one slurmd per host; wait idle."""
        if self.slurm_conf_path is None:
            self.slurm_conf_path = slurm.start_slurm(self, timeout)

    def teardown(self) -> None:
        """Remove everything this cluster made. Idempotent; safe after a partial setup."""
        state = cleanup.load_state(self.state_dir)
        if state is not None and not cleanup.owned_by_us(state):
            return  # another live process owns this tag now; it is not ours to remove
        if state is None and self.workdir is None:
            return
        cleanup.destroy(state or self._state())
        for p in self._popens:
            cleanup.reap(p)
        self._popens.clear()
        self.daemons.clear()
        self._inits.clear()
        self.workdir = self.ssh_config_path = self.slurm_conf_path = None

    # ------------------------------------------------------------------ running in a host
    def enter_argv(self, host: str, cwd: Optional[os.PathLike | str] = None) -> list[str]:
        """The command prefix that puts a process into the host (all of its namespaces), in
        ``cwd`` of the host's own filesystem."""
        return hostns.enter_argv(self._init_of(host), None if cwd is None else str(cwd))

    def run_on(self, host: str, argv: Sequence[str], *, timeout: float = 120,
               check: bool = False, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[os.PathLike | str] = None, **kwargs: object) -> subprocess.CompletedProcess:
        """Run argv inside the host (in ``cwd`` there), capturing text output."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.enter_argv(host, cwd) + list(argv), timeout=timeout, check=check,
                              env=dict(env) if env is not None else self.env, **kwargs)

    def popen_on(self, host: str, argv: Sequence[str], *, cwd: Optional[os.PathLike | str] = None,
                 env: Optional[Mapping[str, str]] = None, **kwargs: object) -> HostPopen:
        """Start argv inside the host (in ``cwd`` there, in its own session); the caller waits
        or kills it (``HostPopen`` signals it inside the host)."""
        kwargs.setdefault("start_new_session", True)
        return HostPopen(self.enter_argv(host, cwd) + list(argv), host=host,
                         init=self._init_of(host), env=dict(env) if env is not None else self.env,
                         **kwargs)

    def ssh_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``ssh -F <cfg> <host> <quoted argv>``: argv runs on the host through its sshd."""
        if self.ssh_config_path is None:
            raise ClusterError("start_ssh() first")
        return ["ssh", "-F", str(self.ssh_config_path), host, shlex.join(argv)]

    # ------------------------------------------------------------------ looking inside a host
    def probe(self, host: str, *args: str) -> object:
        """``host_probe.py ARGS`` run inside the host: its JSON answer."""
        res = self.run_on(host, [sys.executable, "-I", "-S", _PROBE, *args], timeout=60)
        if res.returncode != 0:
            raise ClusterError(f"host_probe {args[0]} on {host} failed: {res.stderr[-2000:]}")
        return json.loads(res.stdout)

    def processes(self, host: str) -> list[dict]:
        """The host's process table as the host sees it: ``{pid, ppid, state, cmdline, env}``."""
        return [p for p in self.probe(host, "ps") if p["state"] != "Z"]

    def all_pids_in(self, host: str) -> list[int]:
        """The pids (as the host numbers them) of every process of the host, init included."""
        return sorted(p["pid"] for p in self.processes(host))

    def pids_in(self, host: str) -> list[int]:
        """The host's processes other than its init and the cluster's listening daemons
        (sshd, slurmd). Per-connection sshd children and slurmstepd count: they belong to a
        session or job."""
        own = {d.host_pid for d in self.daemons if d.host == host}
        return [p for p in self.all_pids_in(host) if p not in own]

    def put(self, path: os.PathLike | str, hosts: Optional[Sequence[str]] = None) -> None:
        """Copy the directory at ``path`` to the same path on each host (default: all)."""
        hostfiles.put_tree(self, Path(path), hosts)

    def fetch(self, host: str, path: os.PathLike | str, dest: os.PathLike | str) -> bool:
        """Copy the host's directory ``path`` into local ``dest``; False if it has none."""
        return hostfiles.fetch_tree(self, host, Path(path), Path(dest))

    def read_text(self, host: str, path: os.PathLike | str) -> Optional[str]:
        """The text of the host's file ``path``, or None if it has none."""
        return hostfiles.read_text(self, host, Path(path))

    def exists(self, host: str, path: os.PathLike | str) -> bool:
        """The host has something at ``path``."""
        return hostfiles.exists(self, host, Path(path))

    # ------------------------------------------------------------------ for sshd.py, slurm.py
    def work_subdir(self, *parts: str) -> Path:
        """A directory in the cluster's work dir (shared by all hosts), made if needed."""
        if self.workdir is None:
            raise ClusterError("setup() (or `with Cluster(...)`) first")
        d = self.workdir.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def start_daemon(self, role: str, host: Optional[str], argv: list[str]) -> None:
        """Start a daemon inside a host (or in the root ns for host None) and record it."""
        prefix = self.enter_argv(host) if host else []
        log = self.work_subdir("logs") / f"{role}-{host or 'root'}.out"
        with open(log, "ab") as out:
            p = subprocess.Popen(prefix + argv, env=self.env, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._popens.append(p)
        if host is None:
            self.daemons.append(Daemon(role, None, p.pid, cleanup.started(p.pid)))
        else:  # the daemon is nsenter's child, inside the host
            child = hostns.entered_child(p.pid)
            self.daemons.append(Daemon(role, host, child.pid, child.create_time(),
                                       hostns.pid_in_host(child.pid)))
        self._save_state()

    def daemon_alive_check(self, role: str, host: Optional[str]) -> Callable[[], None]:
        """A check that raises, with the daemon's output, once it has exited."""
        d = next(d for d in reversed(self.daemons) if d.role == role and d.host == host)
        log = self.work_subdir("logs") / f"{role}-{host or 'root'}.out"

        def check() -> None:
            if not d.alive():
                raise ClusterError(f"{role} on {host or 'root ns'} exited: {tail(log)}")
        return check

    # ------------------------------------------------------------------ internals
    def _start_init(self, h: Host) -> None:
        log = self.work_subdir("logs") / f"init-{h.name}.out"
        proc, init = hostns.start_init(h.name, h.netns_path, self.env, log)
        self._popens.append(proc)
        self._inits[h.name] = init
        self.daemons.append(Daemon("init", h.name, init.pid, init.started, 1))
        self._save_state()

    def _init_of(self, host: str) -> HostInit:
        self.host(host)
        try:
            return self._inits[host]
        except KeyError:
            raise ClusterError(f"host {host} has no init (setup() first)") from None

    def _state(self) -> dict:
        return {
            "tag": self.tag, "owner_pid": os.getpid(), "owner_started": cleanup.started(os.getpid()),
            "subnet": self.subnet, "workdir": str(self.workdir) if self.workdir else None,
            "hosts": [{"name": h.name, "address": h.address} for h in self.hosts],
            "daemons": [dataclasses.asdict(d) for d in self.daemons],
        }

    def _save_state(self) -> None:
        cleanup.save_state(self.state_dir, self._state())
