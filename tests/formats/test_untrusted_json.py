"""`loads_untrusted`, the one parser of JSON Prism's operator tools did not write (DLQ values,
ledger entries, audit records): a value or `ValueError`, never another exception - not for deep
nesting (json.loads raised RecursionError), not for huge input, not for any bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli.envelope_view import value_doc
from app.formats.untrusted_json import MAX_DEPTH, loads_untrusted, nesting_depth

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=20)


@given(st.binary(max_size=300))
@settings(max_examples=400)
def test_any_bytes_give_a_value_or_value_error(data: bytes) -> None:
    try:
        value = loads_untrusted(data)
    except ValueError:
        return
    assert value == json.loads(data)  # what it accepts, it reads as the standard does


@given(_JSON)
def test_what_json_writes_reads_back(doc: object) -> None:
    assert loads_untrusted(json.dumps(doc).encode()) == doc


@given(st.integers(min_value=MAX_DEPTH + 1, max_value=200_000), st.sampled_from(["[", '{"a":']))
@settings(max_examples=30)
def test_deep_nesting_is_a_value_error_naming_the_limit(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    with pytest.raises(ValueError, match=f"deeper than {MAX_DEPTH}"):
        loads_untrusted(opener * depth + "1" + closer * depth)


def test_brackets_inside_strings_do_not_count_and_limits_hold() -> None:
    assert nesting_depth('["[[[[", {"k": "]]]"}]') == 2
    assert loads_untrusted('["' + "[" * 10_000 + '"]') == ["[" * 10_000]
    with pytest.raises(ValueError, match="larger than"):
        loads_untrusted(b"[" + b"1," * 10 + b"1]", max_bytes=10)
    for bad in (b"NaN", b"[Infinity]", b"\xff\xfe", b'{"a": 1', b""):
        with pytest.raises(ValueError):
            loads_untrusted(bad)


def test_a_deeply_nested_dlq_value_is_shown_as_text_saying_why() -> None:
    doc = value_doc(b"[" * 50_000 + b"]" * 50_000)
    assert doc["kind"] == "text" and f"nested deeper than {MAX_DEPTH}" in doc["not_an_envelope"]
    json.dumps(doc, indent=2)  # what the console's pretty filter does: no RecursionError
