"""Redis binding: self-contained Pub/Sub bytes and Streams field maps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bindings import redis as rb
from app.envelope import Layout, encode, new_envelope
from app.errors import BindingError, SignatureError
from app.security.signing import SigningKey, VerificationKeys
from tests.bindings.strategies import binding_envelopes, wire_equivalent

KEY = SigningKey.hmac_sha256("redis-hmac", b"r" * 32)
KEYS = VerificationKeys.of([KEY])
layouts = st.sampled_from(list(Layout))


def order():
    return new_envelope("orders.created", {"order_id": 42}, namespace="order-events",
                        message_id="01890a5d-ac96-774b-bcce-b302099a8057", published_at_ms=1697200000123)


@settings(max_examples=120, deadline=None)
@given(binding_envelopes(), layouts)
def test_pubsub_round_trip(env, layout):
    data = rb.encode_pubsub(env, layout)
    assert data == encode(env, layout)  # nothing but the envelope: self-contained
    assert rb.decode_pubsub(data) == wire_equivalent(env, layout)
    assert rb.decode_pubsub(data, layout=layout) == wire_equivalent(env, layout)


@settings(max_examples=120, deadline=None)
@given(binding_envelopes(), layouts)
def test_stream_round_trip_with_bytes_and_str_keys(env, layout):
    fields = rb.encode_stream_fields(env, layout)
    assert fields["message_id"] == env.message_id.encode() and fields["topic"] == env.topic.encode()
    assert fields["layout"] == layout.value.encode()
    # redis-py returns bytes field names from XRANGE/XREAD; accept str names too.
    as_bytes = {k.encode(): v for k, v in fields.items()}
    assert rb.decode_stream_fields(as_bytes) == wire_equivalent(env, layout)
    assert rb.decode_stream_fields(fields) == wire_equivalent(env, layout)


@settings(max_examples=40, deadline=None)
@given(binding_envelopes(), layouts)
def test_signed_round_trip(env, layout):
    assert rb.decode_pubsub(rb.encode_pubsub(env, layout, sign_with=KEY), verify_with=KEYS) is not None
    fields = rb.encode_stream_fields(env, layout, sign_with=KEY)
    out = rb.decode_stream_fields(fields, verify_with=KEYS)
    assert out.security.signature_key_id == "redis-hmac"


def test_unsigned_message_fails_verification():
    with pytest.raises(SignatureError, match="not signed"):
        rb.decode_pubsub(rb.encode_pubsub(order()), verify_with=KEYS)


def test_stream_field_table_for_a_known_envelope():
    assert rb.encode_stream_fields(order(), Layout.DRAFT) == {
        "envelope": encode(order(), Layout.DRAFT),
        "envelope_version": b"1",
        "layout": b"draft",
        "message_id": b"01890a5d-ac96-774b-bcce-b302099a8057",
        "topic": b"orders.created",
        "namespace": b"order-events",
        "content_type": b"application/json",
    }


@pytest.mark.parametrize("field", ["message_id", "topic", "namespace", "content_type"])
def test_disagreeing_stream_field_is_refused(field):
    fields = rb.encode_stream_fields(order())
    fields[field] = b"something-else"
    with pytest.raises(BindingError, match=f"{field} is 'something-else'"):
        rb.decode_stream_fields(fields)


def test_bad_inputs():
    fields = rb.encode_stream_fields(order())
    with pytest.raises(BindingError, match="no 'envelope' field"):
        rb.decode_stream_fields({k: v for k, v in fields.items() if k != "envelope"})
    with pytest.raises(BindingError, match="decode_responses=False"):
        rb.decode_stream_fields({**fields, "envelope": "text"})
    with pytest.raises(BindingError, match="decode_responses=False"):
        rb.decode_pubsub("text")
    with pytest.raises(BindingError, match="not valid UTF-8"):
        rb.decode_stream_fields({**fields, "topic": b"\xff"})
    assert rb.channel_for(order()) == "orders.created"
