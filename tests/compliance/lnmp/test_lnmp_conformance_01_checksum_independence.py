"""LNMP envelope spec section 11, item 1: the envelope preserves core determinism.

Section 6.1: SemanticChecksum(Record) is a function of the record's fields only. LNMP's own
SemanticChecksum lives in LNMP core, which Prism does not ship, so this test defines one with
the property that matters - it depends on the record's *fields*, not on their order - and shows
that wrapping a record in an envelope (binary TLV or `#ENVELOPE` text, any metadata, and through
a Prism envelope and back) never changes it.
"""

from __future__ import annotations

import re
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from app.formats import lnmp
from app.formats import lnmp_envelope as le
from app.formats.detect import normalize

_FIELD = re.compile(r"F(\d+)(?::\w+)?=(.*)")


def semantic_checksum(record: bytes | memoryview) -> int:
    """CRC32 over the record's fields sorted by field id (text records), or over the bytes
    (binary records). Field order does not matter; envelope metadata is not an input."""
    raw = bytes(record)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return zlib.crc32(raw)
    fields = []
    for part in re.split(r"[;\n]", text):
        part = part.strip()
        if not part or part.startswith("#"):
            continue
        m = _FIELD.fullmatch(part)
        if m is None:
            return zlib.crc32(raw)
        fields.append((int(m.group(1)), m.group(2)))
    return zlib.crc32("\n".join(f"{fid}={v}" for fid, v in sorted(fields)).encode())


text_records = st.lists(st.tuples(st.integers(0, 65535), st.from_regex(r"[A-Za-z0-9_.\-]{1,12}", fullmatch=True)),
                        min_size=1, max_size=6, unique_by=lambda f: f[0]).map(
    lambda fs: "\n".join(f"F{fid}={v}" for fid, v in fs).encode())
binary_records = st.binary(min_size=0, max_size=64)
metadata = st.builds(
    lnmp.LnmpEnvelope,
    timestamp=st.none() | st.integers(1, 2**63 - 1),
    source=st.none() | st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20),
    trace_id=st.none() | st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=40),
    sequence=st.none() | st.integers(0, 2**64 - 1),
)


def test_checksum_ignores_field_order() -> None:
    assert semantic_checksum(b"F12=14532\nF7=1") == semantic_checksum(b"F7=1;F12=14532")
    assert semantic_checksum(b"F12=14532\nF7=1") != semantic_checksum(b"F12=14533\nF7=1")


@settings(max_examples=150, deadline=None)
@given(record=text_records, meta=metadata)
def test_text_envelope_does_not_change_the_record_checksum(record: bytes, meta: lnmp.LnmpEnvelope) -> None:
    before = semantic_checksum(record)
    wire = lnmp.encode_text(record, meta)
    decoded = lnmp.decode_text(wire)
    assert decoded.envelope == (meta if not meta.is_empty() else None)
    assert semantic_checksum(decoded.record) == before
    assert bytes(decoded.record) == record


@settings(max_examples=150, deadline=None)
@given(record=binary_records, meta=metadata)
def test_binary_envelope_does_not_change_the_record_checksum(record: bytes, meta: lnmp.LnmpEnvelope) -> None:
    before = semantic_checksum(record)
    wire = lnmp.encode_container(lnmp.Container(record=record, envelope=meta))
    decoded = lnmp.decode_container(wire)
    assert semantic_checksum(decoded.record) == before
    assert bytes(decoded.record) == record


@settings(max_examples=60, deadline=None)
@given(record=text_records, a=metadata, b=metadata)
def test_different_envelopes_same_record_same_checksum(record: bytes, a: lnmp.LnmpEnvelope,
                                                      b: lnmp.LnmpEnvelope) -> None:
    ra = lnmp.decode_text(lnmp.encode_text(record, a)).record
    rb = lnmp.decode_container(lnmp.encode_container(lnmp.Container(record=record, envelope=b))).record
    assert semantic_checksum(ra) == semantic_checksum(rb) == semantic_checksum(record)


@settings(max_examples=60, deadline=None)
@given(record=text_records, meta=metadata)
def test_checksum_survives_prism_round_trip(record: bytes, meta: lnmp.LnmpEnvelope) -> None:
    """LNMP -> Prism envelope -> LNMP: the record inside is checksum-identical."""
    wire = lnmp.encode_container(lnmp.Container(record=record, envelope=meta))
    env = normalize(wire, topic="t", namespace="ns", now_ms=1).envelope
    again = lnmp.decode_container(le.to_lnmp(env, form="binary")).record
    assert semantic_checksum(again) == semantic_checksum(record)
