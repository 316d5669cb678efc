"""Real multi-node test hosts on one machine: network namespaces with their own hostname, sshd, slurmd.

How a launcher developer uses it (as root)::

    from tests.multinode.cluster import Cluster      # in tests: use the fixtures in conftest.py

    with Cluster(2, tag="t1") as c:                  # hosts npl-t1-1, npl-t1-2
        c.start_ssh()                                # sshd on <address>:22 in every host
        c.run_on("npl-t1-1", ["hostname"])           # -> CompletedProcess, stdout "npl-t1-1\\n"
        subprocess.run(c.ssh_argv("npl-t1-2", ["hostname"]), env=c.env)
        subprocess.run(["ssh", "-F", str(c.ssh_config_path), "npl-t1-2", "true"])
        c.start_slurm()                              # munged + slurmctld (root ns) + slurmd per host
        subprocess.run(["srun", "-N2", "hostname"], env=c.env)   # c.env carries SLURM_CONF
        assert c.pids_in("npl-t1-1") == []           # nothing but the cluster's own daemons left

What a host is:

* a network namespace ``npl-<tag>-<i>`` (``ip netns``) with ``lo`` up and an ``eth0`` veth whose
  peer ``nv-<tag>-<i>`` sits in the bridge ``npl-<tag>-br`` of the root namespace. Each cluster takes
  its own free ``10.77.<k>.0/24``: the bridge (the root namespace) is ``10.77.<k>.1``, host *i* is
  ``10.77.<k>.<i+1>``. There is no default route: a host reaches only its peers and the root ns.
* a persistent UTS namespace (bind-mounted under ``/run/npl-clusters/<tag>/uts/``) whose hostname is
  the host's name. Everything started in a host (``run_on``, ``popen_on``, sshd, slurmd) goes
  through ``nsenter --net=... --uts=...``, so ``hostname`` prints the host's name, also over ssh
  and inside Slurm tasks. ``ip netns exec`` is avoided: it remounts ``/sys`` and hides the cgroup
  mount that slurmd needs.

How host names resolve: the ssh config file (``ssh_config_path``) maps every name to its address
with ``HostName``. For everything else (MindSpore, Slurm, Python's ``socket.gethostbyname``) the
cluster appends ``<address> <name>  # npl-cluster <tag>`` lines to ``/etc/hosts`` for its lifetime
and removes the lines carrying its marker at teardown (or at the next setup after a killed run).

The Python over ssh: hosts share this machine's filesystem, so a command sent over ssh names
the interpreter by its path, ``sys.executable``, as the launcher itself does
(``launcher/backends/common.py`` ``python_of``). A bare ``python3`` would be whatever the remote
login shell finds first on its ``PATH`` (another interpreter when the tests run in a virtualenv).
sshd gives sessions the creating process's ``PATH`` plus the sbin dirs (``SetEnv``) for the
system tools (``ip``, ``nsenter``, ``srun``), not for Python.

Slurm: a private ``munged`` (own key and socket, ``AuthInfo=socket=...``) and ``slurmctld`` run in
the root namespace on the bridge address and a free port; one ``slurmd -N <host>`` runs in each
host. ``env`` carries ``SLURM_CONF`` for ``srun``/``sbatch``/``sinfo``.

Teardown (``teardown()``, ``__exit__``) is idempotent and works after a partial setup: it kills
the processes it recorded (by pid, checked against their start time) and every process inside the
hosts' namespaces, then deletes namespaces, veths, bridge, ``/etc/hosts`` lines and temp dirs.
State is kept in ``/run/npl-clusters/<tag>/state.json`` from before the first change, so a cluster
left by a killed run (its owner process is gone) is cleaned by the next ``setup()`` of any cluster.
"""
from __future__ import annotations

import dataclasses
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import psutil

STATE_ROOT = Path("/run/npl-clusters")
NETNS_DIR = Path("/run/netns")
HOSTS_FILE = Path("/etc/hosts")
NAME_PREFIX = "npl-"
SUBNET_BASE = "10.77"
SLURMD_PORT = 6818
HOSTS_MARKER = "# npl-cluster"
TAG_RE = re.compile(r"^[a-z0-9]{1,8}$")  # 8: interface names are limited to 15 characters

SSH_BINARIES = ("ip", "nsenter", "unshare", "sshd", "ssh", "ssh-keygen")
SLURM_BINARIES = ("ip", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "srun", "sinfo")


