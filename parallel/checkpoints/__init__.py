"""Checkpoints on the rank side: what a rank saves, how a step becomes complete, last words.

* ``manifest``: a step's manifest and the atomic writers, pure (no MindSpore); the launcher
  imports it too (``launcher.checkpoints``, ``launcher.run``, ``launcher.observe``...).
* ``checkpoint``: per-rank atomic checkpoints of the shared trainer (MindSpore when they run).
* ``last_words``: a replica's last completed step saved as a peer fails (no MindSpore).

Imported by ``parallel.trainer``. This ``__init__`` imports nothing, so the launcher reads
``parallel.checkpoints.manifest`` without MindSpore.
"""
