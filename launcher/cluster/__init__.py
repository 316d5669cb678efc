"""Node 0 and its agents on other hosts: the transports (``backends``: ssh, Slurm,
OpenMPI), what node 0 serves them (``payload``), preflight and card checks (``preflight``; a
job's hosts before it starts: ``job_preflight``), workdir sync, the agent itself (``agent``),
its control lines (``control``), node 0's view of its agents (``node_agents``) and checkpoint
files sent back (``collect``)."""
