"""npu-launch, rank side: runs inside every rank; the only package that imports MindSpore.

Importing ``parallel`` itself imports nothing heavy: each submodule imports MindSpore when it is
used, so the launcher can read ``parallel.config`` without MindSpore installed.
"""
