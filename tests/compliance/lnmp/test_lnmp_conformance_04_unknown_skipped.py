"""LNMP envelope spec section 11, item 4: skips unknown types/keys gracefully (sections 4.2
rule 3, 5.1, 10.1). Skipped entries do not disturb the known ones; Prism also keeps them so they
can be re-emitted unchanged."""

from __future__ import annotations

import pytest

from app.errors import LnmpError
from app.formats import lnmp
from app.formats import lnmp_envelope as le
from app.formats.detect import normalize


def test_unknown_tlv_types_are_skipped_by_length() -> None:
    chain = (bytes.fromhex("050003") + b"\x01\x02\x03"          # mode-specific, before the envelope
             + bytes.fromhex("110002") + b"ok"
             + bytes.fromhex("140004") + b"lbl!"                # 0x14 labels: reserved
             + bytes.fromhex("150000")                          # a future type with no value
             + bytes.fromhex("7f0005") + b"\x00\xff\x00\xff\x00")  # vendor, binary value
    env = lnmp.decode_tlv(chain)
    assert env.source == "ok" and env.timestamp is None
    assert env.extra_tlv == ((0x05, b"\x01\x02\x03"), (0x14, b"lbl!"), (0x15, b""), (0x7F, b"\x00\xff\x00\xff\x00"))
    assert lnmp.encode_tlv(env) == chain  # kept verbatim, re-emitted in place


def test_unknown_type_does_not_excuse_a_bad_length() -> None:
    with pytest.raises(LnmpError, match="claims 200 bytes"):
        lnmp.decode_tlv(bytes.fromhex("1500C8") + b"short")


def test_unknown_text_keys_are_skipped() -> None:
    msg = lnmp.decode_text(b'#ENVELOPE region=eu-west-1 timestamp=5 tenant="acme corp"\nF1=1')
    assert msg.envelope is not None and msg.envelope.timestamp == 5
    assert msg.envelope.extra_keys == (("region", "eu-west-1"), ("tenant", "acme corp"))
    assert lnmp.encode_text_header(msg.envelope) == '#ENVELOPE timestamp=5 region=eu-west-1 tenant="acme corp"'


def test_unknown_entries_survive_a_prism_round_trip() -> None:
    chain = bytes.fromhex("100008") + (99).to_bytes(8, "big") + bytes.fromhex("150002") + b"hi"
    wire = b"LNMP\x01\x02\x80\x00" + len(chain).to_bytes(4, "big") + chain + b"REC"
    env = normalize(wire, topic="t", namespace="ns").envelope
    assert env.published_at_ms == 99 and env.extensions[le.EXT_TLV] == bytes.fromhex("150002") + b"hi"
    assert le.to_lnmp(env) == wire

    text = b"#ENVELOPE timestamp=99 zone=a\nF1=1"
    env = normalize(text, topic="t", namespace="ns").envelope
    assert le.to_lnmp(env) == text
