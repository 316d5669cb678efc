"""HCCL rank tables for Ascend clusters: generate, merge, validate and show them.

Modules: ``table`` (the ``RankTable`` value and ``load_rank_table``), ``validate`` (all problems,
each with its JSON path), ``generate`` (one server from this host's devices), ``merge``,
``ascend`` (reading devices and device IPs from the host), ``show``, ``bounded`` (reading files
and JSON within bounds), ``surrogates`` (strings that are no text) and ``errors``. The
``rank-table`` commands live in the launcher (``launcher.cli.rank_table``), which sits above
this library. Nothing is imported here, so ``import rank_tables`` stays free.
"""
