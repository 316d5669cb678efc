"""Hangs: the limit, learnt from the job or given (``hang_limits``); each node's reading of its
ranks (``node_watch``: whether a quiet rank is alive, ``liveness``, and once all are frozen their
stacks, ``stack_samples``); and node 0's judgement of who hangs (``stalls``)."""
