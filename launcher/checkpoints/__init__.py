"""Node 0's ledger of complete steps (``ledger``): which step every rank saved, what a
restart resumes from, and the files it received from hosts that share no storage with it."""
