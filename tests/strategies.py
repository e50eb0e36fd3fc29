"""Hypothesis strategies shared by the tests: random but always-valid envelopes."""

from __future__ import annotations

import string

from hypothesis import strategies as st

from app.envelope import Envelope, new_envelope

_text = st.text(alphabet=string.ascii_letters + string.digits + ".-_ é☃", min_size=1, max_size=24)
_hex = lambda n: st.text(alphabet="0123456789abcdef", min_size=n, max_size=n)  # noqa: E731

content_types = st.sampled_from(["", "application/json", "application/protobuf", "application/avro",
                                 "text/plain", "application/x-custom+v2"])
encodings = st.sampled_from(["", "none", "gzip", "snappy", "zstd"])


@st.composite
def envelopes(draw: st.DrawFn, *, allow_encoding: bool = True) -> Envelope:
    env = new_envelope(
        draw(_text),
        draw(st.binary(max_size=512)),
        namespace=draw(_text),
        content_type=draw(content_types) or None,
        content_encoding=draw(encodings) if allow_encoding else "",
        published_at_ms=draw(st.integers(min_value=1, max_value=2**41)),
        priority=draw(st.none() | st.integers(0, 10)),
        ttl_seconds=draw(st.none() | st.integers(0, 10**7)),
        correlation_id=draw(st.none() | _text),
        causality_parent=draw(st.none() | _text),
        producer_sdk_version=draw(st.none() | _text),
        labels=draw(st.dictionaries(_text, _text, max_size=3)),
        extensions=draw(st.dictionaries(_text.filter(lambda k: not k.startswith("prism.enc.")),
                                        st.binary(max_size=16), max_size=3)),
    )
    if draw(st.booleans()):
        sec = env.ensure_security()
        sec.publisher_id = draw(_text)
        if draw(st.booleans()):
            sec.publisher_team = draw(_text)
        sec.data_classification = draw(st.sampled_from(["public", "internal", "confidential", "restricted"]))
        if draw(st.booleans()):
            sec.contains_pii = True
        if draw(st.booleans()):
            enc = sec.encryption
            enc.key_id = draw(_text)
            enc.algorithm = "aes-256-gcm"
            enc.encryption_type = 1
            enc.iv = draw(st.binary(min_size=12, max_size=12))
            enc.aad = draw(st.binary(max_size=40))
            if draw(st.booleans()):
                enc.encapsulated_key = draw(st.binary(min_size=1, max_size=64))
                enc.public_key_id = draw(_text)
                enc.algorithm_params = '{"kdf":"hkdf-sha256"}'
    if draw(st.booleans()):
        obs = env.ensure_observability()
        obs.trace_id = draw(_hex(32))
        obs.span_id = draw(_hex(16))
        obs.trace_flags = draw(st.integers(0, 3))  # W3C-defined flags (sampled, random); others are dropped
        obs.baggage.update(draw(st.dictionaries(_text, _text, max_size=2)))
    if draw(st.booleans()):
        sch = env.ensure_schema()
        sch.schema_url = "registry://" + draw(_text)
        sch.schema_version = draw(_text)
        sch.schema_format = draw(st.sampled_from(["protobuf", "json-schema", "avro"]))
        sch.schema_hash = "sha256:" + draw(_hex(64))
        sch.deprecated_fields_used.extend(draw(st.lists(_text, max_size=2)))
    return env
