"""HCCL rank tables for Ascend clusters: generate, merge, validate and show them.

Modules: ``table`` (the ``RankTable`` value and ``load_rank_table``), ``validate`` (all problems,
each with its JSON path), ``generate`` (one server from this host's devices), ``merge``,
``cluster`` (a whole cluster from a hostfile), ``ascend`` (reading devices and device IPs from
the host), ``show`` and ``cli`` (the ``rank-table`` command group). Nothing is imported here, so
``import rank_tables`` stays free.
"""