class ClusterError(RuntimeError):
    """Setting up or using the fake cluster failed."""


class ClusterUnavailable(ClusterError):
    """This machine cannot host fake clusters at all (not root, no namespaces, binaries missing)."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One fake host: its name is its hostname, its netns name and its ssh alias."""

    name: str
    address: str
    uts_path: Path

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.name


@dataclasses.dataclass(frozen=True)
class Daemon:
    """A process the cluster started; ``started`` (psutil create time) guards against pid reuse."""

    role: str
    host: Optional[str]
    pid: int
    started: float

    def alive(self) -> bool:
        """True while this very process (not a later one with the same pid) runs."""
        return _live_process(self) is not None


def unavailable_reason(binaries: Iterable[str] = SSH_BINARIES) -> Optional[str]:
    """Why this machine cannot host fake clusters, or None if it can. Creates and deletes one netns."""
    if os.geteuid() != 0:
        return "fake hosts need root (network namespaces, sshd, slurmd)"
    missing = [b for b in binaries if shutil.which(b, path=_sbin_path()) is None]
    if missing:
        return f"missing binaries: {' '.join(missing)} (run .ci/install-system-deps)"
    probe = f"{NAME_PREFIX}probe{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        if re.search(r"permission denied|operation not permitted", res.stderr, re.I):
            return f"this machine forbids network namespaces: {res.stderr.strip()}"
        raise ClusterError(f"ip netns add {probe} failed: {res.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Cluster:
    """N fake hosts; ``setup()`` builds the network, ``start_ssh()``/``start_slurm()`` the services."""

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
        self._popens: list[subprocess.Popen] = []

    # ------------------------------------------------------------------ public API
    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]

    @property
    def bridge_address(self) -> str:
        return f"{SUBNET_BASE}.{self.subnet}.1"

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses that use the cluster (srun, sinfo, ssh ...)."""
        env = dict(os.environ)
        env["PATH"] = _sbin_path()
        if self.slurm_conf_path is not None:
            env["SLURM_CONF"] = str(self.slurm_conf_path)
        return env

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ClusterError(f"no host {name!r} in cluster {self.tag} (hosts: {self.names})")

    def __enter__(self) -> "Cluster":
        try:
            return self.setup()
        except BaseException:
            self.teardown()
            raise

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def setup(self) -> "Cluster":
        """Clean stale clusters, then create namespaces, bridge, veths, hostnames, /etc/hosts lines."""
        STATE_ROOT.mkdir(mode=0o755, exist_ok=True)
        # One lock around cleaning and allocating: a concurrent setup's state dir is never seen
        # half-written (and so never taken for a stale one).
        with _locked(STATE_ROOT / "alloc.lock"):
            _clean_stale(own_tag=self.tag)
            self.subnet = _free_subnet()
            self.workdir = Path(tempfile.mkdtemp(prefix=f"npl-{self.tag}-"))
            self.hosts = [self._make_host(i) for i in range(1, self.n + 1)]
            self.state_dir.mkdir(parents=True)
            self._save_state()
        self._build_network()
        _edit_hosts_file(self.tag, [(h.address, h.name) for h in self.hosts])
        return self

    def run_on(self, host: str, argv: Sequence[str], *, timeout: float = 120,
               check: bool = False, env: Optional[Mapping[str, str]] = None,
               **kwargs: object) -> subprocess.CompletedProcess:
        """Run argv inside the host (its netns and hostname), capturing text output."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.enter_argv(host) + list(argv), timeout=timeout, check=check,
                              env=dict(env) if env is not None else self.env, **kwargs)

    def popen_on(self, host: str, argv: Sequence[str], **kwargs: object) -> subprocess.Popen:
        """Start argv inside the host in its own session; the caller waits or kills it."""
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.enter_argv(host) + list(argv), **kwargs)

    def enter_argv(self, host: str) -> list[str]:
        """The command prefix that puts a process into the host: nsenter into its net and UTS ns."""
        h = self.host(host)
        return ["nsenter", f"--net={h.netns_path}", f"--uts={h.uts_path}", "--"]

    def ssh_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``ssh -F <cfg> <host> <quoted argv>``: argv runs on the host through its sshd."""
        if self.ssh_config_path is None:
            raise ClusterError("start_ssh() first")
        return ["ssh", "-F", str(self.ssh_config_path), host, shlex.join(argv)]

    def all_pids_in(self, host: str) -> list[int]:
        """Every process whose network namespace is the host's (daemons included)."""
        ino = _ns_inode(self.host(host).netns_path)
        return sorted(_pids_with_ns("net", {ino})) if ino is not None else []

    def pids_in(self, host: str) -> list[int]:
        """Processes in the host other than the cluster's listening daemons (sshd, slurmd).

        Per-connection sshd children and slurmstepd count: they belong to a session or job.
        """
        daemons = {d.pid for d in self.daemons if d.host == host}
        return [p for p in self.all_pids_in(host) if p not in daemons]

    # ------------------------------------------------------------------ ssh
    def start_ssh(self, timeout: float = 20) -> None:
        """Start one sshd per host on <address>:22 (key auth, root) and write the ssh client config."""
        if self.ssh_config_path is not None:
            return
        _need_binaries(SSH_BINARIES)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        sshdir = self._dir("ssh")
        key = sshdir / "id_ed25519"
        _keygen(key)
        (sshdir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())
        known = []
        for h in self.hosts:
            hostkey = self._dir("hosts", h.name) / "ssh_host_ed25519_key"
            _keygen(hostkey)
            pub = " ".join(hostkey.with_suffix(".pub").read_text().split()[:2])
            known.append(f"{h.name},{h.address} {pub}\n")
            self._start_daemon("sshd", h.name, ["/usr/sbin/sshd", "-D", "-f",
                                                str(self._write_sshd_config(h, hostkey))])
        (sshdir / "known_hosts").write_text("".join(known))
        config = self._write_ssh_config(key, sshdir / "known_hosts")
        for h in self.hosts:
            _wait_for_port(h.address, 22, timeout, self._daemon_alive("sshd", h.name))
        self.ssh_config_path = config

    def _write_sshd_config(self, h: Host, hostkey: Path) -> Path:
        d = hostkey.parent
        lines = [
            f"ListenAddress {h.address}:22",
            f"HostKey {hostkey}",
            f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.workdir / 'ssh' / 'authorized_keys'}",
            "PermitRootLogin yes",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",  # the key files live under /tmp, which is world-writable
            "UseDNS no",
            "PrintMotd no",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            f'SetEnv "PATH={_sbin_path()}"',
            "Subsystem sftp internal-sftp",
            "LogLevel ERROR",
        ]
        path = d / "sshd_config"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _write_ssh_config(self, key: Path, known_hosts: Path) -> Path:
        out = [f"Host {h.name}\n  HostName {h.address}\n" for h in self.hosts]
        out.append("Host *\n" + "".join(f"  {line}\n" for line in [
            "User root", "Port 22", f"IdentityFile {key}", "IdentitiesOnly yes",
            f"UserKnownHostsFile {known_hosts}", "GlobalKnownHostsFile /dev/null",
            "StrictHostKeyChecking yes", "BatchMode yes", "ConnectTimeout 10", "LogLevel ERROR",
        ]))
        path = self.workdir / "ssh" / "config"
        path.write_text("".join(out))
        return path

    # ------------------------------------------------------------------ slurm
    def start_slurm(self, timeout: float = 60) -> None:
        """Start a private munged and slurmctld in the root ns and one slurmd per host; wait idle."""
        if self.slurm_conf_path is not None:
            return
        _need_binaries(SLURM_BINARIES)
        d = self._dir("slurm")
        for sub in ("state", "spool", "munge"):
            self._dir("slurm", sub)
        os.chmod(d / "munge", 0o700)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = d / "munge" / "munge.socket"
        self._start_daemon("munged", None, [
            "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
            f"--pid-file={d / 'munge' / 'munged.pid'}", f"--log-file={d / 'munge' / 'munged.log'}",
            f"--seed-file={d / 'munge' / 'munged.seed'}"])
        _wait_until(sock.exists, 10, "munged socket", self._daemon_alive("munged", None))
        self.slurm_conf_path = self._write_slurm_conf(d, sock, _free_port(self.bridge_address))
        self._start_daemon("slurmctld", None, ["slurmctld", "-D", "-c", "-f", str(self.slurm_conf_path)])
        for h in self.hosts:
            self._start_daemon("slurmd", h.name,
                               ["slurmd", "-D", "-N", h.name, "-f", str(self.slurm_conf_path)])
        _wait_until(self._slurm_nodes_idle, timeout, "all slurm nodes idle",
                    self._daemon_alive("slurmctld", None), log=d / "slurmctld.log")

    def _write_slurm_conf(self, d: Path, munge_socket: Path, ctld_port: int) -> Path:
        lines = [
            f"ClusterName=npl{self.tag}",
            f"SlurmctldHost={socket.gethostname()}({self.bridge_address})",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={SLURMD_PORT}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'spool'}/slurmd.%n.pid",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'spool'}/slurmd.%n.log",
            f"PlugStackConfig={d / 'plugstack.conf'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdTimeout=300",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=10",
        ]
        lines += [f"NodeName={h.name} NodeAddr={h.address} CPUs={self.slurm_cpus} State=UNKNOWN"
                  for h in self.hosts]
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        (d / "plugstack.conf").write_text("")
        path = d / "slurm.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _slurm_nodes_idle(self) -> bool:
        res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env,
                             capture_output=True, text=True, timeout=30)
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        return res.returncode == 0 and all(states.get(n) == "idle" for n in self.names)

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Remove everything this cluster made. Idempotent; safe after a partial setup."""
        state = _load_state(self.state_dir)
        if state is not None and not _owned_by_us(state):
            return  # another live process owns this tag now; it is not ours to remove
        if state is None and self.workdir is None:
            return
        _destroy(state or self._state())
        for p in self._popens:
            _reap(p)
        self._popens.clear()
        self.daemons.clear()
        self.workdir = self.ssh_config_path = self.slurm_conf_path = None

    # ------------------------------------------------------------------ internals
    def _make_host(self, i: int) -> Host:
        name = f"{NAME_PREFIX}{self.tag}-{i}"
        return Host(name, f"{SUBNET_BASE}.{self.subnet}.{i + 1}", self.state_dir / "uts" / name)

    def _dir(self, *parts: str) -> Path:
        if self.workdir is None:
            raise ClusterError("setup() (or `with Cluster(...)`) first")
        d = self.workdir.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _state(self) -> dict:
        return {
            "tag": self.tag, "owner_pid": os.getpid(), "owner_started": _started(os.getpid()),
            "subnet": self.subnet, "workdir": str(self.workdir) if self.workdir else None,
            "hosts": [dataclasses.asdict(h) | {"uts_path": str(h.uts_path)} for h in self.hosts],
            "daemons": [dataclasses.asdict(d) for d in self.daemons],
        }

    def _save_state(self) -> None:
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(self._state(), indent=1))
        tmp.replace(self.state_dir / "state.json")

    def _build_network(self) -> None:
        br = _bridge_name(self.tag)
        _ip("link", "add", br, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", br)
        _ip("link", "set", br, "up")
        (self.state_dir / "uts").mkdir()
        for i, h in enumerate(self.hosts, start=1):
            veth = _veth_name(self.tag, i)
            _ip("netns", "add", h.name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.name)
            _ip("link", "set", veth, "master", br, "up")
            _ip("-n", h.name, "addr", "add", f"{h.address}/24", "dev", "eth0")
            _ip("-n", h.name, "link", "set", "eth0", "up")
            _ip("-n", h.name, "link", "set", "lo", "up")
            h.uts_path.touch()
            _run(["unshare", f"--uts={h.uts_path}", "hostname", h.name])

    def _start_daemon(self, role: str, host: Optional[str], argv: list[str]) -> None:
        prefix = self.enter_argv(host) if host else []
        log = self._dir("logs") / f"{role}-{host or 'root'}.out"
        with open(log, "ab") as out:
            p = subprocess.Popen(prefix + argv, env=self.env, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._popens.append(p)
        self.daemons.append(Daemon(role, host, p.pid, _started(p.pid)))
        self._save_state()

    def _daemon_alive(self, role: str, host: Optional[str]) -> Callable[[], None]:
        """A check that raises, with the daemon's output, once it has exited."""
        d = next(d for d in reversed(self.daemons) if d.role == role and d.host == host)
        log = self.workdir / "logs" / f"{role}-{host or 'root'}.out"

        def check() -> None:
            if _live_process(d) is None:
                raise ClusterError(f"{role} on {host or 'root ns'} exited: {_tail(log)}")
        return check


