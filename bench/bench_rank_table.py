"""Time generating, merging and validating a 1024-server x 16-device rank table (16384 ranks).

Run: ``python bench/bench_rank_table.py [--servers 1024] [--devices 16] [--repeat 5]``. Prints the
median and best of each phase:

* generate: 1024 one-server tables through ``generate_server`` (device IPs given by hand, so no
  tool is run; each table is validated as it is built, as the CLI does);
* merge: ``merge_tables`` of those 1024 tables (renumbering, then validating the result);
* validate: ``validate`` of the merged document (structure + meaning), the check
  ``load_rank_table`` runs;
* load: ``json.loads`` + ``validate`` + ``RankTable.from_json`` of the written text;
* from-hostfile: the one-step path, ``cluster_table`` over a 1024-host hostfile with one
  ``hccn.conf`` per host (reading those files included, writing them not);
* jsonschema: for comparison, ``jsonschema`` alone on the same document (what ``validate`` avoids).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

from launcher.cli.rank_table_cluster import ClusterConfig, cluster_table
from rank_tables.ascend import AscendHost
from rank_tables.generate import GenerateConfig, generate_server
from rank_tables.merge import merge_tables
from rank_tables.table import RankTable, load_rank_table
from rank_tables.validate import load_schema, validate

T = TypeVar("T")


def timed(repeat: int, work: Callable[[], T]) -> tuple[list[float], T]:
    """Run ``work`` ``repeat`` times; the durations and the last result."""
    durations, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        durations.append(time.perf_counter() - start)
    return durations, result


def generate_all(servers: int, devices: int, host: AscendHost) -> list[tuple[str, RankTable]]:
    """One generated table per server, with unique server ids and device IPs."""
    tables = []
    for s in range(servers):
        ips = tuple((d, f"10.{s // 256}.{s % 256}.{d + 1}") for d in range(devices))
        config = GenerateConfig(server_id=f"172.16.{s // 256}.{s % 256}", visible_devices=tuple(range(devices)),
                                device_ips=ips)
        tables.append((f"server{s}.json", generate_server(config, host).table))
    return tables


def cluster_inputs(servers: int, devices: int, directory: Path) -> ClusterConfig:
    """A hostfile of ``servers`` hosts and one ``hccn.conf`` per host, written under ``directory``."""
    hosts = [f"172.16.{s // 256}.{s % 256}" for s in range(servers)]
    (directory / "hostfile").write_text("".join(f"{h} slots={devices}\n" for h in hosts), encoding="utf-8")
    confs = []
    for s, host in enumerate(hosts):
        conf = directory / f"hccn_{s}.conf"
        conf.write_text("".join(f"address_{d}=10.{s // 256}.{s % 256}.{d + 1}\nnetmask_{d}=255.255.255.0\n"
                                for d in range(devices)), encoding="utf-8")
        confs.append((host, conf))
    return ClusterConfig(hostfile=directory / "hostfile", hccn_confs=tuple(confs))


def report(name: str, durations: list[float]) -> None:
    print(f"{name:<19} median {statistics.median(durations) * 1000:8.1f} ms   best {min(durations) * 1000:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1024)
    parser.add_argument("--devices", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as empty:
        # No device nodes and no tools: every input comes from the config, as on a login node.
        host = AscendHost(devfs=Path(empty), tool_path=empty, hccn_conf=Path(empty) / "hccn.conf")
        print(f"{args.servers} servers x {args.devices} devices = {args.servers * args.devices} ranks, "
              f"{args.repeat} runs each")
        generate_times, tables = timed(args.repeat, lambda: generate_all(args.servers, args.devices, host))
        merge_times, merged = timed(args.repeat, lambda: merge_tables(tables))
        doc = merged.to_json()
        validate_times, problems = timed(args.repeat, lambda: validate(doc))
        assert problems == [], problems[:3]
        path = Path(empty) / "cluster.json"
        path.write_text(merged.dumps(), encoding="utf-8")
        load_times, loaded = timed(args.repeat, lambda: load_rank_table(path))
        assert loaded.rank_count == args.servers * args.devices
        config = cluster_inputs(args.servers, args.devices, Path(empty))
        cluster_times, cluster = timed(args.repeat, lambda: cluster_table(config))
        assert cluster.rank_count == args.servers * args.devices
    report("generate", generate_times)
    report("merge", merge_times)
    report("validate", validate_times)
    report("load", load_times)
    report("from-hostfile", cluster_times)
    total = [g + m + v for g, m, v in zip(generate_times, merge_times, validate_times)]
    report("gen+merge+validate", total)
    _compare_with_jsonschema(doc, args.repeat)


def _compare_with_jsonschema(doc: dict, repeat: int) -> None:
    import jsonschema
    checker = jsonschema.Draft202012Validator(load_schema(doc["version"]))
    report("jsonschema", timed(min(repeat, 3), lambda: list(checker.iter_errors(doc)))[0])


if __name__ == "__main__":
    main()
