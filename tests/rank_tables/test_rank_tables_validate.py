"""``validate``: one test per kind of problem, each asserting the JSON path it names; the examples;
and the compiled structure check against ``jsonschema``, the reference implementation."""
from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any, Callable

import jsonschema
import pytest
from helpers import RANK_TABLE_EXAMPLES as EXAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rank_tables.structure import SchemaCompileError, compile_schema, format_path
from rank_tables.validate import Problem, load_schema, validate

EXAMPLE_FILES = sorted(EXAMPLES.glob("*.json"))


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


def v10() -> dict[str, Any]:
    return example("rank_table_2x8_v1.0.json")


def v12() -> dict[str, Any]:
    return example("rank_table_superpod_v1.2.json")


def problems_of(doc: Any) -> dict[str, str]:
    problems = validate(doc)
    found = {p.path: p.message for p in problems}
    assert len(found) == len(problems), f"two problems at one path: {problems}"
    return found


def test_the_examples_are_the_three_promised_and_valid() -> None:
    assert [p.name for p in EXAMPLE_FILES] == [
        "rank_table_1x8_v1.0.json", "rank_table_2x8_v1.0.json", "rank_table_superpod_v1.2.json"]
    for path in EXAMPLE_FILES:
        assert validate(json.loads(path.read_text(encoding="utf-8"))) == [], path


def test_the_schemas_are_valid_json_schema() -> None:
    for version in ("1.0", "1.2"):
        jsonschema.Draft202012Validator.check_schema(load_schema(version))


def test_problem_prints_path_then_message() -> None:
    assert str(Problem("server_list[1].device[3].rank_id", "rank 3 is already ...")) == \
        "server_list[1].device[3].rank_id: rank 3 is already ..."


# One case per kind of problem: (base table, change, {path: words in the message}).
def set_(path: str, value: Any) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target, last = _parent(doc, path)
        target[last] = value
    return change


