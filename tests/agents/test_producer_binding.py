"""The producer bindings inside the stages, without a broker: normalize binds the envelope's
topic to its source topic, authenticate binds the verified principal, verify_signature binds
the signing key. Each broken binding raises its own error (its DLQ reason)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from app.agents.authenticate import Authenticate
from app.agents.base import Message
from app.agents.chain import Chain, Outcome
from app.agents.normalize import Normalize
from app.agents.verify_signature import VerifySignature
from app.envelope import Layout, encode, new_envelope
from app.errors import (
    KeyNamespaceError,
    KeyTopicError,
    NamespaceNotAllowedError,
    PrincipalNotAllowedError,
    TokenExpiredError,
    TopicMismatchError,
    TopicNotAllowedError,
)
from app.formats import cloudevents as ce
from app.security.producers import ProducerBindings
from app.security.signing import load_signing_keyring, sign
from app.topology import AuthenticateStage, NormalizeStage, ProducerSpec, VerifySignatureStage
from tests.agents.conftest import make_msg

SOURCES = ("orders.created", "orders.updated")
NS = {t: "order-events" for t in SOURCES}


def normalized(value: bytes, headers=None, *, topic: str = "orders.created",
               aliases: dict[str, frozenset[str]] | None = None) -> Message:
    msg = make_msg(value, headers, topic=topic)
    Normalize(NormalizeStage(), namespaces=NS, formats={t: "auto" for t in SOURCES},
              accepted_topics=aliases).process(msg)
    return msg


def env_bytes(topic: str = "orders.created", namespace: str = "order-events", layout=Layout.REVIEWED, **kw) -> bytes:
    return encode(new_envelope(topic, {"order_id": "o-1"}, namespace=namespace, **kw), layout)


# --------------------------------------------------------------------------- source topic (normalize)


@pytest.mark.parametrize("layout", list(Layout))
def test_an_envelope_must_claim_the_topic_it_was_read_from(layout) -> None:
    assert normalized(env_bytes(layout=layout)).env.topic == "orders.created"
    with pytest.raises(TopicMismatchError) as e:
        normalized(env_bytes("payments.captured", layout=layout))
    assert e.value.code == "topic_mismatch" and e.value.path == "metadata.topic"
    assert "'payments.captured'" in str(e.value) and "'orders.created'" in str(e.value)


def test_the_check_is_on_without_any_configuration() -> None:
    """Normalize built the old way (no accepted_topics) still binds every source to itself."""
    msg = make_msg(env_bytes("orders.updated"))
    stage = Normalize(NormalizeStage(), namespaces=NS, formats={})
    with pytest.raises(TopicMismatchError):
        stage.process(msg)


def test_legacy_shapes_take_the_transport_topic_whatever_they_say() -> None:
    """Only a Prism envelope carries a topic claim; a CloudEvent's type never becomes one."""
    rec = ce.to_kafka_binary(new_envelope("payments.captured", {"a": 1}, namespace="order-events"))
    assert normalized(rec.value, rec.headers).env.topic == "orders.created"


def test_legacy_input_without_a_topic_gets_the_source_topic() -> None:
    assert normalized(b'{"a":1}', [("correlation-id", b"c")], topic="orders.updated").env.topic == "orders.updated"


def test_topic_aliases_are_explicit_and_per_source() -> None:
    aliases = {"orders.created": frozenset({"orders.created", "orders.new"}),
               "orders.updated": frozenset({"orders.updated"})}
    assert normalized(env_bytes("orders.new"), aliases=aliases).env.topic == "orders.new"
    with pytest.raises(TopicMismatchError):
        normalized(env_bytes("orders.new"), topic="orders.updated", aliases=aliases)


@pytest.mark.parametrize("claimed", ["orders.created ", "Orders.created", "orders.created\x00", "orders.created.v3",
                                     "orders", "x" * 240])
def test_near_misses_are_mismatches(claimed: str) -> None:
    with pytest.raises(TopicMismatchError) as e:
        normalized(env_bytes(claimed))
    assert "\x00" not in str(e.value) and len(str(e.value)) < 800


def test_stripping_the_topic_is_no_bypass() -> None:
    """An envelope without a topic is not recognised as an envelope: it is wrapped as raw bytes
    under the source topic, so its inner claims (namespace, signature) count for nothing."""
    env = new_envelope("payments.captured", {"a": 1}, namespace="billing")
    env.metadata.ClearField("topic")
    msg = normalized(encode(env))
    assert not msg.original_is_envelope
    assert (msg.env.topic, msg.env.namespace) == ("orders.created", "order-events")


