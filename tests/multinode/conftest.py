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
namespaces forbidden, or binaries missing (install them with ``.ci/install-system-deps``). Any
other setup failure is an error.
"""
from __future__ import annotations

from typing import Iterator

import pytest

from .cluster import SLURM_BINARIES, SSH_BINARIES, Cluster, unavailable_reason, unique_tag


def _skip_unless_possible(binaries: tuple[str, ...]) -> None:
    reason = unavailable_reason(binaries)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def ssh_cluster() -> Iterator[Cluster]:
    """Two fake hosts with sshd (see the module docstring for the API)."""
    _skip_unless_possible(SSH_BINARIES)
    with Cluster(2, tag=unique_tag("s")) as cluster:
        cluster.start_ssh()
        yield cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """Two fake hosts with slurmd, and munged + slurmctld; ``env`` carries SLURM_CONF."""
    _skip_unless_possible(SLURM_BINARIES)
    with Cluster(2, tag=unique_tag("u")) as cluster:
        cluster.start_slurm()
        yield cluster
