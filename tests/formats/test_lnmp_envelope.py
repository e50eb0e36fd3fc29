"""LNMP <-> Prism envelope mapping (app.formats.lnmp_envelope)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope import decode, encode, new_envelope
from app.errors import LnmpError, PayloadError
from app.formats import lnmp
from app.formats import lnmp_envelope as le
from app.formats.detect import InputShape, normalize

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _norm(data: bytes, **kw: object) -> object:
    return normalize(data, topic="lnmp.in", namespace="iot", now_ms=1_700_000_000_000, **kw)  # type: ignore[arg-type]


def test_mapping_of_every_field() -> None:
    wire = lnmp.encode_container(lnmp.Container(record=b"\x04\x00\x02rec", envelope=lnmp.LnmpEnvelope(
        timestamp=1732373147000, source="sensor-7", trace_id=TP, sequence=42)))
    r = _norm(wire)
    env = r.envelope
    assert r.shape is InputShape.LNMP_BINARY
    assert env.published_at_ms == 1732373147000
    assert env.security.publisher_id == "sensor-7"
    assert (env.observability.trace_id, env.observability.span_id, env.observability.trace_flags) == (
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert env.extensions[le.EXT_SEQUENCE] == (42).to_bytes(8, "big")
    assert le.sequence_of(env) == 42
    assert env.content_type == "application/lnmp" and bytes(env.payload.value) == b"\x04\x00\x02rec"
    assert (env.topic, env.namespace) == ("lnmp.in", "iot")
    assert le.EXT_TRACE_ID not in env.extensions  # canonical traceparent: no verbatim copy needed


def test_bare_trace_id_and_non_w3c_trace_id() -> None:
    env = _norm(b"#ENVELOPE trace_id=4bf92f3577b34da6a3ce929d0e0e4736\nF1=1").envelope
    assert env.observability.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and not env.observability.span_id
    r = _norm(b"#ENVELOPE trace_id=abc-123\nF1=1")
    assert r.envelope.observability is None and r.envelope.extensions[le.EXT_TRACE_ID] == b"abc-123"
    assert any("lnmp.trace_id" in n for n in r.notes)


def test_non_canonical_traceparent_is_kept_verbatim_too() -> None:
    tp01 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
    wire = f"#ENVELOPE timestamp=7 trace_id={tp01}\nF1=1".encode()
    env = _norm(wire).envelope
    assert env.observability.span_id == "00f067aa0ba902b7"
    assert env.extensions[le.EXT_TRACE_ID] == tp01.encode()
    assert le.to_lnmp(env) == wire


def test_timestamp_zero_strict_and_loose() -> None:
    data = b"#ENVELOPE timestamp=0\nF1=1"
    with pytest.raises(LnmpError, match="not a usable publish time"):
        _norm(data)
    r = _norm(data, strict=False)
    assert r.envelope.published_at_ms == 1_700_000_000_000 and any("ignored" in n for n in r.notes)


def test_loose_mode_keeps_the_record() -> None:
    r = _norm(b"#ENVELOPE source=\"broken\nF7=1", strict=False)
    assert r.shape is InputShape.LNMP_TEXT and bytes(r.envelope.payload.value) == b"F7=1"
    assert r.envelope.security is None and any("envelope ignored" in n for n in r.notes)
    with pytest.raises(LnmpError, match="unterminated"):
        _norm(b"#ENVELOPE source=\"broken\nF7=1")


def test_transport_headers_fill_in_and_in_band_wins() -> None:
    r = _norm(b"#ENVELOPE source=in-band\nF1=1", headers=[("lnmp.source", b"header"), ("lnmp.sequence", b"9")])
    assert r.envelope.security.publisher_id == "in-band" and le.sequence_of(r.envelope) == 9
    assert any("envelope wins" in n for n in r.notes)
    # a bare record whose only metadata is in HTTP headers
    r = _norm(b"F1=1", headers=[("X-LNMP-Timestamp", b"1732373147000")])
    assert r.shape is InputShape.LNMP_TEXT and r.envelope.published_at_ms == 1732373147000
    r = _norm(b"\x04\x00\x01\xff", headers=[("lnmp-sequence", b"3")])
    assert r.shape is InputShape.LNMP_BINARY and r.envelope.content_type == "application/lnmp"


def test_prism_to_lnmp_uses_the_plaintext_payload_and_picks_the_form() -> None:
    env = new_envelope("t", b"F1=1;F2=2", namespace="ns", content_type="text/lnmp", content_encoding="gzip",
                       published_at_ms=5)
    assert le.to_lnmp(env) == b"#ENVELOPE timestamp=5\nF1=1;F2=2"
    assert le.to_lnmp(env, form="binary") == lnmp.encode_container(
        lnmp.Container(record=b"F1=1;F2=2", envelope=lnmp.LnmpEnvelope(timestamp=5)))
    with pytest.raises(LnmpError, match="unknown LNMP form"):
        le.to_lnmp(env, form="yaml")


def test_bad_extensions_are_reported() -> None:
    env = new_envelope("t", b"F1=1", namespace="ns", published_at_ms=5, extensions={le.EXT_SEQUENCE: b"\x01"})
    with pytest.raises(LnmpError, match="must be 8"):
        le.to_lnmp(env)


_value = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), min_size=1, max_size=20)
_tp = st.builds(lambda t, s, f: f"00-{t}-{s}-{f:02x}", st.from_regex(r"[0-9a-f]{32}", fullmatch=True).filter(
    lambda x: set(x) != {"0"}), st.from_regex(r"[0-9a-f]{16}", fullmatch=True).filter(lambda x: set(x) != {"0"}),
    st.integers(0, 255))
metas = st.builds(
    lnmp.LnmpEnvelope,
    timestamp=st.integers(1, 2**63 - 1),
    source=st.none() | _value,
    trace_id=st.none() | _value | _tp,
    sequence=st.none() | st.integers(0, 2**64 - 1),
    extra_tlv=st.dictionaries(st.integers(0x15, 0xFF), st.binary(max_size=8), max_size=2).map(
        lambda d: tuple(sorted(d.items()))),
)
text_metas = metas.map(lambda m: lnmp.LnmpEnvelope(m.timestamp, m.source, m.trace_id, m.sequence))
records = st.from_regex(r"F[0-9]{1,3}=[a-z0-9]{1,8}(;F[0-9]{1,3}=[a-z0-9]{1,8}){0,3}", fullmatch=True).map(str.encode)


@settings(max_examples=200, deadline=None)
@given(meta=metas, record=st.binary(max_size=40), mode=st.sampled_from(list(lnmp.Mode)),
       flags=st.sampled_from([0, 1]))
def test_binary_lnmp_prism_lnmp_is_exact(meta: lnmp.LnmpEnvelope, record: bytes, mode: int, flags: int) -> None:
    wire = lnmp.encode_container(lnmp.Container(record=record, envelope=meta, mode=mode, flags=flags,
                                                mode_metadata=bytes(lnmp.MODE_METADATA_LENGTH.get(mode, 0))))
    env = _norm(wire).envelope
    assert bytes(env.payload.value) == record
    # through the wire format of the Prism envelope too
    assert le.to_lnmp(decode(encode(env))) == wire


@settings(max_examples=200, deadline=None)
@given(meta=text_metas, record=records)
def test_text_lnmp_prism_lnmp_is_exact(meta: lnmp.LnmpEnvelope, record: bytes) -> None:
    wire = lnmp.encode_text(record, meta)
    r = _norm(wire)
    assert r.shape is InputShape.LNMP_TEXT and bytes(r.envelope.payload.value) == record
    assert le.to_lnmp(decode(encode(r.envelope))) == wire


@settings(max_examples=100, deadline=None)
@given(ts=st.integers(1, 2**62), source=st.none() | _value, seq=st.none() | st.integers(0, 2**64 - 1),
       form=st.sampled_from(["binary", "text"]))
def test_prism_lnmp_prism_keeps_the_mapped_fields(ts: int, source: str | None, seq: int | None, form: str) -> None:
    env = new_envelope("lnmp.in", b"F1=1", namespace="iot", published_at_ms=ts,
                       content_type="text/lnmp" if form == "text" else "application/lnmp")
    if source:
        env.ensure_security().publisher_id = source
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1
    if seq is not None:
        env.extensions[le.EXT_SEQUENCE] = seq.to_bytes(8, "big")
    back = _norm(bytes(le.to_lnmp(env))).envelope
    assert back.published_at_ms == ts
    assert (back.security.publisher_id if back.security else None) == (source or None)
    assert back.observability == env.observability
    assert le.sequence_of(back) == seq
    assert bytes(back.payload.value) == b"F1=1" and back.content_type == env.content_type


def test_encrypted_payload_is_not_written_as_a_record() -> None:
    env = new_envelope("t", b"ciphertext", namespace="ns", published_at_ms=5)
    enc = env.ensure_security().encryption
    enc.key_id, enc.algorithm = "k1", "aes-256-gcm"
    with pytest.raises(PayloadError, match="encrypted"):
        le.to_lnmp(env)
