"""Loose-mode recovery of a container whose `metadata_length` disagrees with its TLV chain.

Strict mode still rejects every one of these. Loose mode recovers the chain, with a warning
naming the declared and the found length, only when the record boundary is unambiguous; the
attacker cases (a lying length past the input, a chain that runs into the record, duplicated
entries the declared length accounts for) never read past the input, never hand record bytes
to the envelope, and never loop.
"""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import LnmpError
from app.formats import lnmp
from app.formats import lnmp_envelope as lnmp_env

ENV = lnmp.LnmpEnvelope(timestamp=1703394619176, source="auth-service", trace_id="abc-123-x")
CHAIN = lnmp.encode_tlv(ENV)  # 38 bytes: 11 + 15 + 12
RECORD = b"F12=14532\nF7=1\n"


def container(mlen: int, chain: bytes = CHAIN, record: bytes = RECORD, mode: int = lnmp.Mode.BINARY,
              fixed: bytes = b"") -> bytes:
    return b"LNMP" + struct.pack(">BBHI", 1, mode, 0x8000, mlen) + fixed + chain + record


def test_spec_appendix_a_length_is_recovered_in_loose_mode_only() -> None:
    wire = container(31)  # the spec's own example declares 31 for a 38-byte chain
    with pytest.raises(LnmpError, match="claims 9 bytes"):
        lnmp.decode_container(wire)
    c = lnmp.decode_container(wire, strict=False)
    assert c.envelope == ENV and bytes(c.record) == RECORD
    [warning] = c.warnings
    assert "declares 31 bytes" in warning and "ends after 38" in warning and "byte 50" in warning


@pytest.mark.parametrize("mlen", [0, 5, 11, 20, 40, 45, len(CHAIN) + len(RECORD) - 1])
def test_declared_length_too_short_or_too_long(mlen: int) -> None:
    wire = container(mlen)
    if mlen == 11:  # lands on an entry boundary: the strict reading is consistent, nothing to recover
        c = lnmp.decode_container(wire, strict=False)
        assert c.envelope == lnmp.LnmpEnvelope(timestamp=ENV.timestamp) and not c.warnings
        return
    if mlen != 0:
        with pytest.raises(LnmpError):
            lnmp.decode_container(wire)
    c = lnmp.decode_container(wire, strict=False)
    assert c.envelope == ENV and bytes(c.record) == RECORD, c.warnings
    assert f"declares {mlen} bytes" in c.warnings[0]


def test_zero_length_with_bit_15_strict_reads_an_empty_chain() -> None:
    c = lnmp.decode_container(container(0))
    assert c.envelope == lnmp.LnmpEnvelope() and bytes(c.record) == CHAIN + RECORD  # strict: unchanged


def test_length_past_the_end_of_the_input() -> None:
    wire = container(0xFFFFFFFF)
    with pytest.raises(LnmpError, match="runs past the end"):
        lnmp.decode_container(wire)
    c = lnmp.decode_container(wire, strict=False)
    assert c.envelope == ENV and bytes(c.record) == RECORD
    # without a recoverable chain it stays an error in both modes
    with pytest.raises(LnmpError, match="runs past the end"):
        lnmp.decode_container(container(0xFFFFFFFF, chain=b"\x00\x00"), strict=False)


def test_stream_mode_fixed_metadata_is_kept() -> None:
    fixed = bytes.fromhex("000010000200")
    wire = container(6 + 3, fixed=fixed, mode=lnmp.Mode.STREAM)
    c = lnmp.decode_container(wire, strict=False)
    assert c.mode_metadata == fixed and c.envelope == ENV and bytes(c.record) == RECORD


def test_recovered_metadata_reaches_the_prism_envelope_with_a_note() -> None:
    mapped = lnmp_env.decode_message(container(31), strict=False)
    assert mapped.envelope.metadata.published_at_ms == ENV.timestamp
    assert mapped.envelope.security.publisher_id == "auth-service"
    assert bytes(mapped.envelope.payload.value) == RECORD
    assert any("declares 31 bytes" in n for n in mapped.notes)


TS_ONLY = lnmp.LnmpEnvelope(timestamp=ENV.timestamp)


@pytest.mark.parametrize(("wire", "why", "kept"), [
    # the record starts with bytes that read as a further entry (0x13, length 1 fits): ambiguous,
    # but all three entries are whole inside the declared 40 bytes
    (container(40, record=b"\x13\x00\x01xyz"), "continuation", ENV),
    # the chain runs to the end of the input: no record would be left; the timestamp is whole
    # inside the declared 20 bytes, the source is cut
    (container(20, record=b""), "no record", TS_ONLY),
    # nothing readable where the chain should start: the one whole, in-order entry is kept
    (container(20, chain=b"\xff\x00\x00" + CHAIN), "no chain", lnmp.LnmpEnvelope(extra_tlv=((0xFF, b""),))),
])
def test_ambiguous_boundaries_keep_the_whole_entries_inside_the_declared_block(
        wire: bytes, why: str, kept: lnmp.LnmpEnvelope) -> None:
    """Recovery past the declared length is refused (the boundary is ambiguous), but every TLV
    that parses whole inside the declared block comes back; the record starts where the header
    says, so no record byte becomes metadata. Strict mode refuses all of them."""
    with pytest.raises(LnmpError):
        lnmp.decode_container(wire)
    c = lnmp.decode_container(wire, strict=False)
    assert c.envelope == kept, why
    [warning] = c.warnings
    assert "does not end on a TLV boundary" in warning and "whole TLV entr" in warning
    assert bytes(c.record) == wire[12 + struct.unpack_from(">I", wire, 8)[0]:]


