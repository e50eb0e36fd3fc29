"""The compiled record walk (`prism_native.scan`, app/native.py) against the Python one
(`wire._py_scan`): the same tuples for every input, and for bad input the same `PrismError`
class with the same text. Run on every byte string of the shared conformance vectors (and the
records inside them), on generated and on hostile inputs.

The native module is optional (a machine without cargo runs pure Python), so locally these
tests skip without it; under CI=true a missing module FAILS them (the CI machine builds it
with `make native`), as `make test-go` does for Go.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app.envelope import wire
from app.errors import PrismError
from tests.support import require

ROOT = Path(__file__).resolve().parents[2]

try:
    import prism_native  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    prism_native = None


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(prism_native is not None, "prism_native is not built (make native: needs cargo)")


def _outcome(fn: Any, buf: Any, start: int = 0, end: int | None = None) -> Any:
    try:
        return ("ok", fn(buf, start, end))
    except PrismError as exc:
        return ("error", type(exc), str(exc))


def _native(buf: Any, start: int = 0, end: int | None = None) -> list[tuple[int, int, int, int, int]]:
    """The compiled walk with `app/native.py`'s wording of its faults (what `wire.scan` is when active)."""
    try:
        return prism_native.scan(buf, start, end)  # type: ignore[no-any-return, union-attr]
    except prism_native.WireFault as exc:  # type: ignore[union-attr]
        raise native.scan_fault(exc.args) from None


def _same(buf: bytes, start: int = 0, end: int | None = None) -> Any:
    expected = _outcome(wire._py_scan, buf, start, end)
    assert _outcome(_native, buf, start, end) == expected
    assert _outcome(_native, memoryview(buf), start, end) == expected
    assert _outcome(_native, bytearray(buf), start, end) == expected
    return expected


def _vector_bytes() -> list[bytes]:
    """Every hex string of the conformance suite that decodes to bytes (envelopes, signed
    messages, negative vectors, keys: the walk must agree on all of them, valid or not)."""
    found: list[bytes] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and key.endswith("hex"):
                    with contextlib.suppress(ValueError):
                        found.append(bytes.fromhex(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for path in sorted((ROOT / "conformance").rglob("*.json")):
        walk(json.loads(path.read_text()))
    return found


def test_the_conformance_vectors_walk_the_same_at_every_level() -> None:
    vectors = _vector_bytes()
    assert len(vectors) > 300
    ok = errors = 0
    for data in vectors:
        pending = [(0, len(data), 0)]
        while pending:  # the records inside LEN values too, three levels down
            start, end, depth = pending.pop()
            outcome = _same(data, start, end)
            if outcome[0] == "error":
                errors += 1
                continue
            ok += 1
            if depth < 3:
                pending.extend((r[3], r[4], depth + 1) for r in outcome[1] if r[1] == wire.LEN and r[4] > r[3])
    assert ok > 1000 and errors > 100  # both sides of the contract were exercised


_RECORD = st.one_of(
    st.tuples(st.integers(1, 2**29 - 1), st.just(wire.VARINT), st.integers(0, 2**64 - 1)).map(
        lambda t: wire.encode_varint(t[0] << 3) + wire.encode_varint(t[2])),
    st.tuples(st.integers(1, 2**29 - 1), st.binary(max_size=300)).map(
        lambda t: wire.encode_varint(t[0] << 3 | wire.LEN) + wire.encode_varint(len(t[1])) + t[1]),
    st.tuples(st.integers(1, 2**29 - 1), st.sampled_from([1, 5])).map(
        lambda t: wire.encode_varint(t[0] << 3 | t[1]) + bytes(8 if t[1] == 1 else 4)),
)
_HOSTILE_TAIL = st.one_of(
    st.binary(max_size=24),
    st.integers(0, 2**70 - 1).map(wire.encode_varint),  # keys and lengths past 64 bits
    st.just(b"\xff" * 10 + b"\x01"), st.just(b"\x80" * 11), st.sampled_from([b"\x0b", b"\x0c", b"\x0e", b"\x0f"]),
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_RECORD, max_size=8), _HOSTILE_TAIL, st.data())
def test_generated_records_with_hostile_tails_walk_the_same(records: list[bytes], tail: bytes, data: Any) -> None:
    buf = b"".join(records) + tail
    _same(buf)
    start = data.draw(st.integers(0, len(buf)))
    _same(buf, start, data.draw(st.integers(start, len(buf))))


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_walk_the_same(buf: bytes) -> None:
    _same(buf)


@pytest.mark.parametrize("buf", [
    wire.encode_varint(2**70 - 1),  # a 70-bit key: field number beyond 2**64
    b"\x0a" + wire.encode_varint(2**70 - 1),  # a length beyond 2**64
    b"\x0a" + wire.encode_varint(2**64 + 1),
    b"\x08" + b"\xff" * 10,  # a value varint that never ends within 10 bytes
    b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x00",  # a 10-byte zero length
    b"\xf8\xff\xff\xff\x0f\x00",  # field 2**29 - 1... + 1: over the maximum
    b"\xf8\xff\xff\xff\x01\x00",  # field 2**29 - 1 exactly
    b"",
])
def test_hostile_inputs_give_the_same_typed_error_never_a_panic(buf: bytes) -> None:
    expected = _same(buf)
    # through the wired-in `wire.scan`: a typed error, as the Python walk raises - never
    # PanicException (a BaseException that `except PrismError` would not catch)
    assert _outcome(wire.scan, buf) == expected


def test_bounds_outside_the_buffer_are_an_index_error_not_a_crash() -> None:
    with pytest.raises(IndexError):
        prism_native.scan(b"\x08\x01", 0, 3)  # type: ignore[union-attr]
    with pytest.raises(IndexError):
        prism_native.scan(b"\x08\x01", -1)  # type: ignore[union-attr]
    assert prism_native.scan(b"\x08\x01", 2, 1) == [] == wire._py_scan(b"\x08\x01", 2, 1)  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        prism_native.scan("not bytes")  # type: ignore[union-attr]


def _status_in_child(env: dict[str, str]) -> dict[str, Any]:
    code = "import json, app.native as n, app.envelope.wire as w; " \
           "print(json.dumps({**n.status(), 'python': w.scan is w._py_scan}))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_the_choice_is_made_once_and_prism_native_0_forces_python() -> None:
    on = _status_in_child({"PRISM_NATIVE": "1"})
    assert on["active"] is True and on["python"] is False and f"ABI {native.ABI}" in on["detail"]
    off = _status_in_child({"PRISM_NATIVE": "0"})
    assert off == {"active": False, "detail": "off (PRISM_NATIVE=0)", "python": True}
