"""NATS binding: data + Prism-* headers + Nats-Msg-Id, as nats-py's dict[str, str]."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.bindings import nats
from app.bindings.nats import NatsMessage
from app.envelope import Layout, new_envelope
from app.errors import BindingError, DecodeError, SignatureError
from app.security.signing import SigningKey, VerificationKeys, verify
from tests.bindings.strategies import binding_envelopes, subject_topics, wire_equivalent

KEY = SigningKey.hmac_sha256("nats-hmac", b"k" * 32)
layouts = st.sampled_from(list(Layout))


def order():
    env = new_envelope("orders.created", {"order_id": 42}, namespace="order-events",
                       message_id="01890a5d-ac96-774b-bcce-b302099a8057", published_at_ms=1697200000123)
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 0
    return env


def replaced(msg: NatsMessage, name: str, value: str) -> NatsMessage:
    return NatsMessage(msg.subject, msg.data, {**msg.headers, name: value})


@settings(max_examples=150, deadline=None)
@given(binding_envelopes(topics=subject_topics), layouts)
def test_round_trip_any_envelope(env, layout):
    msg = nats.encode(env, layout)
    assert msg.subject == env.topic
    out = nats.decode(msg)
    assert out == wire_equivalent(env, layout)
    # Every header value is what nats-py can carry unchanged: printable ASCII, no edge whitespace.
    for value in msg.headers.values():
        assert value == value.strip() and value.isascii() and value.isprintable()
    assert unquote(msg.headers["Nats-Msg-Id"]) == env.message_id


@settings(max_examples=60, deadline=None)
@given(binding_envelopes(topics=subject_topics), layouts)
def test_signed_round_trip(env, layout):
    msg = nats.encode(env, layout, sign_with=KEY)
    nats.decode(msg, verify_with=VerificationKeys.of([KEY]))
    assert verify(msg.data, VerificationKeys.of([KEY])).key_id == "nats-hmac"
    with pytest.raises((SignatureError, DecodeError)):  # a flipped byte may also break the framing
        nats.decode(NatsMessage(msg.subject, msg.data[:-1] + bytes([msg.data[-1] ^ 1]), msg.headers),
                    verify_with=VerificationKeys.of([KEY]))


def test_header_table_for_a_known_envelope():
    msg = nats.encode(order(), Layout.DRAFT)
    assert msg.headers == {
        "Prism-Envelope-Version": "1",
        "Prism-Envelope-Layout": "draft",
        "Prism-Message-ID": "01890a5d-ac96-774b-bcce-b302099a8057",
        "Prism-Topic": "orders.created",
        "Prism-Namespace": "order-events",
        "Prism-Trace-ID": "0af7651916cd43dd8448eb211c80319c",
        "Prism-Content-Type": "application/json",
        "Nats-Msg-Id": "01890a5d-ac96-774b-bcce-b302099a8057",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
    }


def test_unusual_text_is_percent_encoded_and_restored():
    env = new_envelope("orders.created", b"x", namespace=" équipe\r\nX-Injected: 1 ", correlation_id="c")
    msg = nats.encode(env)
    assert msg.headers["Prism-Namespace"] == "%20%C3%A9quipe%0D%0AX-Injected:%201%20"
    assert nats.decode(msg).namespace == env.namespace


@settings(max_examples=80, deadline=None)
@given(binding_envelopes(topics=subject_topics),
       st.sampled_from(["Prism-Message-ID", "Prism-Topic", "Prism-Namespace", "Prism-Trace-ID", "Nats-Msg-Id"]),
       st.text("abcdef0123456789-", min_size=1, max_size=10))
def test_any_disagreeing_header_is_refused(env, name, value):
    msg = nats.encode(env)
    if msg.headers.get(name) == value:
        value += "z"
    with pytest.raises(BindingError) as err:
        nats.decode(replaced(msg, name, value))
    assert err.value.path == name


def test_header_names_are_case_insensitive_on_decode():
    msg = nats.encode(order())
    lowered = NatsMessage(msg.subject, msg.data, {k.lower(): v for k, v in msg.headers.items()})
    assert nats.decode(lowered) == order()
    with pytest.raises(BindingError, match="PRISM-TOPIC appears twice"):
        nats.decode(replaced(lowered, "PRISM-TOPIC", "other"))
    with pytest.raises(BindingError, match="Prism-Topic is 'other'"):
        nats.decode(NatsMessage(msg.subject, msg.data, {"PRISM-TOPIC": "other"}))


def test_no_headers_at_all_detects_the_layout():
    for layout in Layout:
        msg = nats.encode(order(), layout)
        assert nats.decode(NatsMessage(msg.subject, msg.data, {})) == wire_equivalent(order(), layout)


def test_caller_headers_kept_and_conflicts_refused():
    msg = nats.encode(order(), headers={"App-Tenant": "acme", "traceparent": "caller-wins"})
    assert msg.headers["App-Tenant"] == "acme" and msg.headers["traceparent"] == "caller-wins"
    with pytest.raises(BindingError, match="Nats-Msg-Id"):
        nats.encode(order(), headers={"Nats-Msg-Id": "something-else"})
    assert nats.passthrough_headers(msg.headers) == {"App-Tenant": "acme"}


@pytest.mark.parametrize("subject", ["", "orders created", "orders..created", "orders.*", "orders.>", "a\tb"])
def test_invalid_subjects_are_refused(subject):
    with pytest.raises(BindingError, match="NATS subject"):
        nats.encode(order(), subject=subject)


def test_explicit_subject_for_a_topic_that_is_not_one():
    env = new_envelope("orders created/eu", b"x", namespace="n")
    with pytest.raises(BindingError, match="subject"):
        nats.encode(env)
    msg = nats.encode(env, subject="orders.created.eu")
    assert nats.decode(msg).topic == "orders created/eu"
    assert msg.headers["Prism-Topic"] == "orders%20created/eu"
