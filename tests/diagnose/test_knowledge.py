"""The knowledge base: its schema, and a real log excerpt for every entry."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launcher.diagnose import load
from launcher.diagnose.knowledge import parse
from parallel.contract import BadInput

FIXTURES = yaml.safe_load((Path(__file__).parent / "fixtures.yaml").read_text(encoding="utf-8"))
AREAS = ("hccl", "oom", "device", "cann", "cluster", "graph", "data", "ckpt", "torch")


def test_at_least_sixty_entries_and_every_one_has_a_named_real_excerpt():
    kb = load()
    assert len(kb.faults) >= 60
    assert {f["id"] for f in FIXTURES} == {f.id for f in kb.faults}
    assert all(f["source"].strip() and f["line"].strip() for f in FIXTURES)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f["id"] for f in FIXTURES])
def test_each_excerpt_is_named_by_its_entry(fixture):
    kb = load()
    line = fixture["line"].encode()
    assert kb.any.search(line), "the joint expression misses it"
    fault = kb.classify(line)
    assert fault is not None and fault.id == fixture["id"]


def test_every_entry_says_cause_check_fix_and_an_official_link():
    for fault in load().faults:
        assert fault.cause.endswith(".") and fault.fix and fault.check
        assert fault.link.startswith("https://")


@pytest.mark.parametrize("text, said", [
    ("- id: x\n", "is a required property"),
    ("[{id: Bad Id, title: tttttt, patterns: [abc], cause: cccccccccccc, check: [c], fix: ffffffffffff, "
     "link: 'https://x', consequence: false}]", "does not match"),
    ("[{id: a, title: tttttt, patterns: ['(abc'], cause: cccccccccccc, check: [c], "
     "fix: ffffffffffff, link: 'https://x', consequence: false}]", "bad pattern"),
])
def test_a_broken_knowledge_base_is_one_bad_input(text, said):
    with pytest.raises(BadInput, match=said):
        parse(text)