# ---------------------------------------------------------------------- cleanup of any cluster
def unique_tag(prefix: str) -> str:
    """A tag no other live process uses: prefix + this process's pid in base 36 (<= 5 digits)."""
    pid, digits = os.getpid(), ""
    while pid:
        pid, r = divmod(pid, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
    return prefix + digits


def clean_stale(own_tag: Optional[str] = None) -> list[str]:
    """Destroy clusters whose owner process is gone, and leftovers named for own_tag.

    Returns the tags cleaned. A cluster whose owner is alive is left alone, except own_tag held by
    this very process (an earlier Cluster object that was never torn down). ``setup()`` runs it.
    """
    STATE_ROOT.mkdir(mode=0o755, exist_ok=True)
    with _locked(STATE_ROOT / "alloc.lock"):
        return _clean_stale(own_tag)


def _clean_stale(own_tag: Optional[str]) -> list[str]:
    cleaned = []
    tags = {p.name for p in STATE_ROOT.iterdir() if p.is_dir()} if STATE_ROOT.exists() else set()
    tags |= _tags_of_leftover_namespaces()
    for tag in sorted(tags):
        state = _load_state(STATE_ROOT / tag)
        owner_alive = state is not None and _owner_alive(state)
        if owner_alive and not (tag == own_tag and _owned_by_us(state)):
            if tag == own_tag:
                raise ClusterError(f"tag {tag!r} is in use by live process {state['owner_pid']}")
            continue
        _destroy(state or {"tag": tag, "hosts": [], "daemons": []})
        cleaned.append(tag)
    return cleaned


def recorded_daemons(tag: str) -> list[Daemon]:
    """The daemons recorded for a cluster tag (also of a killed run), or [] if none is."""
    state = _load_state(STATE_ROOT / tag)
    return [Daemon(**d) for d in state.get("daemons", [])] if state else []


def _destroy(state: dict) -> None:
    tag = state["tag"]
    _terminate([p for d in reversed(state.get("daemons", []))
                if (p := _live_process(Daemon(**d))) is not None])
    names = {h["name"] for h in state.get("hosts", [])} | _leftover_namespaces(tag)
    inodes = {ino for n in names if (ino := _ns_inode(NETNS_DIR / n)) is not None}
    uts_paths = [Path(h["uts_path"]) for h in state.get("hosts", [])]
    uts_dir = STATE_ROOT / tag / "uts"
    if uts_dir.is_dir():
        uts_paths += list(uts_dir.iterdir())
    uts_inodes = {ino for p in uts_paths if (ino := _ns_inode(p, "uts")) is not None}
    _terminate(_processes(_pids_with_ns("net", inodes) | _pids_with_ns("uts", uts_inodes)))
    for name in sorted(names):
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for link in _links_of(tag):
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    for p in set(uts_paths):
        subprocess.run(["umount", str(p)], capture_output=True)
    _edit_hosts_file(tag, [])
    if state.get("workdir"):
        shutil.rmtree(state["workdir"], ignore_errors=True)
    shutil.rmtree(STATE_ROOT / tag, ignore_errors=True)


def _terminate(procs: list[psutil.Process], grace: float = 5.0) -> None:
    for p in procs:
        _signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace)


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def _reap(p: subprocess.Popen) -> None:
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


