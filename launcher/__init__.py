"""npu-launch, host side: parse, plan, spawn, watch, report. Never imports MindSpore."""

__version__ = "0.1.0"
