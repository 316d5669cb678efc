"""Fixtures: fake multi-node clusters on this machine (see cluster.py for what a host is).

``ssh_cluster``: 2 hosts, each with its own sshd. ``slurm_cluster``: 2 hosts, each with a slurmd,
plus munged and slurmctld in the root namespace. Both are session-scoped :class:`Cluster` objects:

* ``names``, ``addresses``, ``hosts`` (``Host(name, address, uts_path)``, ``netns_path``)
* ``ssh_config_path`` (ssh_cluster): ``ssh -F <it> <name> CMD`` works in BatchMode
* ``run_on(name, argv) -> CompletedProcess``, ``popen_on(name, argv) -> Popen``,
  ``enter_argv(name)`` (the nsenter prefix), ``ssh_argv(name, argv)``
* ``pids_in(name)`` (processes in the host except the cluster's sshd/slurmd listeners),
  ``all_pids_in(name)``, ``daemons``
* ``env``: environment for subprocesses (``SLURM_CONF`` for slurm_cluster, PATH with sbin)

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
