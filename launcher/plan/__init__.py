"""Everything decided before a process starts: each rank's host, device, ports and
environment (``launch_plan``, laid out by ``planner``; ``ports``), its cores (``binding``), an
operator's pods (``pods``, and what they wait for: ``pod_waits``) and rank-table mode
(``rank_table_mode``)."""
