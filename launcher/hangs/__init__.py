"""Hangs: the limit, learnt from the job or given (``hang_limits``), each node's reading of
its ranks' stacks (``stack_samples``), and node 0's judgement of who stalled (``stalls``)."""
