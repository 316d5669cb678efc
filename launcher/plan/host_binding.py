"""A node's bound ranks given their cores, found on the host they run on (``bind_node``): by
the launcher for its own host's ranks as it builds the plan, by each node agent for its host's.
The rules and how cores are found: ``launcher.plan.binding``."""
from __future__ import annotations

import dataclasses
from typing import Optional

from launcher.config.cpu_list import AUTO
from launcher.plan.binding import Binding, HostCores, resolve, summary
from launcher.plan.launch_plan import LaunchPlan, ProcessSpec


def bind_node(plan: LaunchPlan, node_rank: int,
              host: Optional[HostCores] = None) -> tuple[LaunchPlan, list[str]]:
    """``plan`` with the bound ranks of node ``node_rank`` given their cores, found on this host
    (``host``: what it offers; read here when not given), and the line saying what was found
    (none when no rank there is bound)."""
    mine = sorted((s for s in plan.ranks if s.node_rank == node_rank and s.binding is not None),
                  key=lambda s: s.local_rank or 0)
    if not mine:
        return plan, []
    bindings = [s.binding for s in mine if s.binding is not None]
    if host is None:
        host = HostCores.here(with_topo=bindings[0].rule == AUTO
                              and any(b.card is not None for b in bindings))
    found = resolve(bindings, host)
    bound = {s.rank: _bound_spec(s, b) for s, b in zip(mine, found)}
    ranks = tuple(bound.get(s.rank, s) for s in plan.ranks)
    return dataclasses.replace(plan, ranks=ranks), [summary([s.rank for s in mine], found)]


def _bound_spec(spec: ProcessSpec, binding: Binding) -> ProcessSpec:
    return dataclasses.replace(spec, binding=binding, env={**spec.env, **binding.env()})
