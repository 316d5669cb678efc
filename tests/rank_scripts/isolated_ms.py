"""A MindSpore rank that re-runs itself with ``python -E`` before it imports anything, as a wrapper
that isolates its interpreter does: ``-E`` ignores ``PYTHONPATH``, so the rank hook never loads and
the rank never says it imports MindSpore. It initialises the cluster and prints whether it ran
without the hook."""
import os
import sys

if not sys.flags.ignore_environment:
    os.execv(sys.executable, [sys.executable, "-E", __file__])

import mindspore as ms  # noqa: E402
from mindspore.communication import get_rank, init  # noqa: E402

ms.set_device("CPU")
init()
print(f"rank {get_rank()} up, hook loaded: {'parallel' in sys.modules}", flush=True)