def test_a_broken_chain_whose_length_agrees_is_still_ignored() -> None:
    """A duplicated entry the declared length accounts for: the lengths agree, the chain breaks
    a rule - not a length disagreement, so loose mode ignores the envelope as before."""
    wire = container(len(CHAIN) + 4, chain=CHAIN + bytes.fromhex("120001") + b"z")
    c = lnmp.decode_container(wire, strict=False)
    assert c.envelope is None
    assert c.warnings and "envelope ignored" in c.warnings[0]
    assert bytes(c.record) == RECORD


@settings(max_examples=300, deadline=None)
@given(env=st.builds(lnmp.LnmpEnvelope, timestamp=st.none() | st.integers(0, lnmp.U64_MAX),
                     source=st.none() | st.text(max_size=40), trace_id=st.none() | st.text(max_size=60),
                     sequence=st.none() | st.integers(0, lnmp.U64_MAX)).filter(lambda e: not e.is_empty()),
       cut=st.integers(1, 200))
def test_a_short_length_keeps_exactly_the_entries_it_covers(env: lnmp.LnmpEnvelope, cut: int) -> None:
    """A declared length cut inside the chain, with a record that could continue it (so the
    boundary is ambiguous): loose mode returns exactly the entries that lie whole before the cut."""
    chain = lnmp.tlv_entries(env)
    ends = [sum(3 + len(v) for _, v in chain[:i + 1]) for i in range(len(chain))]
    mlen = min(cut, ends[-1] - 1)
    if mlen in ends:
        return  # a consistent reading, nothing to salvage
    wire = container(mlen, chain=lnmp.encode_tlv(env), record=b"\x14\x00\x00")  # a would-be next entry
    c = lnmp.decode_container(wire, strict=False)
    whole = [e for e, end in zip(chain, ends, strict=True) if end <= mlen]
    if not whole:
        assert c.envelope is None
        return
    names = {lnmp.Tlv.TIMESTAMP: "timestamp", lnmp.Tlv.SOURCE: "source", lnmp.Tlv.TRACE_ID: "trace_id",
             lnmp.Tlv.SEQUENCE: "sequence"}
    assert c.envelope == lnmp.LnmpEnvelope(**{names[lnmp.Tlv(t)]: getattr(env, names[lnmp.Tlv(t)])
                                              for t, _ in whole})


envelopes = st.builds(
    lnmp.LnmpEnvelope,
    timestamp=st.none() | st.integers(0, lnmp.U64_MAX),
    source=st.none() | st.text(max_size=40),
    trace_id=st.none() | st.text(max_size=60),
    sequence=st.none() | st.integers(0, lnmp.U64_MAX),
).filter(lambda e: not e.is_empty())


@settings(max_examples=300, deadline=None)
@given(env=envelopes, tail=st.binary(max_size=200), lie=st.integers(0, 2**32 - 1),
       stream=st.booleans())
def test_any_lying_length_recovers_exactly_unless_it_lands_on_an_entry(
        env: lnmp.LnmpEnvelope, tail: bytes, lie: int, stream: bool) -> None:
    # A record whose first bytes cannot continue a chain (type 0x00, length 0xFFFF > input).
    record = b"\x00\xff\xff" + tail
    fixed = bytes(6) if stream else b""
    honest = lnmp.encode_container(lnmp.Container(record=record, envelope=env,
                                                  mode=lnmp.Mode.STREAM if stream else lnmp.Mode.BINARY,
                                                  mode_metadata=fixed))
    true_len = struct.unpack_from(">I", honest, 8)[0]
    wire = honest[:8] + struct.pack(">I", lie) + honest[12:]
    c = lnmp.decode_container(wire, strict=False)
    chain = lnmp.tlv_entries(env)
    boundaries = {len(fixed) + sum(3 + len(v) for _, v in chain[:i]) for i in range(1, len(chain) + 1)}
    if lie == true_len or (lie in boundaries):
        assert not c.warnings  # a consistent reading: the declared length is taken as is
        return
    assert c.envelope == env and bytes(c.record) == record and c.mode_metadata == fixed
    assert f"declares {lie} bytes" in c.warnings[0]


@settings(max_examples=500, deadline=None)
@given(mode=st.sampled_from(list(lnmp.Mode)), mlen=st.integers(0, 2**32 - 1), body=st.binary(max_size=300))
def test_hostile_containers_never_crash_overread_or_overlap(mode: int, mlen: int, body: bytes) -> None:
    wire = b"LNMP" + struct.pack(">BBHI", 1, mode, 0x8000, mlen) + body
    started = time.monotonic()
    try:
        c = lnmp.decode_container(wire, strict=False)
    except LnmpError:
        return
    assert time.monotonic() - started < 1
    record = bytes(c.record)
    assert wire.endswith(record)
    # metadata (fixed + every TLV value) lies between the header and the record, disjoint from it
    used = len(c.mode_metadata) + (len(lnmp.encode_tlv(c.envelope)) if c.envelope else 0)
    assert 12 + used + len(record) <= len(wire)
