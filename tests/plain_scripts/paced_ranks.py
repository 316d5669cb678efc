"""Plain-Python ranks that report progress themselves, as the rank hook would (no MindSpore):
the contract's ``initialised`` and ``progress`` events (``parallel.contract``), for the launcher's
hang limits, where what is proven is the launcher's judgement and not MindSpore's behaviour.

Each rank steps every ``--step-s`` seconds (a ``progress`` event with a higher ``count``; the
real hook sends one at most every 0.5 s), ``--steps`` times, then exits 0.
``--compile-s S``: the first step comes S seconds after ``initialised`` (graph compilation).
``--hang-rank R --hang-at K``: rank R sleeps for an hour before its step K, outside a step; the
others wait inside step K (``busy``) for as long, as data-parallel peers in the all-reduce do.
``--section KIND:R:K:S`` (repeatable; KIND ``save`` or ``eval``): rank R is inside a checkpoint
save or an evaluation (``section`` KIND) for S seconds before step K, an evaluation's batches
showing as progress inside it; the others wait inside step K meanwhile.
``--fail-rank R --fail-at K``: rank R raises before its step K, in every attempt (a
deterministic failure). Each step is also reported as the trainer's ``step`` event.
``--end-rank R --end-at K``: rank R's script ends after its step K while the others go on;
then every rank's exit handlers, after a clean end, wait until every rank's script has ended, as
MindSpore's finalisation waits for the cluster. (The rank hook's ``exiting`` comes before them,
as it comes before MindSpore's: ``parallel.hook.ending.again_after_init`` after "init".)
"""
import argparse
import atexit
import os
import sys
import time

from parallel import contract, events
from parallel.hook import ending

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--step-s", type=float, default=0.2)
parser.add_argument("--compile-s", type=float, default=0.0)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-at", type=int, default=-1)
parser.add_argument("--section", action="append", default=[], metavar="KIND:R:K:S")
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--end-rank", type=int, default=-1)
parser.add_argument("--end-at", type=int, default=-1)
args = parser.parse_args()
identity = contract.RankIdentity.from_environ(os.environ)
rank = identity.rank
marks = os.path.join(os.environ["NPU_LAUNCH_LOG_DIR"], "ended")
ended = False


def end_script() -> None:
    global ended
    if args.end_rank >= 0:
        os.makedirs(marks, exist_ok=True)
        open(os.path.join(marks, str(rank)), "w").close()
    ended = True
    print(f"rank {rank} done after {count} steps", flush=True)
    sys.exit(0)


def wait_for_every_rank() -> None:
    while ended and args.end_rank >= 0 and len(os.listdir(marks)) < identity.world_size:
        time.sleep(0.05)


atexit.register(wait_for_every_rank)  # before "init", as MindSpore registers its finalisation
sections_at = {int(at): (kind, int(who), float(seconds))
               for kind, who, at, seconds in (item.split(":") for item in args.section)}
sections = 0


def progress(count: int, busy: bool = False, section: str = "") -> None:
    events.emit(contract.EVENT_PROGRESS, count=count, busy=busy, loads=0, section=section,
                sections=sections)


events.emit(contract.EVENT_INITIALISED, exec_mode="graph")
ending.again_after_init()
time.sleep(args.compile_s)
count = 0
for step in range(args.steps):
    if step == args.fail_at and rank == args.fail_rank:
        raise RuntimeError(f"deterministic failure before step {step}")
    if step == args.hang_at:
        if rank != args.hang_rank:
            progress(count, busy=True)  # waiting inside step K for the rank that hangs
        time.sleep(3600)
    if step in sections_at:
        kind, who, seconds = sections_at[step]
        if rank == who:
            progress(count, section=kind)
            end = time.time() + seconds
            while time.time() < end:
                time.sleep(min(0.5, end - time.time()))
                count += kind == contract.SECTION_EVAL
                progress(count, section=kind)
            sections += 1
        else:
            progress(count, busy=True)
            time.sleep(seconds)
    time.sleep(args.step_s)
    count += 1
    progress(count)
    events.emit(contract.EVENT_STEP, step=count, epoch=0)
    if rank == args.end_rank and step == args.end_at:
        end_script()
end_script()
