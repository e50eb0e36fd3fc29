"""Attacks on what a producer may claim, each run through the real worker on the embedded
broker. For every attack record the test asserts where it landed: the DLQ with its specific
reason (and stage), never `.v3` (so no sink and no lake partition ever files it). Each test
also sends a genuine control record that must reach `.v3`, so a worker that rejected
everything could not pass.

Attacks (tests/security/adversarial/README.md lists them with their reasons):
* namespace impersonation - a valid token for one service claiming namespace `billing`;
* cross-topic replay - a signed, valid envelope from topic X produced onto topic Y, and the
  worker's own signed output produced back as input;
* unsigned input where the topology requires signatures;
* a signature made with another namespace's key.
"""

from __future__ import annotations

import json
from typing import Any

from app.envelope import Layout, encode, new_envelope
from app.envelope.codec import encode_parts
from app.security.signing import SigningKey, sign
from tests.security.adversarial.conftest import Adversary, Attack

BILLING_SECRET = b"billing-namespace-key-0123456789"   # 32 bytes
SHADOW_SECRET = b"shadow-unscoped-key-0123456789xy"


def _env(topic: str, namespace: str = "order-events", token: str = "", publisher_id: str = "", **kw: Any):
    env = new_envelope(topic, {"order_id": "o-1", "total": 10.0}, namespace=namespace, **kw)
    sec = env.ensure_security()
    sec.data_classification = "internal"
    if token:
        sec.auth_token = token
    if publisher_id:
        sec.publisher_id = publisher_id
    return env


async def test_namespace_impersonation_with_a_valid_token(adversary: Adversary) -> None:
    keys = adversary.keys
    topo = adversary.topology()
    src = topo.sources[0].topic
    orders = keys.mint_token("svc-orders")      # a valid token for the order service
    other = keys.mint_token("svc-billing")      # a valid token for a service the topology does not bind to billing
    producer_key = keys.keyring.signing["dev-producer-1"]
    attacks = [
        Attack("control", sign(_env(src, token=orders), producer_key)),
        # the measured case: every stage passed, sinks filed it under billing / payments.captured
        Attack("billing-and-foreign-topic", encode(_env("payments.captured", "billing", orders))),
        Attack("billing-unsigned", encode(_env(src, "billing", orders))),
        Attack("billing-signed-by-own-key", sign(_env(src, "billing", orders), producer_key)),
        Attack("billing-draft-layout", encode(_env(src, "billing", orders), Layout.DRAFT)),
        Attack("billing-other-service", encode(_env(src, "billing", other))),
        Attack("billing-anonymous", encode(_env(src, "billing"))),
        # a claimed publisher_id is not a principal: only a verified token is
        Attack("billing-claimed-publisher", encode(_env(src, "billing", publisher_id="svc-billing"))),
        # the token in a header instead of the envelope
        Attack("billing-bearer-header", encode(_env(src, "billing")),
               headers=[("Authorization", f"Bearer {orders}".encode())]),
    ]
    landed = await adversary.run(topo, attacks)

    assert landed.where("control") == "v3"
    assert landed.where("billing-and-foreign-topic") == "dlq:topic_mismatch"
    for a in attacks[2:]:
        assert landed.where(a.label) == "dlq:namespace_not_allowed", a.label
        entry = landed.dlq_entry(a.label)
        assert entry.stage == "authenticate" and b"billing" in entry.headers["prism.errors.exception.message"]
        assert orders.encode() not in entry.value and other.encode() not in entry.value  # token masked
    assert len(landed.on("v3")) == 1 and len(landed.on("v2")) == 1
    assert landed.summary["dlq_reasons"] == {"topic_mismatch": 1, "namespace_not_allowed": len(attacks) - 2}


async def test_cross_topic_replay_of_signed_envelopes(adversary: Adversary) -> None:
    """Two sources of one worker: X and Y. A valid, signed, authenticated envelope for X is
    emitted from X; the identical bytes produced onto Y are a replay. So is the worker's own
    signed output of X produced back onto X or Y."""
    keys = adversary.keys

    def two_sources(doc: dict[str, Any]) -> None:
        doc["sources"].append({**doc["sources"][0], "topic": doc["sources"][0]["topic"] + "-y"})

    topo = adversary.topology(two_sources)
    x, y = (s.topic for s in topo.sources)
    token = keys.mint_token("svc-orders")
    producer_key = keys.keyring.signing["dev-producer-1"]
    genuine = sign(_env(x, token=token), producer_key)
    draft = sign(_env(x, token=token), producer_key, Layout.DRAFT)
    async with adversary.session(topo) as session:
        first = await session.send([
            Attack("genuine-on-x", genuine, topic=x),
            Attack("replay-onto-y", genuine, topic=y),
            Attack("draft-replay-onto-y", draft, topic=y),
            Attack("replay-with-header-token", sign(_env(x), producer_key), topic=y,
                   headers=[("Authorization", f"Bearer {token}".encode())]),
        ])
        assert first.where("genuine-on-x") == "v3"
        for label in ("replay-onto-y", "draft-replay-onto-y", "replay-with-header-token"):
            assert first.where(label) == "dlq:topic_mismatch", label
            entry = first.dlq_entry(label)
            assert entry.stage == "normalize" and entry.source_topic == y
        assert not first.records[f"{y}.v3"] and not first.records[f"{y}.v2"]

        # The worker's own output: signed by the worker key, valid anywhere the keyring is trusted.
        output = first.records[f"{x}.v3"][0]
        second = await session.send([
            Attack("worker-output-onto-y", output.value, topic=y),
            Attack("worker-output-onto-x", output.value, topic=x),
            Attack("control", sign(_env(x, token=token), producer_key), topic=x),
        ])
    assert second.where("worker-output-onto-y") == "dlq:topic_mismatch"
    # same topic: the signature is genuine, but the worker's key is no producer's key
    assert second.where("worker-output-onto-x") == "dlq:key_not_allowed_for_namespace"
    assert second.dlq_entry("worker-output-onto-x").stage == "verify_signature"
    assert second.where("control") == "v3"
    assert {r.key for r in second.on("v3")} == {b"genuine-on-x", b"control"}


