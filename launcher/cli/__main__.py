"""``python -m launcher.cli``: the same as the ``npu-launch`` command."""
from launcher.cli import entry

entry()
