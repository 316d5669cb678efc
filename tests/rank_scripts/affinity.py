"""A rank that needs no MindSpore: it says which cores it may run on, then waits to be read.

Prints ``affinity <rank> <pid> <cores> cpus=<NPU_LAUNCH_CPUS> msrun=<MSRUN_CPU_LIST>``
(its cores as the kernel's CPU list, from ``os.sched_getaffinity``), then waits until the file
named by its one argument exists (at most 120 s), so the test can read ``/proc/<pid>/status``
while it runs, and exits 0.
"""
import os
import sys
import time


def cpu_list(cores):
    cores, parts = sorted(cores), []
    start = prev = cores[0]
    for core in cores[1:] + [None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


rank = os.environ["RANK_ID"]
print(f"affinity {rank} {os.getpid()} {cpu_list(os.sched_getaffinity(0))} "
      f"cpus={os.environ.get('NPU_LAUNCH_CPUS', '-')} "
      f"msrun={os.environ.get('MSRUN_CPU_LIST', '-').replace(' ', '')}", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
