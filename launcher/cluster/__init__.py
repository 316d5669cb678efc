"""Node 0 and its agents on other hosts: the transports (``backends``: ssh, Slurm, OpenMPI),
how node 0 reaches many hosts at once (``fanout``), what it serves them (``payload``), what it
asks each host before a job (``probe``, ``preflight``; a job's hosts: ``job_preflight``), the
cards' own health on their host (``card_health``) and node 0's verdict on a host's cards
(``card_checks``), ``--sync-workdir`` (``workdir_sync``), the agent itself (``agent``), its
control lines (``control``), node 0's view of its agents (``node_agents``) and checkpoint files
sent back (``collect``)."""
