"""A record's fields read by type (``parallel.record_fields``, on ``Event`` and ``JsonObject``):
a field of another type, null or absent is None, a bool is never a number, and nothing a
hostile record holds raises."""
from __future__ import annotations

from parallel.contract import Event, JsonObject

VALUES = {"flag": True, "whole": 3, "real": 2.5, "text": "a", "items": [1], "object": {"k": "v"},
          "huge": 10 ** 400, "null": None}


def test_each_accessor_returns_only_its_type() -> None:
    record = JsonObject(VALUES)
    read = {name: [k for k in VALUES if getattr(record, name)(k) is not None]
            for name in ("flag", "whole", "number", "text", "items", "object")}
    assert read == {"flag": ["flag"], "whole": ["whole", "huge"], "number": ["whole", "real"],
                    "text": ["text"], "items": ["items"], "object": ["object"]}, \
        "a bool is no number; an int too large for a float is none"
    assert record.number("whole") == 3.0 and record.whole("absent") is None
    inner = record.object("object")
    assert inner is not None and inner.text("k") == "v"
    assert JsonObject.of([1, 2]) is None and JsonObject.of("text") is None


def test_an_event_reads_the_fields_it_has_no_name_for() -> None:
    event = Event.parse({"event": "framework", "rank": 0, "name": "mindspore", "kept": True,
                         "process_start": "12"})
    assert event is not None
    assert event.flag("kept") is True and event.flag("absent") is None
    assert event.number("process_start") is None, "a time written as text is not read as one"