def drop(path: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target, last = _parent(doc, path)
        del target[last]
    return change


def _parent(doc: dict, path: str) -> tuple[Any, Any]:
    """The container holding ``path``'s value in ``doc``, and its key or index there."""
    *parents, last = _parts(path)
    for part in parents:
        doc = doc[part]
    return doc, last


def seventeen_devices() -> dict:
    devices = [{"device_id": str(d), "device_ip": f"10.9.0.{d + 1}", "rank_id": str(8 + d)} for d in range(17)]
    return {"server_id": "10.0.0.99", "device": devices}


def _parts(path: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]


CASES = {
    "object without the required fields": (v10, lambda doc: doc.clear() or doc.update(x=1), {
        "version": "required field is missing", "server_list": "required", "status": "required",
        "server_count": "required"}),
    "device not an object (and nothing else said about it)": (v10, set_("server_list[0].device[2]", 5), {
        "server_list[0].device[2]": "must be an object, got the number 5"}),
    "missing required field": (v10, drop("server_list[1].device[3].rank_id"), {
        "server_list[1].device[3].rank_id": "required field is missing"}),
    "int where a string belongs (merge_hccl.py)": (v10, set_("server_list[1].device[3].rank_id", 11), {
        "server_list[1].device[3].rank_id": 'must be a string ("11"), got the number 11'}),
    "number string that is not a number": (v10, set_("server_list[0].device[2].device_id", "two"), {
        "server_list[0].device[2].device_id": 'must be a whole number of at most 12 digits written as a string, such as "3", got "two"'}),
    "unknown version": (v10, set_("version", "1.1"), {"version": 'must be "1.0" or "1.2", got "1.1"'}),
    "status not completed": (v10, set_("status", "initializing"), {"status": 'must be "completed", got "initializing"'}),
    "empty server list": (v10, set_("server_list", []), {
        "server_list": "must not be empty", "server_count": "says 2 but server_list has 0 server(s)"}),
    "v1.2 field in a v1.0 table": (v10, set_("server_list[0].device[0].super_device_id", "3"), {
        "server_list[0].device[0].super_device_id": "not part of the HCCL rank table v1.0"}),
    "server_count disagrees": (v10, set_("server_count", "3"), {
        "server_count": "says 3 but server_list has 2 server(s)"}),
    "duplicate server": (v10, set_("server_list[1].server_id", "10.0.0.11"), {
        "server_list[1].server_id": '"10.0.0.11" is already server_list[0]'}),
    "server id too long": (v10, set_("server_list[1].server_id", "n" * 65), {
        "server_list[1].server_id": "at most 64 characters"}),
    "device id out of range": (v10, set_("server_list[0].device[7].device_id", "16"), {
        "server_list[0].device[7].device_id": "16 is out of range 0-15"}),
    "duplicate device on a server": (v10, set_("server_list[1].device[5].device_id", "2"), {
        "server_list[1].device[5].device_id": "device 2 is listed twice on this server (also server_list[1].device[2])"}),
    "too many devices": (v10, lambda doc: doc["server_list"].__setitem__(1, seventeen_devices()), {
        "server_list[1].device": "lists 17 items, at most 16 are allowed",
        "server_list[1].device[16].device_id": "16 is out of range 0-15"}),
    "duplicate rank": (v10, set_("server_list[1].device[3].rank_id", "3"), {
        "server_list[1].device[3].rank_id": "rank 3 is already server_list[0].device[3]"}),
    "rank out of range": (v10, set_("server_list[1].device[7].rank_id", "16"), {
        "server_list[1].device[7].rank_id": "rank 16 is out of range 0-15 (16 devices in the table)"}),
    "ranks against server order": (v10, lambda doc: [
        d.update(rank_id=str((int(d["rank_id"]) + 8) % 16)) for s in doc["server_list"] for d in s["device"]], {
        "server_list[0].device": "holds ranks 8-15 but server order gives it 0-7",
        "server_list[1].device": "holds ranks 0-7 but server order gives it 8-15"}),
    "malformed IPv4": (v10, set_("server_list[0].device[1].device_ip", "192.168.1.300"), {
        "server_list[0].device[1].device_ip": '"192.168.1.300" is not an IPv4 or IPv6 address'}),
    "malformed IPv6": (v10, set_("server_list[0].device[1].device_ip", "fe80::1::2"), {
        "server_list[0].device[1].device_ip": "not an IPv4 or IPv6 address"}),
    "duplicate device IP": (v10, set_("server_list[1].device[0].device_ip", "192.2.10.6"), {
        "server_list[1].device[0].device_ip": "192.2.10.6 is already used by server_list[0].device[1]"}),
    "device IP missing across servers": (v10, drop("server_list[1].device[4].device_ip"), {
        "server_list[1].device[4].device_ip": "required when the table spans more than one server"}),
    "bad host_nic_ip": (v10, set_("server_list[0].host_nic_ip", "reserved"), {
        "server_list[0].host_nic_ip": 'must be "reserve" or an IP address, got "reserved"'}),
    "port out of range": (v12, set_("server_list[2].device[1].device_port", "70000"), {
        "server_list[2].device[1].device_port": "70000 is out of range 1-65535"}),
    "host port twice on a server": (v12, set_("server_list[0].device[3].host_port", "16665"), {
        "server_list[0].device[3].host_port": "16665 is already used on this server by server_list[0].device[0]"}),
    "bad host_ip": (v12, set_("server_list[3].host_ip", "172.16.0"), {
        "server_list[3].host_ip": '"172.16.0" is not an IPv4 or IPv6 address'}),
    "bad backup IP": (v12, set_("server_list[3].device[2].backup_device_ip", "x"), {
        "server_list[3].device[2].backup_device_ip": '"x" is not an IPv4 or IPv6 address'}),
    "super pod names an unknown server": (v12, set_("super_pod_list[1].server_list[1].server_id", "node_9"), {
        "super_pod_list[1].server_list[1].server_id": '"node_9" is not a server_id in server_list',
        "server_list[3].server_id": '"node_3" is in no super pod of super_pod_list'}),
    "server in two super pods": (v12, lambda doc: doc["super_pod_list"][1]["server_list"].append(
        {"server_id": "node_0"}), {
        "super_pod_list[1].server_list[2].server_id": '"node_0" is already in super_pod_list[0]'}),
    "duplicate super pod id": (v12, set_("super_pod_list[1].super_pod_id", "0"), {
        "super_pod_list[1].super_pod_id": '"0" is already super_pod_list[0]'}),
    "super pod members not together": (v12, lambda doc: doc["server_list"].insert(1, doc["server_list"].pop(2)), {
        "server_list[2].server_id": "servers of super_pod_list[0] must be listed together in server_list",
        "server_list[3].server_id": "servers of super_pod_list[1] must be listed together in server_list",
        "server_list[1].device": "holds ranks 8-11 but server order gives it 4-7",
        "server_list[2].device": "holds ranks 4-7 but server order gives it 8-11"}),
    "super device id twice in a pod": (v12, set_("server_list[1].device[2].super_device_id", "1"), {
        "server_list[1].device[2].super_device_id": "1 is already server_list[0].device[1] in the same super pod"}),
    "super device id missing": (v12, drop("server_list[2].device[0].super_device_id"), {
        "server_list[2].device[0].super_device_id": "required when super_pod_list is present"}),
    "device IP missing across super pods": (v12, drop("server_list[2].device[0].device_ip"), {
        "server_list[2].device[0].device_ip": "required when the table spans more than one super pod"}),
    "empty super pod": (v12, set_("super_pod_list[0].server_list", []), {
        "super_pod_list[0].server_list": "must not be empty",
        "server_list[0].server_id": "in no super pod", "server_list[1].server_id": "in no super pod"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_of_problem_names_its_json_path(name: str) -> None:
    base, change, expected = CASES[name]
    doc = base()
    change(doc)
    found = problems_of(doc)
    assert set(found) == set(expected), found
    for path, words in expected.items():
        assert words in found[path], (path, found[path])


def test_every_problem_is_reported_not_just_the_first() -> None:
    doc = v10()
    doc["server_list"][0]["device"][0]["rank_id"] = 0
    doc["server_list"][1]["device"][2]["device_ip"] = "999.1.1.1"
    doc["status"] = "initializing"
    assert set(problems_of(doc)) == {"server_list[0].device[0].rank_id", "server_list[1].device[2].device_ip", "status"}


def test_ipv6_addresses_are_accepted() -> None:
    doc = example("rank_table_1x8_v1.0.json")
    for index, device in enumerate(doc["server_list"][0]["device"]):
        device["device_ip"] = f"fd00::{index + 1}"
    assert validate(doc) == []


def test_a_one_server_table_may_leave_device_ips_out() -> None:
    doc = example("rank_table_1x8_v1.0.json")
    for device in doc["server_list"][0]["device"]:
        del device["device_ip"]
    assert validate(doc) == []


def test_unknown_keys_from_cluster_tools_are_kept_legal() -> None:
    doc = v10()
    doc["server_list"][0]["container_ip"] = "192.168.149.3"
    doc["server_list"][0]["device"][0]["device_logical_id"] = "0"
    assert validate(doc) == []


@pytest.mark.parametrize("doc", [None, [], "x", 3])
def test_non_object_documents(doc: Any) -> None:
    assert [str(p) for p in validate(doc)] == [f"$: must be an object, got {_described(doc)}"]


def _described(doc: Any) -> str:
    return {type(None): "null", list: "a list", str: '"x"', int: "the number 3"}[type(doc)]


def test_the_compiler_refuses_keywords_it_does_not_implement() -> None:
    with pytest.raises(SchemaCompileError, match="oneOf"):
        compile_schema({"oneOf": [{"type": "string"}]})
    with pytest.raises(SchemaCompileError, match=r"\['pattern'\] need \"type\": \"string\""):
        compile_schema({"pattern": "^a$"})
    with pytest.raises(SchemaCompileError, match="unsupported type 'integer'"):
        compile_schema({"type": "integer"})
    with pytest.raises(SchemaCompileError, match="only local"):
        compile_schema({"$ref": "https://example.invalid/x.json"})


# The compiled structure check must find what jsonschema finds, where jsonschema finds it.
@functools.lru_cache(maxsize=None)
def reference_validator(version: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(load_schema(version))


def reference_faults(doc: Any, version: str) -> set[tuple[str, str]]:
    faults = set()
    for error in reference_validator(version).iter_errors(doc):
        path = list(error.absolute_path)
        if error.validator == "required":
            path.append(re.match(r"'(.*)' is a required property", error.message).group(1))
        faults.add((format_path(tuple(path)), "false" if error.validator is None else error.validator))
    return faults


def compiled_faults(doc: Any, version: str) -> set[tuple[str, str]]:
    from rank_tables.validate import structure_check
    found: list = []
    structure_check(version)(doc, (), found)
    # jsonschema 4 reports a failed ``false`` subschema at the parent object, not at the key.
    return {(format_path(f.path[:-1] if f.keyword == "false" else f.path), f.keyword) for f in found}


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-3, 70000), st.sampled_from(
    ["", "0", "7", "12", "1.0", "1.2", "completed", "reserve", "x" * 65, "192.168.1.6", "-1", "08", " 3"]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["server_id", "device", "rank_id", "x"]), inner,
                                                   max_size=3)), max_leaves=6)
KEYS = ["version", "server_count", "server_list", "status", "super_pod_list", "server_id", "device", "device_id",
        "device_ip", "rank_id", "device_port", "host_port", "super_device_id", "backup_device_ip", "host_ip",
        "host_nic_ip", "super_pod_id"]


def mutations(doc: Any) -> st.SearchStrategy:
    """A table with a few values replaced, keys deleted or extra keys added, anywhere in it."""
    return st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(["set", "delete", "add"]), JSON_VALUES,
                              st.sampled_from(KEYS)), min_size=1, max_size=4).map(lambda ops: _mutated(doc, ops))