# --------------------------------------------------------------------------- principal (authenticate)


def bindings(*entries: dict) -> ProducerBindings:
    return ProducerBindings([ProducerSpec(**e) for e in entries], SOURCES)


ORDERS = {"name": "order-service", "principals": ["svc-orders"], "namespaces": ["order-events"],
          "topics": ["orders.created"]}
LEGACY = {"anonymous": True, "namespaces": ["order-events"], "topics": ["orders.created"]}


def _auth(dev_keys, producers: ProducerBindings | None, policy: str = "optional") -> Authenticate:
    settings = AuthenticateStage(policy=policy, jwks=str(dev_keys.jwks_path), issuer="https://auth.prism.dev",
                                 audience="prism", algorithms=["EdDSA"])
    return Authenticate(settings, jwks_path=str(dev_keys.jwks_path), producers=producers)


def _claiming(namespace: str, token: str = "", topic: str = "orders.created") -> Message:
    env = new_envelope(topic, {"a": 1}, namespace=namespace)
    if token:
        env.ensure_security().auth_token = token
    msg = make_msg(b"", topic=topic)
    msg.envelope = env
    return msg


def test_a_declared_principal_passes_for_its_namespace_and_topic(dev_keys) -> None:
    stage = _auth(dev_keys, bindings(ORDERS))
    msg = _claiming("order-events", dev_keys.mint_token("svc-orders"))
    stage.process(msg)
    assert msg.env.security.publisher_id == "svc-orders" and not msg.env.security.auth_token


def test_namespace_impersonation_is_refused_and_the_token_still_stripped(dev_keys) -> None:
    stage = _auth(dev_keys, bindings(ORDERS, {"principals": ["svc-billing"], "namespaces": ["billing"]}))
    msg = _claiming("billing", dev_keys.mint_token("svc-orders"))
    with pytest.raises(NamespaceNotAllowedError) as e:
        stage.process(msg)
    assert e.value.code == "namespace_not_allowed" and "['order-events']" in str(e.value)
    assert not msg.env.security.auth_token


def test_right_namespace_on_another_source_topic_is_refused(dev_keys) -> None:
    stage = _auth(dev_keys, bindings(ORDERS))
    with pytest.raises(TopicNotAllowedError) as e:
        stage.process(_claiming("order-events", dev_keys.mint_token("svc-orders"), topic="orders.updated"))
    assert e.value.code == "topic_not_allowed"


def test_an_undeclared_principal_is_refused(dev_keys) -> None:
    stage = _auth(dev_keys, bindings(ORDERS))
    with pytest.raises(PrincipalNotAllowedError) as e:
        stage.process(_claiming("order-events", dev_keys.mint_token("svc-orders-evil")))
    assert e.value.code == "principal_not_allowed" and "'svc-orders-evil'" in str(e.value)


def test_anonymous_needs_its_own_entry(dev_keys) -> None:
    with pytest.raises(PrincipalNotAllowedError, match="anonymous"):
        _auth(dev_keys, bindings(ORDERS)).process(_claiming("order-events"))
    stage = _auth(dev_keys, bindings(ORDERS, LEGACY))
    stage.process(_claiming("order-events"))
    with pytest.raises(NamespaceNotAllowedError):
        stage.process(_claiming("billing"))


def test_policy_off_never_verifies_so_every_message_is_anonymous(dev_keys) -> None:
    stage = _auth(dev_keys, bindings(ORDERS), policy="off")
    with pytest.raises(PrincipalNotAllowedError):  # a token is not evidence when it is not verified
        stage.process(_claiming("order-events", dev_keys.mint_token("svc-orders")))


def test_a_claimed_publisher_id_is_not_a_principal(dev_keys) -> None:
    """The producer may write any publisher_id into the envelope; only a verified token counts."""
    stage = _auth(dev_keys, bindings(ORDERS, LEGACY))
    msg = _claiming("billing")
    msg.env.ensure_security().publisher_id = "svc-orders"
    with pytest.raises(NamespaceNotAllowedError, match="anonymous"):
        stage.process(msg)


