"""`codec.draft_split`: the draft copy built from the reviewed head's bytes is byte for byte
the general path's (`split_header(reviewed_to_draft(...))`), and every header it cannot handle
exactly is handed back (None) rather than converted approximately."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope.codec import Layout, draft_split, security_bytes, split_header
from app.envelope.layouts import reviewed_to_draft

_text = st.text(max_size=12)


def _general(header: vpb.PrismEnvelope) -> tuple[bytes, bytes]:
    return split_header(reviewed_to_draft(header, report=False)[0], Layout.DRAFT)


def _fast(header: vpb.PrismEnvelope) -> tuple[bytes, bytes] | None:
    out = draft_split(header, split_header(header, Layout.REVIEWED)[0])
    return None if out is None else (out[0], security_bytes(out[1], Layout.DRAFT))


@st.composite
def headers(draw: st.DrawFn) -> vpb.PrismEnvelope:
    h = vpb.PrismEnvelope()
    m = h.metadata
    m.message_id, m.topic, m.namespace = draw(_text), draw(_text), draw(_text)
    m.published_at_ms = draw(st.integers(0, 2**42))
    for name in ("priority", "ttl_seconds"):
        if draw(st.booleans()):
            setattr(m, name, draw(st.integers(0, 10)))  # 0 too: explicit presence of a zero
    if draw(st.booleans()):
        m.content_type = draw(st.sampled_from([0, 1, 2, 3, 99]))
        if m.content_type == 99:
            m.content_type_custom = draw(_text)
    if draw(st.booleans()):
        m.content_encoding = draw(st.sampled_from([0, 1, 2, 3, 99]))
        if m.content_encoding == 99:
            m.content_encoding_custom = draw(_text)
    if draw(st.booleans()):
        m.correlation_id = draw(_text)
    if draw(st.booleans()):
        m.causality_parent = draw(_text)
    if draw(st.booleans()):
        m.producer_sdk_version = draw(_text)
    s = h.security
    s.SetInParent()
    for name in ("publisher_id", "publisher_team", "signature_algorithm", "data_classification", "signature_key_id"):
        if draw(st.booleans()):
            setattr(s, name, draw(_text))
    if draw(st.booleans()):
        s.contains_pii = draw(st.booleans())  # False too: explicit presence of a zero
    if draw(st.booleans()):
        s.signature_scope = draw(st.sampled_from([0, 2, 3, 4]))
    if draw(st.booleans()):
        s.auth_token = draw(_text)
    if draw(st.integers(0, 9)) == 0:
        s.encryption.key_id, s.encryption.algorithm = "k1", "aes-256-gcm"
    if draw(st.booleans()):
        o = h.observability
        o.SetInParent()
        o.trace_id, o.span_id = draw(_text), draw(_text)
        o.trace_flags = draw(st.integers(0, 3))
        if draw(st.integers(0, 4)) == 0:
            o.baggage["k"], o.labels["l"] = "v", "w"
    if draw(st.booleans()):
        c = h.schema
        c.SetInParent()
        c.schema_name, c.schema_version = draw(_text), draw(_text)
        c.deprecated_fields_used.extend(draw(st.lists(_text, max_size=3)))
    for _ in range(draw(st.integers(0, 2))):  # one entry takes the fast path, two do not
        key = draw(st.sampled_from(["", "x", "prism.identity.method", "prism.unknown.draft.metadata",
                                    "prism.unknown.reviewed", "prism.enc.public_key_id"]))
        h.extensions[key] = draw(st.sampled_from([b"", b"y", b"\xa8\x06\x01", b"\x08\x01"]))
    return h


@settings(max_examples=400, deadline=None)
@given(headers())
def test_the_fast_draft_copy_is_the_general_one_or_declines(header: vpb.PrismEnvelope) -> None:
    fast = _fast(header)
    if fast is not None:
        assert fast == _general(header)


def _plain() -> vpb.PrismEnvelope:
    h = vpb.PrismEnvelope()
    h.metadata.message_id, h.metadata.topic, h.metadata.namespace = "m", "t", "n"
    h.metadata.published_at_ms = 1_700_000_000_123
    h.metadata.priority = 0  # an explicit zero the draft cannot carry
    h.security.publisher_id, h.security.signature_scope, h.security.contains_pii = "svc", 4, False
    h.observability.trace_id = "a" * 32
    h.schema.schema_name = "s"
    return h


def test_the_worker_shape_takes_the_fast_path() -> None:
    header = _plain()
    assert _fast(header) == _general(header)


def test_the_worker_shape_with_its_identity_extension_takes_the_fast_path() -> None:
    """The identity stage adds `prism.identity.method` to every authenticated message: one
    extension entry, copied as its wire record with the tag renumbered (97 -> 99)."""
    header = _plain()
    header.extensions["prism.identity.method"] = b"token"
    fast = _fast(header)
    assert fast is not None and fast == _general(header)


def test_what_it_cannot_copy_exactly_takes_the_general_path() -> None:
    cases = []
    h = _plain()
    h.security.encryption.key_id = "k"  # nested message differs between the layouts
    cases.append(h)
    h = _plain()
    h.extensions["x"], h.extensions["z"] = b"y", b"w"  # two entries: the order could differ
    cases.append(h)
    h = _plain()
    h.extensions["prism.unknown.draft.metadata"] = b"\xa8\x06\x01"  # put back by the general path
    cases.append(h)
    h = _plain()
    h.observability.baggage["k"] = "v"  # a map could be written in another order
    cases.append(h)
    h = _plain()
    h.security.MergeFromString(b"\xa8\x06\x01")  # unknown field 101: the mapping drops it
    cases.append(h)
    h = _plain()
    h.MergeFromString(b"\xa8\x06\x01")  # an unknown top-level field
    cases.append(h)
    h = _plain()
    h.ClearField("security")
    cases.append(h)
    for header in cases:
        assert _fast(header) is None
        _general(header)  # and the general path still handles it