def _mutated(doc: Any, ops: list) -> Any:
    doc = copy.deepcopy(doc)
    for seed, kind, value, key in ops:
        containers = list(_containers(doc))
        container = containers[seed % len(containers)]
        keys = list(container) if isinstance(container, dict) else list(range(len(container)))
        if kind == "add" and isinstance(container, dict):
            container[key] = value
        elif keys and kind == "delete":
            del container[keys[seed % len(keys)]]
        elif keys:
            container[keys[seed % len(keys)]] = value
    return doc


def _containers(value: Any):
    if isinstance(value, (dict, list)):
        yield value
        for child in (value.values() if isinstance(value, dict) else value):
            yield from _containers(child)


LEAF_SAMPLES = [None, True, 3, "", "0", "07", "1.2", "completed", "x" * 65, "10.0.0.1", [], {}]


def first_of_each_list(doc: Any, path: tuple = ()):
    """Paths of every value in ``doc``, entering only the first item of each list."""
    yield path
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from first_of_each_list(value, path + (key,))
    elif isinstance(doc, list) and doc:
        yield from first_of_each_list(doc[0], path + (0,))


def changed(doc: Any, path: tuple, value: Any = None, delete: bool = False) -> Any:
    """A copy of ``doc`` with the value at ``path`` replaced, or deleted from its object."""
    if not path:
        return value
    doc = copy.deepcopy(doc)
    target = doc
    for part in path[:-1]:
        target = target[part]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize("name", [p.name for p in EXAMPLE_FILES])