def test_an_invalid_token_fails_authentication_first(dev_keys) -> None:
    import time

    expired = dev_keys.mint_token("svc-orders", ttl_s=-10, now=time.time() - 3600)
    with pytest.raises(TokenExpiredError):
        _auth(dev_keys, bindings(ORDERS, LEGACY)).process(_claiming("order-events", expired))


def test_without_producers_any_verified_principal_may_claim_any_namespace(dev_keys) -> None:
    """The documented default: only the source-topic binding (normalize) applies."""
    _auth(dev_keys, None).process(_claiming("billing", dev_keys.mint_token("svc-orders")))


def test_principal_globs(dev_keys) -> None:
    stage = _auth(dev_keys, bindings({"principals": ["svc-orders-*"], "namespaces": ["order-events"]}))
    stage.process(_claiming("order-events", dev_keys.mint_token("svc-orders-eu")))
    stage.process(_claiming("order-events", dev_keys.mint_token("svc-orders-")))
    for sub in ("svc-orders", "xsvc-orders-eu", "SVC-ORDERS-EU"):
        with pytest.raises(PrincipalNotAllowedError):
            stage.process(_claiming("order-events", dev_keys.mint_token(sub)))


def test_a_dot_in_a_pattern_is_literal(dev_keys) -> None:
    stage = _auth(dev_keys, bindings({"principals": ["svc.orders"], "namespaces": ["order-events"]}))
    with pytest.raises(PrincipalNotAllowedError):
        stage.process(_claiming("order-events", dev_keys.mint_token("svcXorders")))


# --------------------------------------------------------------------------- signing key (verify_signature)


def _ring(tmp_path: Path):
    secret = base64.b64encode(b"o" * 32).decode()
    other = base64.b64encode(b"b" * 32).decode()
    path = tmp_path / "ring.json"
    path.write_text(json.dumps({"keys": [
        {"id": "orders-key", "algorithm": "hmac-sha256", "secret_b64": secret},
        {"id": "billing-key", "algorithm": "hmac-sha256", "secret_b64": other, "namespaces": ["billing"]},
        {"id": "spare-key", "algorithm": "hmac-sha256", "secret_b64": base64.b64encode(b"s" * 32).decode()},
    ]}))
    return load_signing_keyring(path)


def _verify(ring, producers: ProducerBindings | None) -> VerifySignature:
    return VerifySignature(VerifySignatureStage(policy="required", keyring="x"), keyring=ring, producers=producers)


def _signed(ring, key_id: str, namespace: str = "order-events", topic: str = "orders.created") -> Message:
    return normalized(sign(new_envelope(topic, {"a": 1}, namespace=namespace), ring.signing[key_id]), topic=topic)


def test_a_key_scoped_in_the_keyring_never_verifies_another_namespace(tmp_path: Path) -> None:
    ring = _ring(tmp_path)
    stage = _verify(ring, None)
    stage.process(_signed(ring, "billing-key", "billing"))
    with pytest.raises(KeyNamespaceError) as e:
        stage.process(_signed(ring, "billing-key", "order-events"))
    assert e.value.code == "key_not_allowed_for_namespace" and "['billing']" in str(e.value)


KEYED = [{"key_ids": ["orders-key"], "namespaces": ["order-events"], "topics": ["orders.created"]},
         {"key_ids": ["billing-key"], "namespaces": ["billing"]}]


def test_producers_key_ids_bind_keys_to_namespaces_and_topics(tmp_path: Path) -> None:
    ring = _ring(tmp_path)
    stage = _verify(ring, bindings(*KEYED))
    ok = _signed(ring, "orders-key")
    stage.process(ok)
    assert ok.signature is not None and ok.signature.key_id == "orders-key"
    with pytest.raises(KeyNamespaceError, match="may claim namespaces \\['order-events'\\]"):
        stage.process(_signed(ring, "orders-key", "billing"))  # an unrestricted keyring key, bound by producers
    with pytest.raises(KeyTopicError) as e:
        stage.process(_signed(ring, "orders-key", topic="orders.updated"))
    assert e.value.code == "key_not_allowed_for_topic"
    with pytest.raises(KeyNamespaceError, match="declared for no namespace"):
        stage.process(_signed(ring, "spare-key"))


def test_key_binding_is_off_while_no_entry_names_key_ids(tmp_path: Path) -> None:
    ring = _ring(tmp_path)
    _verify(ring, bindings(ORDERS)).process(_signed(ring, "spare-key"))


