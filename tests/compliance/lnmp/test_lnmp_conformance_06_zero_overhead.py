"""LNMP envelope spec section 11, item 6: zero overhead when the envelope is unused.

Without envelope metadata the output is the bare record, byte for byte: for text, the record
object itself is returned (not even copied); for binary, the container is exactly the container
without an extension block (bit 15 clear, no TLV bytes). Decoding an envelope-less message
returns the record without copying it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.formats import lnmp

RECORD = b"F7=1;F12=14532"


def bare_container(record: bytes, mode: int = 0x02, metadata: bytes = b"") -> bytes:
    return b"LNMP" + bytes([0x01, mode]) + b"\x00\x00" + len(metadata).to_bytes(4, "big") + metadata + record


def test_text_without_envelope_is_the_record_itself() -> None:
    assert lnmp.encode_text(RECORD, None) is RECORD
    assert lnmp.encode_text(RECORD, lnmp.LnmpEnvelope()) is RECORD
    assert lnmp.decode_text(RECORD).record is RECORD


def test_binary_without_envelope_is_the_bare_container() -> None:
    assert lnmp.encode_container(lnmp.Container(record=RECORD)) == bare_container(RECORD)
    assert lnmp.encode_container(lnmp.Container(record=RECORD, envelope=lnmp.LnmpEnvelope())) == bare_container(RECORD)
    opaque = bytes(range(16))  # a binary container's own 16-byte metadata stays opaque
    c = lnmp.decode_container(bare_container(RECORD, metadata=opaque))
    assert c.envelope is None and c.mode_metadata == opaque
    assert lnmp.encode_container(c) == bare_container(RECORD, metadata=opaque)


def test_decoding_does_not_copy_the_record() -> None:
    wire = bare_container(RECORD)
    c = lnmp.decode_container(wire)
    assert isinstance(c.record, memoryview) and c.record.obj is wire and c.record == RECORD


@settings(max_examples=200, deadline=None)
@given(record=st.binary(max_size=256).filter(lambda r: not r.startswith(b"#ENVELOPE")),
       mode=st.sampled_from(list(lnmp.Mode)))
def test_unused_envelope_costs_nothing(record: bytes, mode: int) -> None:
    assert lnmp.encode_text(record, None) is record
    assert lnmp.encode_container(lnmp.Container(record=record, mode=mode)) == bare_container(record, mode)
    assert len(lnmp.encode_container(lnmp.Container(record=record, mode=mode))) == 12 + len(record)
