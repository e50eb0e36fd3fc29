"""W3C traceparent/tracestate built from and read into envelope fields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.bindings.tracecontext import (
    TRACESTATE_EXTENSION,
    TraceParent,
    parse_traceparent,
    traceparent_of,
    tracestate_of,
)
from app.envelope import new_envelope

hexs = lambda n: st.text("0123456789abcdef", min_size=n, max_size=n)  # noqa: E731


@given(hexs(32), hexs(16), st.integers(0, 255))
def test_format_and_parse_agree(trace_id, span_id, flags):
    env = new_envelope("t", b"", namespace="n")
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = trace_id, span_id, flags
    header = traceparent_of(env)
    if trace_id == "0" * 32 or span_id == "0" * 16:
        assert header is None
        return
    # only the flags W3C defines are propagated (sampled, random); unknown bits are dropped
    assert header == f"00-{trace_id}-{span_id}-{flags & 0x03:02x}"
    assert parse_traceparent(header) == TraceParent("00", trace_id, span_id, flags & 0x03)
    assert parse_traceparent(header.encode()) == TraceParent("00", trace_id, span_id, flags & 0x03)


@pytest.mark.parametrize("value", [
    None, "", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",            # too short
    "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",                   # upper case
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",                   # zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",                   # zero span id
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",                   # forbidden version
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",             # v00 has no extra
    b"\xff",
])
def test_invalid_traceparents_are_ignored(value):
    assert parse_traceparent(value) is None


def test_future_version_is_read_by_its_v00_prefix():
    tp = parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes-next")
    assert tp == TraceParent("01", "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1) and tp.sampled
    assert tp.to_header() == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_tracestate_from_extensions_only_when_valid():
    env = new_envelope("t", b"", namespace="n")
    assert tracestate_of(env) is None
    env.extensions[TRACESTATE_EXTENSION] = b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert tracestate_of(env) == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    for bad in (b"no-equals-sign", "caf\u00e9=1".encode(), b"a=1," * 40, b"x=" + b"y" * 600):
        env.extensions[TRACESTATE_EXTENSION] = bad
        assert tracestate_of(env) is None, bad
