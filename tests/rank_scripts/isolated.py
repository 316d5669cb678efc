"""``isolated.py SCRIPT ARGS...``: run SCRIPT with ``python -E``, as a wrapper that isolates its
interpreter does. ``-E`` ignores ``PYTHONPATH``, so the rank hook never loads in SCRIPT's process
and the rank never says it imports MindSpore. The wrapper execs before it imports anything."""
import os
import sys

os.execv(sys.executable, [sys.executable, "-E", *sys.argv[1:]])
