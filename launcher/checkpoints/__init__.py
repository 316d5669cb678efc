"""Node 0's checkpoints: the ledger of complete steps (``ledger``: which step every rank saved,
what a restart resumes from, node 0's copies where hosts share no storage), the resume point and
how each node puts it in place (``resume``), the files the script saved itself (``script_saves``)
and an agent's upload of a file as node 0 receives it (``uploads``)."""
