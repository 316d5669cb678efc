"""A plain-Python rank that starts processes of its own, as real scripts do: a Python subprocess,
a multiprocessing pool under "spawn" (a fresh interpreter each, the resource tracker too), and a
forked child whose uncaught exception is its own, not the rank's. Each prints what it did."""
import multiprocessing
import os
import subprocess
import sys


def double(x):
    return 2 * x


if __name__ == "__main__":
    done = subprocess.run([sys.executable, "-c", "print('subprocess ran')"], capture_output=True,
                          text=True)
    print(f"subprocess exit {done.returncode}: {done.stdout.strip()}", flush=True)
    if done.returncode != 0:
        sys.exit("the subprocess did not run: a pool would hang")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        print(f"spawn pool {pool.map(double, [1, 2, 3])}", flush=True)
    pid = os.fork()
    if pid == 0:
        raise RuntimeError("the forked child fails")  # its own failure: the rank goes on
    print(f"forked child exit {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}", flush=True)
