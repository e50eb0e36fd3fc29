"""The span-preserving JSON object scanner (app.formats._json)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.formats import _json


def test_spans_are_the_exact_text() -> None:
    text = '{ "a" : [1, 2 ] ,"b":{"x" :"é"}, "c":null}'
    m = _json.scan_object(text)
    assert text[m["a"].start : m["a"].end] == "[1, 2 ]" and m["a"].value == [1, 2]
    assert text[m["b"].start : m["b"].end] == '{"x" :"é"}'
    assert m["c"].value is None
    assert _json.scan_object("  {}  ") == {}


@pytest.mark.parametrize(("text", "message"), [
    ('{"a":1,"a":2}', "appears twice"),
    ('{"a":NaN}', "not valid JSON"),
    ('{"a":1} x', "unexpected data"),
    ("[1]", "expected a JSON object"),
    ('{"a" 1}', "expected ':'"),
    ('{"a":1,}', "expected a member name"),
    ('{"a":1 "b":2}', "expected ','"),
    ('{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
])
def test_rejections(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _json.scan_object(text)


def test_is_exact_json() -> None:
    assert _json.is_exact_json(b'{"a": 1}')
    assert not _json.is_exact_json(b' {"a": 1}')
    assert not _json.is_exact_json(b"")
    assert not _json.is_exact_json(b"\xff")
    assert not _json.is_exact_json(b"NaN")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                           max_leaves=10)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=4), st.sampled_from([None, 2]))
def test_any_object_scans_to_its_members(obj: dict, indent: int | None) -> None:
    import json

    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    members = _json.scan_object(text)
    assert {k: m.value for k, m in members.items()} == obj
    for m in members.values():
        assert json.loads(text[m.start : m.end]) == m.value
