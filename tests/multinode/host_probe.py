"""Run *inside* a fake host (``Cluster.probe``): what that host itself sees, as JSON on stdout.

It reads the host's own ``/proc`` and files, so it answers from the host's process table and
filesystem, with the host's pids, as a user logged in there would find them. Standard library
only; started as ``python -I -S host_probe.py COMMAND ...``.

* ``ps``: every process but this one: ``{pid, ppid, state, cmdline, env}`` where ``env`` holds
  the variables that name a job and a rank (``WATCHED``).
* ``find NAME ROOTS_JSON FLAT_JSON``: paths named NAME anywhere under each of ROOTS and directly
  in each of FLAT (missing directories are skipped, and listed under ``missing``).
* ``events LOG_DIR``: ``{rank: [event, ...]}`` from the ranks' event files this host holds
  (``LOG_DIR/events/rank_N.jsonl`` and ``LOG_DIR/hosts/*/events/rank_N.jsonl``).
"""
import glob
import json
import os
import sys

WATCHED = ("NPU_LAUNCH_JOB_ID", "NPU_LAUNCH_GUARDIAN_OF", "RANK_ID", "MS_ROLE", "PROBE_MARK")


def processes() -> list:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            found.append(_process(int(entry)))
        except OSError:  # gone while we looked
            continue
    return found


def _process(pid: int) -> dict:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read().decode(errors="replace")
    state, ppid = stat.rsplit(")", 1)[1].split()[:2]
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    env = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                key, _, value = item.decode(errors="replace").partition("=")
                if key in WATCHED:
                    env[key] = value
    except OSError:
        pass
    return {"pid": pid, "ppid": int(ppid), "state": state, "cmdline": cmdline, "env": env}


def find(name: str, roots: list, flat: list) -> dict:
    found, missing = [], []
    for root in roots:
        if not os.path.isdir(root):
            missing.append(root)
            continue
        for folder, dirs, files in os.walk(root):
            found += [os.path.join(folder, n) for n in dirs + files if n == name]
    for folder in flat:
        if not os.path.isdir(folder):
            missing.append(folder)
        elif os.path.lexists(os.path.join(folder, name)):
            found.append(os.path.join(folder, name))
    return {"found": sorted(set(found)), "missing": missing}


def events(log_dir: str) -> dict:
    paths = glob.glob(glob.escape(log_dir) + "/events/rank_*.jsonl")
    paths += glob.glob(glob.escape(log_dir) + "/hosts/*/events/rank_*.jsonl")
    seen = {}
    for path in paths:
        rank = os.path.basename(path)[len("rank_"):-len(".jsonl")]
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
        seen.setdefault(rank, [])
        for line in lines:
            try:
                seen[rank].append(json.loads(line)["event"])
            except (ValueError, KeyError, TypeError):
                continue  # a line still being written
    return seen


def main(argv: list) -> None:
    command = argv[0]
    if command == "ps":
        out = processes()
    elif command == "find":
        out = find(argv[1], json.loads(argv[2]), json.loads(argv[3]))
    elif command == "events":
        out = events(argv[1])
    else:
        raise SystemExit(f"host_probe: unknown command {command!r}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
