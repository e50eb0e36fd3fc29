"""Unit tests of the LNMP codec beyond the conformance list (tests/compliance/lnmp)."""

from __future__ import annotations

import pytest

from app.errors import LnmpError
from app.formats import lnmp


def test_is_container_is_specific() -> None:
    assert lnmp.is_container(b"LNMP\x01\x02\x00\x00\x00\x00\x00\x00")
    assert not lnmp.is_container(b"LNMP is a protocol for LLMs")  # version byte ' ' is not 0x01
    assert not lnmp.is_container(b"LNMP\x01\x09\x00\x00\x00\x00\x00\x00")  # unknown mode
    assert not lnmp.is_container(b"LNMP\x01\x02")


def test_text_header_in_a_large_record_is_found_without_copying_it_all() -> None:
    record = b"F1=" + b"x" * 300_000
    wire = b"#ENVELOPE sequence=3\n" + record
    msg = lnmp.decode_text(wire)
    assert msg.envelope == lnmp.LnmpEnvelope(sequence=3)
    assert isinstance(msg.record, memoryview) and msg.record.obj is wire and msg.record == record


def test_header_without_newline_in_a_large_input() -> None:
    wire = b"#ENVELOPE source=" + b"y" * 20_000
    msg = lnmp.decode_text(wire)
    assert msg.envelope == lnmp.LnmpEnvelope(source="y" * 20_000) and bytes(msg.record) == b""


def test_delta_container_needs_its_fixed_metadata_before_the_chain() -> None:
    with pytest.raises(LnmpError, match="10 bytes of fixed metadata"):
        lnmp.encode_container(lnmp.Container(record=b"", envelope=lnmp.LnmpEnvelope(sequence=1), mode=lnmp.Mode.DELTA))
    # declared with bit 15 but shorter than the fixed part: strict error, loose ignores the envelope
    wire = b"LNMP\x01\x04\x80\x00\x00\x00\x00\x04abcdREC"
    with pytest.raises(LnmpError, match="shorter than mode 0x04"):
        lnmp.decode_container(wire)
    c = lnmp.decode_container(wire, strict=False)
    assert c.envelope is None and bytes(c.record) == b"REC"


def test_encoder_rejects_bad_container_fields() -> None:
    with pytest.raises(LnmpError, match="without bit 15"):
        lnmp.encode_container(lnmp.Container(record=b"", flags=0x8000))
    with pytest.raises(LnmpError, match="given twice"):
        lnmp.encode_tlv(lnmp.LnmpEnvelope(source="a", extra_tlv=((0x11, b"b"),)))
    with pytest.raises(LnmpError, match="extra key"):
        lnmp.encode_text_header(lnmp.LnmpEnvelope(extra_keys=(("source", "x"),)))
    with pytest.raises(LnmpError, match="extra key"):
        lnmp.encode_text_header(lnmp.LnmpEnvelope(extra_keys=(("a b", "x"),)))


def test_parse_text_header_requires_the_keyword() -> None:
    with pytest.raises(LnmpError, match="#ENVELOPE"):
        lnmp.parse_text_header("#ENVELOPEX a=b")
