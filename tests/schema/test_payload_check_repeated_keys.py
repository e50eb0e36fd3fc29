"""The repeated-key proof of app/schema/payload_check.py (`_no_repeated_keys`): the validator decodes
a JSON payload with the plain C decoder (which keeps the last of two equal keys) and shows from a
count over the text that no object named a key twice; only when the count cannot show it does
Parse's hooked decode decide. The proof may say "cannot tell" as often as it likes, but it must
never say "no repeated key" for a text Parse's `_DuplicateChecker` refuses - that would accept a
payload the old code (and `json_format.Parse`) rejects.

Texts are written here, not by `json.dumps` (which cannot repeat a key): repeated keys at every
depth, with the same or another value, keys spelled with `\\u` escapes ("a" vs "\\u0061"), colons
raw and escaped (`\\u003a`, `\\u003A`) in keys and values, escaped backslashes before a literal
"u003a", and random whitespace; then well-typed orders of the fast path's schema with a key
repeated somewhere (the plain decode of those is a valid order - only the proof stands between
them and acceptance)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.schema import payload_check
from app.schema.payload_check import _no_duplicates, _no_repeated_keys, validator_for
from app.schema.resolve import build_resolved
from tests.schema.test_payload_check_fast import ORDERS, OTHER, PROTO, _check, _reference


class _Obj(list):  # type: ignore[type-arg]
    """An object as its members in order, repeats allowed (a dict could not repeat a key)."""


KEYS = ["a", "b", ":", "a:b", "order_id", "orderId", "items", "sku", "qty", "tags", "\u00e9", "k\\u003a"]
STRINGS = st.one_of(st.text(alphabet="ab:\\\"u03A\u00e9 ", max_size=8),
                    st.sampled_from([":", "::", "\\u003a", "T10:00:00Z", "a\\", "\ud800"]))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), STRINGS)
#: well-typed orders of the fast path's schema whose strings are full of colons (the proof counts them)
COLON_TEXT = st.text(alphabet="a:\u00e9\\\"", max_size=6)
COLON_ITEM = st.deferred(lambda: st.fixed_dictionaries({}, optional={
    "sku": COLON_TEXT, "qty": st.integers(-3, 3), "parts": st.lists(COLON_ITEM, max_size=2)}))
COLON_ORDERS = st.fixed_dictionaries({}, optional={
    "order_id": COLON_TEXT, "customerId": COLON_TEXT, "items": st.lists(COLON_ITEM, max_size=4),
    "tags": st.lists(COLON_TEXT, max_size=3), "gift": st.booleans(), "total": st.floats(-1e9, 1e9)})
TREES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=5).map(_Obj)), max_leaves=25)


def _string(s: str, rnd: random.Random) -> str:
    """`s` as a JSON string literal, each character written raw or as a `\\u` escape in either
    case - "a" and "\\u0061", ":" and "\\u003a"/"\\u003A" decode to the same key or value."""
    out = ['"']
    for ch in s:
        if ch in '"\\' or ord(ch) < 0x20:
            out.append(json.dumps(ch)[1:-1] if rnd.random() < 0.5 else f"\\u{ord(ch):04x}")
        elif rnd.random() < 0.25 and ord(ch) < 0x10000:
            code = f"{ord(ch):04x}"
            out.append("\\u" + (code.upper() if rnd.random() < 0.5 else code))
        else:
            out.append(ch)
    return "".join(out) + '"'


def _write(tree: Any, rnd: random.Random, repeat: float = 0.0) -> str:
    """JSON text of `tree`; with `repeat`, an object member is now and then written twice (the
    same key, spelled maybe differently, with the same value or another one)."""
    ws = lambda: rnd.choice(["", "", " ", "\n\t "])  # noqa: E731
    if isinstance(tree, (_Obj, dict)):
        members = list(tree) if isinstance(tree, _Obj) else list(tree.items())
        parts = []
        for k, v in members:
            parts.append(ws() + _string(k, rnd) + ws() + ":" + ws() + _write(v, rnd, repeat))
            if repeat and rnd.random() < repeat:
                other = v if rnd.random() < 0.5 else rnd.choice([1, "x", True, None, [], {}])
                parts.insert(rnd.randrange(len(parts) + 1),
                             ws() + _string(k, rnd) + ":" + ws() + _write(other, rnd, 0.0))
        return "{" + ",".join(parts) + ws() + "}"
    if isinstance(tree, list):
        return "[" + ",".join(ws() + _write(v, rnd, repeat) for v in tree) + ws() + "]"
    if isinstance(tree, str):
        return _string(tree, rnd)
    return json.dumps(tree)


def _repeats(text: str) -> bool:
    """Parse's verdict: does some object of `text` name a key twice (its `_DuplicateChecker`)?"""
    try:
        json.loads(text, object_pairs_hook=_no_duplicates)
    except payload_check._DuplicateKey:
        return True
    return False


def _prove(text: str) -> bool:
    """What the validator does: the plain decode, then the count (raises when not JSON)."""
    return _no_repeated_keys(json.loads(text), text)


@settings(max_examples=1500, deadline=None)
@given(TREES, st.integers(0, 2**32), st.sampled_from([0.0, 0.1, 0.4]))
def test_never_shows_a_text_with_a_repeated_key_free_of_them(tree: Any, seed: int, repeat: float) -> None:
    text = _write(tree, random.Random(seed), repeat)
    try:
        proven = _prove(text)
    except ValueError:  # a lone surrogate escape next to another can still be valid; others not JSON
        return
    if proven:
        assert not _repeats(text), text