def test_compiled_structure_check_agrees_with_jsonschema_on_every_single_change(name: str) -> None:
    doc = example(name)
    version = doc["version"]
    checked, faulty = 0, 0
    for path in first_of_each_list(doc):
        variants = [changed(doc, path, value) for value in LEAF_SAMPLES]
        if path and isinstance(path[-1], str):
            variants.append(changed(doc, path, delete=True))
        for variant in variants:
            expected = reference_faults(variant, version)
            assert compiled_faults(variant, version) == expected, (path, variant)
            checked, faulty = checked + 1, faulty + bool(expected)
    assert checked > 150
    assert faulty > checked // 2, "most single changes must break the table, or agreeing means little"


@pytest.mark.parametrize("name", [p.name for p in EXAMPLE_FILES])
def test_compiled_structure_check_agrees_with_jsonschema_on_random_changes(name: str) -> None:
    doc = example(name)
    version = doc["version"]

    faulty = []

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(mutations(doc))
    def agree(mutated: Any) -> None:
        expected = reference_faults(mutated, version)
        assert compiled_faults(mutated, version) == expected
        faulty.append(bool(expected))

    agree()
    assert compiled_faults(doc, version) == reference_faults(doc, version) == set()
    assert sum(faulty) >= 20, "the mutations must mostly break the table, or agreeing means little"
