"""The compiled security-record check (`prism_native.security_record`, wired in as
`signing._security_record` by app/native.py) against the Python one (`_py_security_record`):
for the same bytes and layout, the same record, inner records and scope, or the same
`PrismError` class and text (docs/signing.md, steps 2 and 3). On every byte string of the
conformance suite, in both layouts, and on generated envelopes with repeated, mistyped and
hostile security fields.

Locally these skip without the native module; under CI=true they fail (tests/support.require).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app.envelope import Layout, wire
from app.errors import PrismError
from app.security import signing
from tests.envelope.test_wire_native import _vector_bytes
from tests.support import require


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(native.ACTIVE and signing._security_record is not signing._py_security_record,
            f"the compiled security-record check is not active: {native.reason}")


def _outcome(fn: Any, data: bytes, lay: Layout, required: bool) -> Any:
    view = memoryview(data)
    try:
        records = wire._py_scan(view)
    except PrismError:
        return None  # no caller gets this far with bytes that do not walk
    try:
        return ("ok", fn(view, records, lay, required=required))
    except PrismError as exc:
        return ("error", type(exc), str(exc), exc.path, exc.hint)


def _same(data: bytes) -> list[Any]:
    seen = []
    for lay in Layout:
        for required in (True, False):
            expected = _outcome(signing._py_security_record, data, lay, required)
            assert _outcome(signing._security_record, data, lay, required) == expected, (data.hex(), lay, required)
            seen.append(expected)
    return seen


def test_the_conformance_vectors_locate_the_same_security_record() -> None:
    outcomes = [o for data in _vector_bytes() for o in _same(data) if o is not None]
    assert sum(o[0] == "ok" and o[1][2] != 0 for o in outcomes) > 300  # signed envelopes, scopes read
    assert sum(o[0] == "error" for o in outcomes) > 50  # unsigned, ambiguous and mistyped ones too


def _record(field: int, wt: int, body: bytes) -> bytes:
    tag = wire.encode_varint(field << 3 | wt)
    if wt == wire.LEN:
        return tag + wire.encode_varint(len(body)) + body
    if wt == wire.VARINT:
        return tag + wire.encode_varint(int.from_bytes(body[:9] or b"\0", "little"))
    return tag + (body + bytes(8))[: 8 if wt == wire.I64 else 4]


_WT = st.sampled_from([wire.VARINT, wire.LEN, wire.LEN, wire.I64, wire.I32])
_INNER = st.lists(st.tuples(st.integers(1, 16), _WT, st.binary(max_size=12)), max_size=8).map(
    lambda rs: b"".join(_record(f, wt, b) for f, wt, b in rs))
_SCOPE = st.integers(0, 2**70 - 1).map(lambda v: b"\x50" + wire.encode_varint(v))  # signature_scope, any width
_SECURITY = st.tuples(_INNER, st.one_of(st.just(b""), _SCOPE), _INNER).map(lambda t: b"".join(t))


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 99, 100]), _WT, st.binary(max_size=10)).map(
        lambda t: _record(*t)),
    _SECURITY.map(lambda body: _record(2, wire.LEN, body)),  # reviewed security
    _SECURITY.map(lambda body: _record(4, wire.LEN, body)),  # draft security
), max_size=6))
def test_generated_envelopes_locate_the_same_security_record(records: list[bytes]) -> None:
    _same(b"".join(records))


@pytest.mark.parametrize("data", [
    b"\x12\x00" * 2,  # two reviewed security records
    b"\x12\x04\x22\x00\x22\x00",  # signature twice
    b"\x12\x02\x20\x01",  # signature as a varint
    b"\x12\x0b\x50" + wire.encode_varint(2**70 - 1),  # a 70-bit scope
    b"\x12\x03\x0a\x05a",  # a security record whose inner walk fails
    b"\x10\x01",  # field 2 as a varint: the wrong wire type at the top level
    b"",
])
def test_hostile_security_records_give_the_same_typed_error(data: bytes) -> None:
    _same(data)
