"""Data, model and pipeline parallel: making a process a configured MindSpore rank.

* ``setup``: ``parallel.init()`` (device, execution mode, communication, parallel context,
  seed) -> ``RankInfo``; needs MindSpore.
* ``topology``: ``RankInfo`` and the rank's coordinates, groups and shard in the dp x mp x pp
  layout (``parallel.config``), pure.
* ``pipeline``: pipeline stages of a network (MindSpore).
* ``scheduler``: MindSpore's scheduler role without the user's script; the launcher starts it
  as ``python -m parallel.mode.scheduler`` (``launcher.plan.planner``).

Scripts reach it as ``parallel.init`` and ``parallel.RankInfo``; ``parallel.data`` reads
``RankInfo``. This ``__init__`` imports nothing: the scheduler and ``topology`` stay cheap.
"""
