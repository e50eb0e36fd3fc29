"""The payload check's decode (app/schema/payload_check.py `_orjson_loads`): wherever orjson gives
a value, it is `json.loads`' value - same types, same key order, same float bits - so the plan
walk, the repeated-key count and `ParseDict`'s wording cannot tell which decoder ran. Whatever
orjson refuses or might read differently (NaN, Infinity, overflowing numbers, lone surrogates,
integer literals beyond 64 bits) is left to `json.loads`, as before. Property tests over number
literals, floats, documents, raw bytes and mutated documents; the validator's own verdicts
against `json_format.Parse` are in test_payload_check_fast.py (which now runs this decode)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.schema import payload_check
from app.schema.payload_check import _UNLOADED, _load_json_plain, _orjson_loads

PROPERTY = settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type all the way down; floats bit for bit (the sign of -0.0 too)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def json_value(payload: bytes) -> Any:
    try:
        return json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return _UNLOADED


def agrees(payload: bytes) -> None:
    """orjson's value, where it gives one, is json's; `_load_json_plain` is json's in every case."""
    fast = _orjson_loads(payload)
    slow = json_value(payload)
    if fast is not _UNLOADED:
        assert slow is not _UNLOADED and same(fast, slow), (payload, fast, slow)
    doc, text = _load_json_plain(payload)
    assert (doc is _UNLOADED and slow is _UNLOADED) or same(doc, slow), (payload, doc, slow)
    assert text is None if doc is _UNLOADED else text == payload.decode("utf-8")


DIGITS = st.text("0123456789", min_size=1, max_size=24)
EXPONENT = st.builds(lambda e, sign, d: e + sign + d, st.sampled_from("eE"), st.sampled_from(["", "+", "-"]),
                     st.text("0123456789", min_size=1, max_size=4))
NUMBER_LITERALS = st.builds(lambda sign, whole, frac, exp: sign + (whole.lstrip("0") or "0") + frac + exp,
                            st.sampled_from(["", "-"]), DIGITS,
                            st.one_of(st.just(""), DIGITS.map(lambda d: "." + d)), st.one_of(st.just(""), EXPONENT))
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@PROPERTY
@given(NUMBER_LITERALS)
def test_number_literals(literal: str) -> None:
    agrees(literal.encode())


@PROPERTY
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_are_read_to_the_same_bits(x: float) -> None:
    agrees(repr(x).encode())
    agrees(json.dumps({"total": x, "items": [x, -x]}).encode())


@PROPERTY
@given(VALUES, st.booleans())
def test_documents(value: Any, ensure_ascii: bool) -> None:
    agrees(json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass"))


@PROPERTY
@given(st.binary(max_size=48))
def test_arbitrary_bytes(data: bytes) -> None:
    agrees(data)


@PROPERTY
@given(VALUES, st.data())
def test_mutated_documents(value: Any, data: st.DataObject) -> None:
    text = bytearray(json.dumps(value).encode("utf-8", "surrogatepass"))
    for _ in range(data.draw(st.integers(1, 3))):
        if not text:
            break
        i = data.draw(st.integers(0, len(text) - 1))
        text[i] = data.draw(st.sampled_from(b' \t\n\r\x0c\x00"\\/:,[]{}0123456789.eE+-tfnaul\x7f\xc3\xa9\xff\xed'))
    agrees(bytes(text))


@pytest.mark.parametrize("payload", [
    b"18446744073709551615",  # 2**64 - 1: an int for both
    b"18446744073709551616",  # 2**64: orjson would read a float
    b"-9223372036854775809",  # -2**63 - 1: 19 digits, orjson would read a float
    b'{"big": 123456789012345678901234567890}',
    b"NaN", b"-Infinity", b"1e400", b"-1.7976931348623157e309",  # json reads them, orjson does not
    b'"\\ud800"', b'{"sku": "a\\udfffb"}',  # lone surrogates: json keeps them, orjson refuses
    b'{"a": 1, "a": 2}', b"\xef\xbb\xbf{}", b'"\xed\xa0\x80"', b"[" * 1100 + b"]" * 1100, b"-0", b"-0.0",
])
def test_named_edges(payload: bytes) -> None:
    agrees(payload)


def test_what_orjson_may_read_differently_goes_to_json() -> None:
    assert _orjson_loads(b'{"huge": 18446744073709551616}') is _UNLOADED  # the 19-digit guard
    assert _orjson_loads(b'{"id": "1234567890123456789"}') is _UNLOADED  # digits in a string: json too, harmless
    assert _orjson_loads(b'{"total": NaN}') is _UNLOADED
    assert _load_json_plain(b'{"huge": 18446744073709551616}')[0] == {"huge": 18446744073709551616}
    assert _orjson_loads(b'{"qty": 3, "total": 19.99}') == {"qty": 3, "total": 19.99}


def test_without_orjson_json_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client wheel without its `schema` extra has no orjson: the same values from json alone."""
    monkeypatch.setattr(payload_check, "_orjson", None)
    assert _orjson_loads(b'{"qty": 3}') is _UNLOADED
    assert _load_json_plain(b'{"qty": 3}') == ({"qty": 3}, '{"qty": 3}')
