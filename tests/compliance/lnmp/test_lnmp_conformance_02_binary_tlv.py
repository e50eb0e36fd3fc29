"""LNMP envelope spec section 11, item 2: encodes/decodes the binary TLV format correctly
(sections 4.1-4.3), against bytes written out by hand from the spec, not by our encoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import LnmpError
from app.formats import lnmp

TS = 1732373147000  # 2024-11-23T14:45:47Z, the spec's example time
TS_BYTES = bytes.fromhex("00000193597C6D78")
SECTION_4_2_CHAIN = (
    bytes.fromhex("100008") + TS_BYTES
    + bytes.fromhex("11000C") + b"auth-service"
    + bytes.fromhex("12000B") + b"trace-abc-1"
)


def test_timestamp_constant_is_right() -> None:
    assert int.from_bytes(TS_BYTES, "big") == TS


def test_encode_matches_hand_written_chain() -> None:
    env = lnmp.LnmpEnvelope(timestamp=TS, source="auth-service", trace_id="trace-abc-1")
    assert lnmp.encode_tlv(env) == SECTION_4_2_CHAIN


def test_decode_hand_written_chain() -> None:
    env = lnmp.decode_tlv(SECTION_4_2_CHAIN)
    assert env == lnmp.LnmpEnvelope(timestamp=TS, source="auth-service", trace_id="trace-abc-1")


def test_sequence_is_u64_big_endian() -> None:
    chain = bytes.fromhex("130008") + (42).to_bytes(8, "big")
    assert lnmp.decode_tlv(chain).sequence == 42
    assert lnmp.encode_tlv(lnmp.LnmpEnvelope(sequence=42)) == chain


def test_container_header_layout() -> None:
    record = b"\x04\x00\x01rec"
    wire = lnmp.encode_container(lnmp.Container(
        record=record, envelope=lnmp.LnmpEnvelope(timestamp=TS, source="auth-service", trace_id="trace-abc-1")))
    expected = (b"LNMP" + bytes([0x01, 0x02]) + bytes.fromhex("8000") + len(SECTION_4_2_CHAIN).to_bytes(4, "big")
                + SECTION_4_2_CHAIN + record)
    assert wire == expected
    c = lnmp.decode_container(expected)
    assert bytes(c.record) == record and c.mode == lnmp.Mode.BINARY and c.flags == 0
    assert c.envelope == lnmp.LnmpEnvelope(timestamp=TS, source="auth-service", trace_id="trace-abc-1")


def test_appendix_a_as_printed_is_rejected_and_the_corrected_one_decodes() -> None:
    """Appendix A declares metadata_length 31 (0x1F) for a 38-byte chain and a timestamp value
    that is not 1732373147000. Read strictly, its TLV chain is truncated."""
    chain = (bytes.fromhex("100008") + bytes.fromhex("0000018C9A3B2F28")
             + bytes.fromhex("11000C") + b"auth-service" + bytes.fromhex("120009") + b"abc-123-x")
    assert len(chain) == 38
    printed = b"LNMP" + bytes([0x01, 0x02]) + bytes.fromhex("8000") + bytes.fromhex("0000001F") + chain + b"REC"
    with pytest.raises(LnmpError, match="claims 9 bytes"):
        lnmp.decode_container(printed)
    fixed = b"LNMP" + bytes([0x01, 0x02]) + bytes.fromhex("8000") + (38).to_bytes(4, "big") + chain + b"REC"
    c = lnmp.decode_container(fixed)
    assert c.envelope is not None and c.envelope.timestamp == 1703394619176  # 2023-12-24, not the comment's value
    assert c.envelope.trace_id == "abc-123-x" and bytes(c.record) == b"REC"


def test_appendix_a_as_printed_loose_mode_returns_timestamp_source_and_trace_id() -> None:
    """Appendix A's container (metadata_length 31 for a 38-byte self-delimiting chain): strict
    mode refuses it, loose mode gives back every TLV that parses whole - its timestamp, source
    and trace id - with a warning naming both lengths (LNMP spec v1 Appendix A and section 9)."""
    chain = (bytes.fromhex("100008") + bytes.fromhex("0000018C9A3B2F28")
             + bytes.fromhex("11000C") + b"auth-service" + bytes.fromhex("120009") + b"abc-123-x")
    printed = b"LNMP" + bytes([0x01, 0x02]) + bytes.fromhex("8000") + bytes.fromhex("0000001F") + chain + b"REC"
    with pytest.raises(LnmpError):
        lnmp.decode_container(printed, strict=True)
    c = lnmp.decode_container(printed, strict=False)
    assert c.envelope is not None
    assert (c.envelope.timestamp, c.envelope.source, c.envelope.trace_id) == (1703394619176, "auth-service",
                                                                              "abc-123-x")
    assert bytes(c.record) == b"REC"
    assert any("declares 31 bytes" in w for w in c.warnings)


def test_stream_mode_fixed_metadata_precedes_the_chain() -> None:
    stream_md = bytes.fromhex("000010000200")  # chunk 4096, SC32, no flags
    c = lnmp.Container(record=b"chunks", envelope=lnmp.LnmpEnvelope(sequence=7), mode=lnmp.Mode.STREAM,
                       mode_metadata=stream_md)
    wire = lnmp.encode_container(c)
    assert wire[12:18] == stream_md and wire[18:21] == bytes.fromhex("130008")
    assert lnmp.decode_container(wire) == c


@pytest.mark.parametrize(("chain", "message"), [
    (bytes.fromhex("100004") + b"\x00\x00\x00\x01", "length 4, must be 8"),
    (bytes.fromhex("130009") + b"\x00" * 9, "length 9, must be 8"),
    (bytes.fromhex("110005") + b"ab", "claims 5 bytes"),
    (bytes.fromhex("1100"), "TLV header truncated"),
    (bytes.fromhex("110001") + b"a" + bytes.fromhex("110001") + b"b", "appears twice"),
    (bytes.fromhex("110001") + b"a" + bytes.fromhex("100008") + TS_BYTES, "follows 0x11"),
    (bytes.fromhex("110002") + b"\xff\xfe", "not valid UTF-8"),
])
def test_strict_decoding_rejects(chain: bytes, message: str) -> None:
    with pytest.raises(LnmpError, match=message):
        lnmp.decode_tlv(chain)
    wire = b"LNMP\x01\x02\x80\x00" + len(chain).to_bytes(4, "big") + chain + b"REC"
    with pytest.raises(LnmpError):
        lnmp.decode_container(wire)
    loose = lnmp.decode_container(wire, strict=False)  # loose: envelope ignored, record kept
    assert loose.envelope is None and bytes(loose.record) == b"REC"
    assert loose.warnings and "envelope ignored" in loose.warnings[0]


@pytest.mark.parametrize(("wire", "message"), [
    (b"LNMP\x01\x02\x00", "shorter than its 12-byte header"),
    (b"LNMX\x01\x02\x00\x00\x00\x00\x00\x00", "magic"),
    (b"LNMP\x02\x02\x00\x00\x00\x00\x00\x00", "version 0x02"),
    (b"LNMP\x01\xff\x00\x00\x00\x00\x00\x00", "unknown LNMP mode 0xff"),
    (b"LNMP\x01\x02\x80\x00\x00\x00\x00\x10abc", "runs past the end"),
])
def test_container_damage_is_an_error_in_both_modes(wire: bytes, message: str) -> None:
    for strict in (True, False):
        with pytest.raises(LnmpError, match=message):
            lnmp.decode_container(wire, strict=strict)


def test_reserved_flags_strict_vs_loose() -> None:
    wire = b"LNMP\x01\x02\x00\x04\x00\x00\x00\x00REC"
    with pytest.raises(LnmpError, match="reserved container flag"):
        lnmp.decode_container(wire)
    c = lnmp.decode_container(wire, strict=False)
    assert c.flags == 0x0004 and bytes(c.record) == b"REC"


def test_encoder_refuses_values_that_do_not_fit() -> None:
    with pytest.raises(LnmpError, match="u64"):
        lnmp.encode_tlv(lnmp.LnmpEnvelope(sequence=2**64))
    with pytest.raises(LnmpError, match="over the TLV limit"):
        lnmp.encode_tlv(lnmp.LnmpEnvelope(source="x" * 70000))


envelopes = st.builds(
    lnmp.LnmpEnvelope,
    timestamp=st.none() | st.integers(0, 2**64 - 1),
    source=st.none() | st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
    trace_id=st.none() | st.text(st.characters(blacklist_categories=("Cs",)), max_size=60),
    sequence=st.none() | st.integers(0, 2**64 - 1),
    extra_tlv=st.dictionaries(st.integers(0, 255).filter(lambda t: t not in (0x10, 0x11, 0x12, 0x13)),
                              st.binary(max_size=16), max_size=3).map(lambda d: tuple(sorted(d.items()))),
)


@settings(max_examples=300, deadline=None)
@given(env=envelopes, record=st.binary(max_size=64), mode=st.sampled_from(list(lnmp.Mode)),
       flags=st.sampled_from([0, lnmp.FLAG_CHECKSUM]))
def test_binary_round_trip(env: lnmp.LnmpEnvelope, record: bytes, mode: int, flags: int) -> None:
    md = bytes(lnmp.MODE_METADATA_LENGTH.get(mode, 0))
    c = lnmp.Container(record=record, envelope=env, mode=mode, flags=flags, mode_metadata=md)
    back = lnmp.decode_container(lnmp.encode_container(c))
    assert back.record == record and back.mode == mode and back.flags == flags
    assert back.envelope == (env if not env.is_empty() else None)