async def test_unsigned_input_where_signatures_are_required(adversary: Adversary) -> None:
    keys = adversary.keys

    def required(doc: dict[str, Any]) -> None:
        for st in doc["stages"]:
            if "verify_signature" in st:
                st["verify_signature"]["policy"] = "required"

    topo = adversary.topology(required)
    src = topo.sources[0].topic
    token = keys.mint_token("svc-orders")
    producer_key = keys.keyring.signing["dev-producer-1"]
    stripped = _env(src, token=token)
    sign(stripped, producer_key)
    stripped.security.ClearField("signature")  # key id and algorithm kept, signature removed
    head, sec, payload = encode_parts(stripped)
    attacks = [
        Attack("control", sign(_env(src, token=token), producer_key)),
        Attack("unsigned-envelope", encode(_env(src, token=token))),
        Attack("unsigned-draft", encode(_env(src, token=token), Layout.DRAFT)),
        Attack("signature-stripped", b"".join([head, sec, *payload])),
        Attack("legacy-kafka-headers", json.dumps({"order_id": "o-2"}).encode(),
               headers=[("content-type", b"application/json"), ("Authorization", f"Bearer {token}".encode())]),
        Attack("raw-bytes", b"\x00\x01 raw bytes that carry no signature"),
    ]
    landed = await adversary.run(topo, attacks)
    assert landed.where("control") == "v3"
    for a in attacks[1:]:
        assert landed.where(a.label) == "dlq:bad_signature", a.label
        assert landed.dlq_entry(a.label).stage == "verify_signature"
    assert len(landed.on("v3")) == 1


async def test_a_signature_from_another_namespaces_key(adversary: Adversary) -> None:
    """The keyring scopes `billing-producer-1` to namespace billing; the topology's producers
    bind `shadow-key` (unrestricted in the keyring) to billing as well. Neither verifies an
    envelope claiming order-events, however valid the signature and the token."""
    keys = adversary.keys
    ring = adversary.keyring([{"id": "billing-producer-1", "secret": BILLING_SECRET, "namespaces": ["billing"]},
                              {"id": "shadow-key", "secret": SHADOW_SECRET}])

    def with_billing(doc: dict[str, Any]) -> None:
        for st in doc["stages"]:
            if "verify_signature" in st:
                st["verify_signature"]["keyring"] = str(ring)
        doc["producers"].append({"name": "billing-service", "principals": ["svc-billing"],
                                 "key_ids": ["billing-producer-1", "shadow-key"], "namespaces": ["billing"]})

    topo = adversary.topology(with_billing)
    src = topo.sources[0].topic
    billing_key = SigningKey.hmac_sha256("billing-producer-1", BILLING_SECRET)
    shadow_key = SigningKey.hmac_sha256("shadow-key", SHADOW_SECRET)
    orders_token, billing_token = keys.mint_token("svc-orders"), keys.mint_token("svc-billing")
    attacks = [
        Attack("control-orders", sign(_env(src, token=orders_token), keys.keyring.signing["dev-producer-1"])),
        Attack("control-billing", sign(_env(src, "billing", billing_token), billing_key)),
        Attack("billing-key-signs-orders", sign(_env(src, token=billing_token), billing_key)),
        Attack("billing-key-signs-orders-anonymous", sign(_env(src), billing_key)),
        Attack("billing-key-draft", sign(_env(src, token=orders_token), billing_key, Layout.DRAFT)),
        Attack("shadow-key-signs-orders", sign(_env(src, token=billing_token), shadow_key)),
        # the orders key may not sign billing either (the principal may; the key may not)
        Attack("orders-key-signs-billing", sign(_env(src, "billing", billing_token),
                                                keys.keyring.signing["dev-producer-1"])),
    ]
    landed = await adversary.run(topo, attacks)
    assert landed.where("control-orders") == "v3" and landed.where("control-billing") == "v3"
    for a in attacks[2:]:
        assert landed.where(a.label) == "dlq:key_not_allowed_for_namespace", a.label
        assert landed.dlq_entry(a.label).stage == "verify_signature"
    msg = landed.dlq_entry("billing-key-signs-orders").headers["prism.errors.exception.message"]
    assert b"scoped in the keyring to ['billing']" in msg
    assert len(landed.on("v3")) == 2
