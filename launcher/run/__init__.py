"""Ranks running on one node: their processes (``process``, ``stdin_feed``), output
(``output``), events (``events``), the one watch loop every node runs (``watch``, ``supervisor``),
how a failure is told (``failures``) and whether to restart (``restarts``)."""
