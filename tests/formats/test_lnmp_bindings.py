"""LNMP transport bindings: Kafka `lnmp.*`, HTTP `X-LNMP-*`, gRPC `lnmp-*` (LNMP spec section 7)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import LnmpError
from app.formats import lnmp_bindings as b
from app.formats.lnmp import LnmpEnvelope

META = LnmpEnvelope(timestamp=1732373147000, source="auth-service", trace_id="abc-123", sequence=42)


def test_spec_section_7_examples() -> None:
    assert b.to_http_headers(META) == {"X-LNMP-Timestamp": "1732373147000", "X-LNMP-Source": "auth-service",
                                       "X-LNMP-Trace-ID": "abc-123", "X-LNMP-Sequence": "42"}
    assert b.to_kafka_headers(META) == [("lnmp.timestamp", b"1732373147000"), ("lnmp.source", b"auth-service"),
                                        ("lnmp.trace_id", b"abc-123"), ("lnmp.sequence", b"42")]
    assert b.to_grpc_metadata(META) == [("lnmp-timestamp", "1732373147000"), ("lnmp-source", "auth-service"),
                                        ("lnmp-trace-id", "abc-123"), ("lnmp-sequence", "42")]


def test_decoding_ignores_case_and_other_headers() -> None:
    headers = {"x-lnmp-source": "auth-service", "X-LNMP-SEQUENCE": "42", "Content-Type": "text/lnmp"}
    assert b.from_http_headers(headers) == LnmpEnvelope(source="auth-service", sequence=42)
    assert b.from_kafka_headers([("other", b"x")]) is None


def test_non_ascii_is_percent_encoded_for_http_and_grpc_only() -> None:
    meta = LnmpEnvelope(source="café 50%")
    assert b.to_http_headers(meta)["X-LNMP-Source"] == "caf%C3%A9%2050%25"
    assert b.to_grpc_metadata(meta) == [("lnmp-source", "caf%C3%A9%2050%25")]
    assert b.to_kafka_headers(meta) == [("lnmp.source", "café 50%".encode())]
    assert b.from_http_headers(b.to_http_headers(meta)) == meta


@pytest.mark.parametrize(("headers", "message"), [
    ([("lnmp.timestamp", b"yesterday")], "not an unsigned 64-bit decimal"),
    ([("lnmp.sequence", str(2**64).encode())], "not an unsigned 64-bit decimal"),
    ([("lnmp.source", b"a"), ("lnmp.source", b"b")], "appears twice"),
    ([("lnmp.source", b"\xff")], "not UTF-8"),
])
def test_strict_and_loose(headers: list[tuple[str, bytes]], message: str) -> None:
    with pytest.raises(LnmpError, match=message):
        b.from_kafka_headers(headers)
    notes: list[str] = []
    assert b.from_kafka_headers([*headers, ("lnmp.trace_id", b"t")], strict=False, notes=notes) == \
        LnmpEnvelope(trace_id="t", source="a" if message == "appears twice" else None)
    assert notes and "loose" in notes[0]


def test_any_headers_merges_bindings_first_wins() -> None:
    notes: list[str] = []
    meta = b.from_any_headers([("lnmp.source", b"kafka"), ("X-LNMP-Source", "http"), ("X-LNMP-Sequence", "5")],
                              notes=notes)
    assert meta == LnmpEnvelope(source="kafka", sequence=5)
    assert any("differs" in n for n in notes)


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
metas = st.builds(LnmpEnvelope, timestamp=st.none() | st.integers(0, 2**64 - 1), source=st.none() | _text,
                  trace_id=st.none() | _text, sequence=st.none() | st.integers(0, 2**64 - 1))


@settings(max_examples=200, deadline=None)
@given(meta=metas)
def test_round_trip_every_binding(meta: LnmpEnvelope) -> None:
    expected = meta if not meta.is_empty() else None
    assert b.from_kafka_headers(b.to_kafka_headers(meta)) == expected
    assert b.from_http_headers(b.to_http_headers(meta)) == expected
    assert b.from_grpc_metadata(b.to_grpc_metadata(meta)) == expected
    for _, v in b.to_grpc_metadata(meta) + list(b.to_http_headers(meta).items()):
        assert all(0x21 <= ord(c) <= 0x7E for c in v)  # header-safe printable ASCII
