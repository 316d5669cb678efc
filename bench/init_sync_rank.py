"""The rank of ``bench_init_sync.py``: import MindSpore, optionally wait until the wall-clock
time ``$SYNC_AT`` (every rank calls ``init()`` in the same millisecond), call ``init()``, and
print one JSON line: when ``init()`` was called and how long it took."""
import json
import os
import time

import mindspore  # noqa: F401 - imported before the clock starts, as a training script does
from mindspore.communication import get_rank, init

at = os.environ.get("SYNC_AT")
if at:
    while time.time() < float(at):
        time.sleep(0.001)
called = time.time()
init()
done = time.time()
print(json.dumps({"rank": get_rank(), "called": called, "done": done}), flush=True)
