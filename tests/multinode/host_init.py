"""PID 1 of a fake host (``hostns.py``): says ``up`` once the host's mounts are made, then reaps
every orphan of the host until SIGTERM; its exit makes the kernel kill the whole host.

Standard library only; started as ``python -I -S host_init.py HOSTNAME`` (the name is for ``ps``).
"""
import os
import signal
import time

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("up", flush=True)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