@settings(max_examples=600, deadline=None)
@given(TREES, st.integers(0, 2**32), st.sampled_from([0.1, 0.4]))
def test_the_validator_says_what_parse_says_on_repeated_keys(tree: Any, seed: int, repeat: float) -> None:
    payload = _write(tree, random.Random(seed), repeat).encode("utf-8", "surrogatepass")
    _check(PROTO, payload)
    _check(OTHER, payload)


@settings(max_examples=800, deadline=None)
@given(st.one_of(ORDERS, COLON_ORDERS), st.integers(0, 2**32), st.sampled_from([0.0, 0.05, 0.3]))
def test_valid_orders_with_a_repeated_key_get_parses_answer(doc: dict, seed: int, repeat: float) -> None:
    """The dangerous shape: after the plain decode a repeated key is gone and the order fits the
    schema; the proof must send it to Parse, which refuses it."""
    text = _write(doc, random.Random(seed), repeat)
    _check(PROTO, text.encode("utf-8", "surrogatepass"))
    if _repeats(text):
        assert not _prove(text), text


@settings(max_examples=400, deadline=None)
@given(st.one_of(ORDERS, COLON_ORDERS))
def test_the_walks_count_is_the_proofs_count(doc: dict) -> None:
    """`_walk_top` sums keys and string colons while it checks; for every document it accepts
    that sum is the one `_no_repeated_keys` would count itself."""
    v = validator_for(build_resolved(PROTO, "protobuf", url="u", version="v1", message="fast.Order"))
    assert v is not None
    plan = payload_check._json_plan(_reference(PROTO).DESCRIPTOR)
    assert plan is not None
    text = json.dumps(doc)
    value = json.loads(text)
    verdict, counted = payload_check._walk_top(value, plan)
    if verdict is True:
        assert _no_repeated_keys(value, text, counted) == _no_repeated_keys(value, text) is True


def test_documents_without_repeats_are_shown_free_by_the_count() -> None:
    """The point of the count: ordinary documents, colons and all, never take the hooked decode."""
    for doc in ({"order_id": "2026-11-29T10:00:00Z", "items": [{"sku": "a:b", "qty": 1}] * 30},
                {"a": {"b": {"c": [1, {"d": "::"}]}}}, [], "x:y", 1, {"\u00e9": "\u00e9"}):
        text = json.dumps(doc)
        assert _prove(text) and _prove(json.dumps(doc, ensure_ascii=False)), text


def test_valid_orders_with_colons_never_take_the_hooked_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk counts the colons of the strings it checks, so a timestamp or a URL in an order
    does not send it to Parse's decode."""
    v = validator_for(build_resolved(PROTO, "protobuf", url="u", version="v3", message="fast.Order"))
    calls: list[bytes] = []
    monkeypatch.setattr(payload_check, "_load_json", lambda p: calls.append(p))
    doc = {"order_id": "2026-11-29T10:00:00Z", "customerId": "urn:c:1", "tags": ["a:b", "::"],
           "items": [{"sku": f"s:{k}", "qty": k, "parts": [{"sku": "p:q"}]} for k in range(30)]}
    for text in (json.dumps(doc), json.dumps(doc, indent=2), json.dumps(doc, separators=(",", ":"))):
        assert v(text.encode(), "application/json") == []
    assert calls == []


def test_named_hostile_texts() -> None:
    """Each would be accepted by a count that forgot one of the proof's terms."""
    cases = [
        '{"a": 1, "a": 1}',  # the plain decode is {"a": 1}: only the count sees the repeat
        '{"a": 1, "\\u0061": 1}',  # the same key, spelled twice
        '{"a": "\\u003a", "b": 1, "b": 2}',  # an escaped colon in a value makes up for the lost key
        '{"a": "\\u003A", "b": 1, "b": 2}',
        '{"\\u003a": 1, ":": 2}',  # keys that decode to a colon
        '{"a": "\\\\u003a", "b": 1, "b": 2}',  # an escaped backslash before a literal u003a
        '{"items": [{"sku": "s", "qty": 1, "qty": 1}]}',  # one level down
        '{"items": [{"sku": "s"}], "items": [{"sku": "s"}]}',  # the overwritten value held an object
        '{"a": {"b": {}}, "a": {"b": {}}}',
        '{"x": [[[{"k": 1, "k": 2}]]]}',
        '{"order_id": "a:b", "order_id": "a:b"}',
        '{"order_id": "a:b", "gift": true, "gift": true}',  # a string colon counted twice would hide it
        '{"items": [{"sku": "a:b", "qty": 1, "qty": 1}]}',
        '{"tags": ["a:b"], "gift": true, "gift": true}',
        '{"order_id": "\\u003a", "gift": true, "gift": true}',
    ]
    for text in cases:
        assert _repeats(text)
        assert not _prove(text), text
        _check(PROTO, text.encode())
    for payload in (b'\xef\xbb\xbf{"order_id": "a"}', b'"\\ud800"', b'{"order_id": "\\ud800"}',
                    b'[' * 5000 + b']' * 5000, b'{"a":' * 3000 + b'1' + b'}' * 3000, b'NaN', b'{"total": Infinity}',
                    b'{"total": 1e400}', b'{"order_id": "a"} x', b' {"order_id": "a"}\n'):
        _check(PROTO, payload)
    deep = b"[]"  # an empty list past the fast path's depth, and objects past it
    for _ in range(40):
        deep = b'[{"parts": ' + deep + b"}]"
    _check(PROTO, b'{"items": ' + deep + b"}")
    _check(PROTO, b'{"items": ' + deep.replace(b"[]", b'[{"sku": "a", "sku": "a"}]') + b"}")
