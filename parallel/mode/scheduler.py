"""MindSpore's scheduler (``MS_ROLE=MS_SCHED``) without the user's script.

msrun runs the whole training script as the scheduler; the scheduler only needs MindSpore's
``init()``, so npu-launch starts this module instead: no user imports, no data loading, and a
script that does work at import time does it once per rank, not once more.
"""
from __future__ import annotations

import os

from parallel import contract


def main() -> None:
    import mindspore as ms
    from mindspore.communication import init

    target = "Ascend" if os.environ.get(contract.DEVICE_KIND) == "npu" else "CPU"
    if hasattr(ms, "set_device"):
        ms.set_device(target)
    else:
        ms.set_context(device_target=target)
    init()


if __name__ == "__main__":
    main()
