"""Fixtures: fake multi-node clusters on this machine (see cluster.py for what a host is).

``ssh_cluster``: 2 hosts, each with its own sshd. ``slurm_cluster``: 2 hosts, each with a slurmd,
plus munged and slurmctld in the root namespace. Both are session-scoped :class:`Cluster` objects:

* ``names``, ``addresses``, ``hosts`` (``Host(name, address)``, ``netns_path``)
* ``ssh_config_path`` (ssh_cluster): ``ssh -F <it> <name> CMD`` works in BatchMode
* ``run_on(name, argv, cwd=...) -> CompletedProcess``, ``popen_on(name, argv, cwd=...) ->
  HostPopen`` (``host_pid``; signals are sent inside the host), ``enter_argv(name)`` (the
  nsenter prefix), ``ssh_argv(name, argv)``
* each host's own filesystem: ``put(dir)`` copies a directory to every host, ``fetch``,
  ``read_text``, ``exists`` look at a host's files
* each host's own process table: ``processes(name)``, ``pids_in(name)`` (except the host's init
  and sshd/slurmd listeners), ``all_pids_in(name)``, all in the host's own pids; ``daemons``
* ``env``: environment for subprocesses (``SLURM_CONF`` for slurm_cluster, PATH with sbin)

``jobs.py`` builds on them for jobs: job directories, hostfiles, a job's processes and events.

They skip, with the reason, only when this machine cannot have fake hosts: not root, network
namespaces forbidden, or binaries missing (install them with ``.ci/install-system-deps``). That
is for developers' machines: under ``CI=true`` the skip fails the test (``tests/conftest.py``),
since CI must run these. Any other setup failure is an error. ``can_host_ssh_clusters`` and
``can_host_slurm_clusters`` make the same check for tests that build their own ``Cluster``.
"""
from __future__ import annotations

from typing import Iterator

import pytest

from .cluster import SLURM_BINARIES, SSH_BINARIES, Cluster, unavailable_reason, unique_tag


def _skip_unless_possible(binaries: tuple[str, ...]) -> None:
    reason = unavailable_reason(binaries)
    if reason is not None:
        pytest.skip(f"no fake hosts on this machine: {reason}")


@pytest.fixture(scope="session")
def can_host_ssh_clusters() -> None:
    """Skips unless this machine can host fake clusters with sshd."""
    _skip_unless_possible(SSH_BINARIES)


@pytest.fixture(scope="session")
def can_host_slurm_clusters() -> None:
    """Skips unless this machine can host fake clusters with sshd and Slurm."""
    _skip_unless_possible(SLURM_BINARIES + SSH_BINARIES)


@pytest.fixture(scope="session")
def ssh_cluster(can_host_ssh_clusters: None) -> Iterator[Cluster]:
    """Two fake hosts with sshd (see the module docstring for the API)."""
    with Cluster(2, tag=unique_tag("s")) as cluster:
        cluster.start_ssh()
        yield cluster


@pytest.fixture(scope="session")
def slurm_cluster(can_host_slurm_clusters: None) -> Iterator[Cluster]:
    """Two fake hosts with slurmd, and munged + slurmctld; ``env`` carries SLURM_CONF."""
    with Cluster(2, tag=unique_tag("u")) as cluster:
        cluster.start_slurm()
        yield cluster