# ---------------------------------------------------------------------- namespaces and processes
def _ns_inode(path: Path, kind: str = "net") -> Optional[int]:
    """Inode of the namespace bound at path, or None if none is (never the root ns's own)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    own = os.stat(f"/proc/self/ns/{kind}")
    if st.st_dev != own.st_dev:  # not an nsfs file: e.g. a netns file whose bind mount is gone
        return None
    return None if st.st_ino == own.st_ino else st.st_ino


def _pids_with_ns(kind: str, inodes: set[int]) -> set[int]:
    """Pids whose namespace of that kind is one of inodes (compared through /proc/<pid>/ns)."""
    found: set[int] = set()
    if not inodes:
        return found
    for pid in psutil.pids():
        try:
            if os.stat(f"/proc/{pid}/ns/{kind}").st_ino in inodes:
                found.add(pid)
        except OSError:
            continue
    return found


def _processes(pids: Iterable[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return procs


def _started(pid: int) -> float:
    return psutil.Process(pid).create_time()


def _live_process(d: Daemon) -> Optional[psutil.Process]:
    try:
        p = psutil.Process(d.pid)
        return p if abs(p.create_time() - d.started) < 0.01 and p.status() != "zombie" else None
    except psutil.NoSuchProcess:
        return None


def _owner_alive(state: dict) -> bool:
    return _live_process(Daemon("owner", None, state["owner_pid"], state["owner_started"])) is not None


def _owned_by_us(state: dict) -> bool:
    return state["owner_pid"] == os.getpid() and _owner_alive(state)


def _load_state(d: Path) -> Optional[dict]:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _leftover_namespaces(tag: str) -> set[str]:
    pat = re.compile(rf"^{re.escape(NAME_PREFIX)}{re.escape(tag)}-\d+$")
    return {n for n in _netns_names() if pat.match(n)}


def _tags_of_leftover_namespaces() -> set[str]:
    pat = re.compile(rf"^{re.escape(NAME_PREFIX)}([a-z0-9]{{1,8}})-\d+$")
    return {m.group(1) for n in _netns_names() if (m := pat.match(n))}


def _netns_names() -> list[str]:
    return [p.name for p in NETNS_DIR.iterdir()] if NETNS_DIR.is_dir() else []


def _links_of(tag: str) -> list[str]:
    res = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    names = [line.split(":")[1].strip().split("@")[0] for line in res.stdout.splitlines()]
    pat = re.compile(rf"^(nv-{re.escape(tag)}-\d+|{re.escape(_bridge_name(tag))})$")
    return [n for n in names if pat.match(n)]


def _bridge_name(tag: str) -> str:
    return f"{NAME_PREFIX}{tag}-br"


def _veth_name(tag: str, i: int) -> str:
    return f"nv-{tag}-{i}"


# ---------------------------------------------------------------------- small helpers
def _free_subnet() -> int:
    """Smallest k whose 10.77.k.0/24 no interface and no recorded cluster uses."""
    res = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    used = {int(m.group(1)) for m in re.finditer(rf"inet {re.escape(SUBNET_BASE)}\.(\d+)\.", res.stdout)}
    for d in STATE_ROOT.iterdir():
        state = _load_state(d)
        if state and state.get("subnet") is not None:
            used.add(state["subnet"])
    for k in range(0, 256):
        if k not in used:
            return k
    raise ClusterError(f"no free {SUBNET_BASE}.k.0/24 left")


def _edit_hosts_file(tag: str, entries: list[tuple[str, str]]) -> None:
    """Drop this tag's marked lines from /etc/hosts, then append entries (address, name)."""
    marker = f"{HOSTS_MARKER} {tag}"
    with _locked(STATE_ROOT / "hosts.lock"):
        lines = HOSTS_FILE.read_text().splitlines(keepends=True) if HOSTS_FILE.exists() else []
        kept = [line for line in lines if not line.rstrip("\n").endswith(marker)]
        if kept and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        new = kept + [f"{addr} {name}  {marker}\n" for addr, name in entries]
        if new != lines:
            # Written in place, not renamed over: /etc/hosts is often a bind mount in containers.
            with open(HOSTS_FILE, "r+" if HOSTS_FILE.exists() else "w") as f:
                f.seek(0)
                f.write("".join(new))
                f.truncate()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on path (between processes; not re-entrant within one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(argv: list[str]) -> None:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError(f"{shlex.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")


def _keygen(path: Path) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)])


def _need_binaries(binaries: Iterable[str]) -> None:
    missing = [b for b in binaries if shutil.which(b, path=_sbin_path()) is None]
    if missing:
        raise ClusterUnavailable(f"missing binaries: {' '.join(missing)} (run .ci/install-system-deps)")


def _sbin_path() -> str:
    """The caller's PATH with the sbin dirs appended (sshd, slurmd and ip live there)."""
    parts = os.environ.get("PATH", "").split(os.pathsep)
    extra = [p for p in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
             if p not in parts]
    return os.pathsep.join([p for p in parts if p] + extra)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _wait_for_port(address: str, port: int, timeout: float, alive_check: Callable[[], None]) -> None:
    def accepting() -> bool:
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            return False
    _wait_until(accepting, timeout, f"{address}:{port} accepting", alive_check)


def _wait_until(pred: Callable[[], bool], timeout: float, what: str,
                alive_check: Optional[Callable[[], None]] = None, log: Optional[Path] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive_check is not None:
            alive_check()
        if pred():
            return
        time.sleep(0.1)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}"
                       + (f"; {log}: {_tail(log)}" if log else ""))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
