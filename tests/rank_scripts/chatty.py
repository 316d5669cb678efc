"""A rank that needs no MindSpore: long lines from every rank at once, a progress bar drawn
with carriage returns and never ended by a newline, then exit with --code."""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, default=200)
parser.add_argument("--code", type=int, default=0)
args = parser.parse_args()
rank = os.environ["RANK_ID"]
for i in range(args.lines):
    sys.stdout.write(f"rank{rank}-line{i}-" + "x" * 3000 + f"-end{i}\n")
sys.stdout.flush()
for pct in (10, 50, 100):
    sys.stdout.write(f"\rprogress {pct}%")
    sys.stdout.flush()
    time.sleep(0.05)
sys.exit(args.code)
