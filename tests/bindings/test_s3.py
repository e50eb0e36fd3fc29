"""S3 binding: object key, body and user metadata."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bindings import s3
from app.envelope import Layout, encode, new_envelope
from app.errors import BindingError
from app.security.signing import SigningKey, VerificationKeys
from tests.bindings.strategies import binding_envelopes, wire_equivalent

KEY = SigningKey.hmac_sha256("s3-hmac", b"s" * 32)
layouts = st.sampled_from(list(Layout))


def order(topic="orders.created", message_id="01890a5d-ac96-774b-bcce-b302099a8057"):
    # 2023-10-13T12:26:40.123Z
    return new_envelope(topic, {"order_id": 42}, namespace="order-events", message_id=message_id,
                        published_at_ms=1697200000123)


@settings(max_examples=150, deadline=None)
@given(binding_envelopes(), layouts)
def test_round_trip_any_envelope(env, layout):
    obj = s3.encode(env, layout)
    assert obj.body == encode(env, layout)
    for k, v in obj.metadata.items():
        assert k.islower() and v.isascii() and v.isprintable() and " " not in v
    assert s3.parse_key(obj.key) == (env.topic, env.message_id)
    assert obj.key.count("/") == 5
    assert s3.decode(obj.body, obj.metadata, key=obj.key) == wire_equivalent(env, layout)


@settings(max_examples=40, deadline=None)
@given(binding_envelopes(), layouts)
def test_signed_body_verifies(env, layout):
    obj = s3.encode(env, layout, sign_with=KEY)
    assert s3.decode(obj.body, obj.metadata, verify_with=VerificationKeys.of([KEY])).security.signature_key_id == \
        "s3-hmac"


def test_key_and_metadata_for_a_known_envelope():
    obj = s3.encode(order(), Layout.DRAFT)
    assert obj.key == "events/2023/10/13/orders.created/01890a5d-ac96-774b-bcce-b302099a8057.bin"
    assert obj.metadata == {
        "prism-envelope-version": "1",
        "prism-envelope-layout": "draft",
        "prism-message-id": "01890a5d-ac96-774b-bcce-b302099a8057",
        "prism-topic": "orders.created",
        "prism-namespace": "order-events",
        "prism-content-type": "application/json",
    }
    assert obj.content_type == "application/protobuf; proto=prism.envelope.draft.PrismEnvelope"
    assert s3.encode(order(), prefix="archive/raw/").key.startswith("archive/raw/2023/10/13/")


def test_date_is_utc_from_published_at():
    env = order()
    env.header.metadata.published_at_ms = 1704067199999  # 2023-12-31T23:59:59.999Z (already Jan 1 east of UTC)
    assert s3.object_key(env).startswith("events/2023/12/31/")


@pytest.mark.parametrize(("topic", "segment"), [
    ("orders/eu", "orders%2Feu"), ("..", "%2E%2E"), ("a b", "a%20b"), ("commandes.créées", "commandes.cr%C3%A9%C3%A9es"),
])
def test_topic_cannot_add_or_climb_path_segments(topic, segment):
    obj = s3.encode(order(topic=topic))
    assert obj.key.split("/")[4] == segment
    assert s3.decode(obj.body, obj.metadata, key=obj.key).topic == topic


def test_decode_accepts_raw_amz_header_names_in_any_case():
    obj = s3.encode(order())
    raw = {f"X-Amz-Meta-{k.upper()}": v for k, v in obj.metadata.items()}
    assert s3.decode(obj.body, raw) == order()
    assert s3.decode(obj.body, None) == order()


@pytest.mark.parametrize("name", ["prism-message-id", "prism-topic", "prism-namespace", "prism-content-type"])
def test_disagreeing_metadata_is_refused(name):
    obj = s3.encode(order())
    with pytest.raises(BindingError, match=name):
        s3.decode(obj.body, {**obj.metadata, name: "other"})


def test_key_naming_another_message_is_refused():
    obj = s3.encode(order())
    other = s3.object_key(order(message_id="01890a5d-0000-7000-8000-000000000000"))
    with pytest.raises(BindingError, match="object key names"):
        s3.decode(obj.body, obj.metadata, key=other)
    with pytest.raises(BindingError, match="is not <prefix>"):
        s3.decode(obj.body, obj.metadata, key="events/x.json")


def test_limits():
    with pytest.raises(BindingError, match="1024-byte limit"):
        s3.encode(order(topic="t" * 1100))
    env = order()
    env.header.metadata.namespace = "n" * 2100
    with pytest.raises(BindingError, match="2048-byte limit"):
        s3.encode(env)
    env = order()
    env.header.metadata.message_id = ""
    with pytest.raises(BindingError, match="no message_id"):
        s3.encode(env)
