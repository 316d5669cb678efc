"""A plain-Python rank that leaves a daemon behind which the launch's token cannot find: its child
starts in a session of its own with an environment of one variable (as a service a script starts
may), writes its pid to ``PIDS_DIR/daemon_<rank>``, and sleeps for ten minutes. Then the rank
exits with ``--exit-code`` (rank 1 only; rank 0 exits 0)."""
import argparse
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("pids_dir")
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()
rank = int(os.environ["RANK"])
daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True, env={"PATH": os.environ.get("PATH", "")},
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
path = os.path.join(args.pids_dir, f"daemon_{rank}")
with open(path + ".tmp", "w") as f:
    f.write(str(daemon.pid))
os.replace(path + ".tmp", path)
time.sleep(0.3)
sys.exit(args.exit_code if rank == 1 else 0)