def test_a_forged_signature_is_still_bad_signature_not_a_binding_error(tmp_path: Path) -> None:
    """The key check runs on the VERIFIED key id: naming a declared key proves nothing."""
    from app.errors import SignatureError
    from app.security.signing import SigningKey

    ring = _ring(tmp_path)
    forged = normalized(sign(new_envelope("orders.created", {"a": 1}, namespace="order-events"),
                             SigningKey.hmac_sha256("orders-key", b"f" * 32)))
    with pytest.raises(SignatureError) as e:
        _verify(ring, bindings(*KEYED)).process(forged)
    assert e.value.code == "bad_signature"


def test_the_chain_routes_each_binding_to_the_dlq_with_its_reason(dev_keys, tmp_path: Path) -> None:
    ring = _ring(tmp_path)
    producers = bindings(ORDERS, LEGACY, *KEYED)
    chain = Chain([Normalize(NormalizeStage(), namespaces=NS, formats={}), _auth(dev_keys, producers),
                   _verify(ring, producers)], dlq_topic_for=lambda t: t + ".dlq")
    token = dev_keys.mint_token("svc-orders")

    def run(value: bytes, topic: str = "orders.created", headers=None) -> str:
        r = chain.run(make_msg(value, headers, topic=topic))
        return r.outcome.value if r.outcome is not Outcome.DLQ else f"{r.stage}:{r.reason}"

    env = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    env.ensure_security().auth_token = token
    good = sign(env, ring.signing["orders-key"])
    assert run(good) == "emitted"
    assert run(good, topic="orders.updated") == "normalize:topic_mismatch"
    imp = new_envelope("orders.created", {"a": 1}, namespace="billing")
    imp.ensure_security().auth_token = token
    assert run(sign(imp, ring.signing["billing-key"])) == "authenticate:namespace_not_allowed"
    anon = sign(new_envelope("orders.created", {"a": 1}, namespace="order-events"), ring.signing["billing-key"])
    assert run(anon) == "verify_signature:key_not_allowed_for_namespace"
    # the DLQ copy of the impersonation carries the reason and never the token
    r = chain.run(make_msg(sign(imp, ring.signing["billing-key"]), topic="orders.created"))
    assert r.dlq is not None and dict(r.dlq.headers)["prism.errors.reason"] == b"namespace_not_allowed"
    assert token.encode() not in r.dlq.value


def test_the_worker_builds_the_bindings_and_checks_key_ids_at_start_up(dev_keys, tmp_path: Path) -> None:
    import yaml

    from app.errors import ConfigError
    from app.topology import load_topology
    from app.worker.pipeline import build_stages

    def topo(key_ids: list[str]):
        doc = {"name": "t", "namespace": "order-events", "sources": [{"topic": "orders.created"}],
               "stages": ["normalize", {"authenticate": {"jwks": str(dev_keys.jwks_path), "policy": "optional",
                                                    "issuer": "https://auth.prism.dev", "audience": "prism",
                                                    "algorithms": ["EdDSA"]}},
                          {"verify_signature": {"keyring": str(dev_keys.signing_path)}}],
               "producers": [{"principals": ["svc-orders"], "key_ids": key_ids, "namespaces": ["order-events"]}]}
        path = tmp_path / "t.yaml"
        path.write_text(yaml.safe_dump(doc))
        return load_topology(path)

    with pytest.raises(ConfigError, match="'dev-producer-2' is not a key in the signing keyring"):
        build_stages(topo(["dev-producer-2"]), keyring=dev_keys.keyring, schema=None, dedup_window=lambda _: None)
    stages = build_stages(topo(["dev-producer-1"]), keyring=dev_keys.keyring, schema=None,
                          dedup_window=lambda _: None)
    auth, verify = stages[1], stages[2]
    assert isinstance(auth, Authenticate) and isinstance(verify, VerifySignature)
    assert auth.producers is verify.producers is not None  # one rule set, checked at both points
    chain = Chain(stages, dlq_topic_for=lambda t: t + ".dlq")
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    env.ensure_security().auth_token = dev_keys.mint_token("svc-orders")
    assert chain.run(make_msg(sign(env, dev_keys.keyring.signing["dev-producer-1"]))).outcome is Outcome.EMITTED
    worker = sign(new_envelope("orders.created", {"a": 1}, namespace="order-events"), dev_keys.keyring.worker_key())
    r = chain.run(make_msg(worker))
    assert (r.stage, r.reason) == ("authenticate", "principal_not_allowed")  # anonymous: no entry for it
