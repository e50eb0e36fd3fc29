"""Random envelopes for the binding tests.

Wider than `tests.strategies.envelopes` on purpose: bindings put envelope text into headers,
object keys and JSON, so topics/ids here include spaces, `%`, `/`, non-ASCII and control
characters, payloads include JSON documents (the PostgreSQL binding inlines them), and
envelopes may carry a W3C tracestate, an auth token and unknown fields from a newer producer.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from app.bindings.tracecontext import TRACESTATE_EXTENSION
from app.envelope import Envelope, Layout, decode, encode, new_envelope
from tests.strategies import envelopes as base_envelopes

_hex = lambda n: st.text(alphabet="0123456789abcdef", min_size=n, max_size=n)  # noqa: E731

#: Any text protobuf can hold except U+0000 (JSONB refuses it; tested separately).
wide_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=20)
#: Topics that are valid NATS subjects (NATS is the strictest transport for the topic).
subject_topics = st.from_regex(r"[a-z][a-z0-9_-]{0,11}(\.[a-z0-9_-]{1,11}){0,3}", fullmatch=True)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | wide_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(wide_text, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def payloads(draw: st.DrawFn) -> tuple[object, str | None]:
    """(payload for new_envelope, content type override)."""
    kind = draw(st.sampled_from(["bytes", "text", "json", "json-sorted", "json-bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300)), draw(st.sampled_from([None, "application/octet-stream",
                                                                   "application/json"]))
    if kind == "text":
        return draw(wide_text), None
    value = draw(st.dictionaries(wide_text, json_values, max_size=5) | st.lists(json_values, max_size=4))
    if kind == "json":
        return value, None
    if kind == "json-sorted":  # the canonical form the PostgreSQL binding stores without base64
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(), \
            "application/json"
    # indented JSON text: valid JSON but not canonical
    return json.dumps(value, indent=1).encode(), draw(st.sampled_from(["application/json",
                                                                     "application/cloudevents+json"]))


@st.composite
def binding_envelopes(draw: st.DrawFn, *, topics: st.SearchStrategy[str] = wide_text,
                      unknown_fields: bool = True, control_chars: bool = True) -> Envelope:
    """An envelope built with `new_envelope` from random fields, plus optional contexts."""
    text = wide_text if control_chars else st.text(
        st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=20)
    if draw(st.integers(0, 4)) == 0:
        env = draw(base_envelopes())  # the project's shared strategy, binary payloads
        env.header.metadata.topic = draw(topics)
    else:
        payload, content_type = draw(payloads())
        env = new_envelope(
            draw(topics),
            payload,
            namespace=draw(text),
            content_type=content_type,
            content_encoding=draw(st.sampled_from(["", "", "none", "gzip", "snappy", "zstd"])),
            message_id=draw(st.none() | st.uuids().map(str) | text),
            published_at_ms=draw(st.integers(1, 253402300799999)),  # up to 9999-12-31
            priority=draw(st.none() | st.integers(0, 10)),
            ttl_seconds=draw(st.none() | st.integers(0, 10**7)),
            correlation_id=draw(st.none() | text),
            causality_parent=draw(st.none() | text),
            labels=draw(st.dictionaries(text, text, max_size=2)),
            extensions=draw(st.dictionaries(text.filter(lambda k: not k.startswith(("prism.enc.", "w3c."))),
                                            st.binary(max_size=8), max_size=2)),
            data_classification=draw(st.none() | st.sampled_from(["public", "internal", "confidential"])),
            contains_pii=draw(st.none() | st.booleans()),
        )
    if draw(st.booleans()):
        obs = env.ensure_observability()
        obs.trace_id = draw(_hex(32))
        obs.span_id = draw(_hex(16))
        obs.trace_flags = draw(st.integers(0, 3))  # W3C-defined flags (sampled, random); others are dropped
        if draw(st.booleans()):
            env.extensions[TRACESTATE_EXTENSION] = draw(st.sampled_from(
                [b"congo=t61rcWkgMzE", b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", b"bad state\x01"]))
    if draw(st.booleans()):
        sec = env.ensure_security()
        sec.publisher_id = draw(text)
        if draw(st.booleans()):
            sec.auth_token = "eyJ" + draw(st.text("abcdefXYZ0123456789-_.", min_size=10, max_size=40))
        if draw(st.booleans()):
            enc = sec.encryption
            enc.key_id, enc.algorithm, enc.encryption_type = "k1", "aes-256-gcm", 1
            enc.iv = draw(st.binary(min_size=12, max_size=12))
    if unknown_fields and draw(st.booleans()):
        # Fields from a newer producer: top level (field 50, varint) and metadata (field 40, bytes).
        env.header.MergeFromString(bytes([0x90, 0x03]) + bytes([draw(st.integers(0, 127))]))
        env.header.metadata.MergeFromString(bytes([0xC2, 0x02, 0x02]) + draw(st.binary(min_size=2, max_size=2)))
    return env


def wire_equivalent(env: Envelope, layout: Layout) -> Envelope:
    """What a perfect transport delivers: the codec's own round trip of `env` in `layout`
    (the draft layout cannot hold explicit zeros or unknown reviewed fields)."""
    return decode(encode(env, layout))
