"""app/security/producers.py alone: pattern semantics, rule unions, start-up key checks."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from app.errors import ConfigError, NamespaceNotAllowedError, PrincipalNotAllowedError, TopicNotAllowedError
from app.security.producers import ProducerBindings, check_key_ids_known, keyring_scopes, principal_pattern
from app.security.signing import load_signing_keyring
from app.topology import AuthenticateStage, ProducerSpec, Topology, VerifySignatureStage


@pytest.mark.parametrize(("glob", "yes", "no"), [
    ("svc-orders", ["svc-orders"], ["svc-orders2", "svc-order", "SVC-ORDERS", "svc-orders\n"]),
    ("svc-*", ["svc-", "svc-a", "svc-a.b/c"], ["svc", "xsvc-a", "Svc-a"]),
    ("*@example.com", ["a@example.com", "@example.com"], ["a@exampleXcom", "a@example.com.evil"]),
    ("*", ["x", "anything at all"], []),
    ("a+b(c)", ["a+b(c)"], ["aab(c)", "a+bc"]),
])
def test_only_star_is_special(glob: str, yes: list[str], no: list[str]) -> None:
    pat = principal_pattern(glob)
    assert all(pat.fullmatch(s) for s in yes)
    assert not any(pat.fullmatch(s) for s in no)


def _b(*entries: dict, sources=("orders.created", "orders.updated")) -> ProducerBindings:
    return ProducerBindings([ProducerSpec(**e) for e in entries], sources)


def test_rules_are_a_union_over_every_matching_entry() -> None:
    b = _b({"principals": ["svc-*"], "namespaces": ["shared"], "topics": ["orders.updated"]},
           {"principals": ["svc-orders"], "namespaces": ["order-events"]})
    b.check_principal("svc-orders", "order-events", "orders.updated")   # 2nd entry: every source topic
    b.check_principal("svc-orders", "shared", "orders.updated")         # 1st entry
    with pytest.raises(TopicNotAllowedError, match=re.escape("['orders.updated']")):
        b.check_principal("svc-orders", "shared", "orders.created")
    with pytest.raises(NamespaceNotAllowedError, match=re.escape("['shared']")):
        b.check_principal("svc-billing", "order-events", "orders.created")


def test_the_memo_never_lets_a_refused_claim_through() -> None:
    b = _b({"principals": ["svc-orders"], "namespaces": ["order-events"]})
    for _ in range(3):
        b.check_principal("svc-orders", "order-events", "orders.created")
        with pytest.raises(NamespaceNotAllowedError):
            b.check_principal("svc-orders", "billing", "orders.created")
    # the memo is bounded: flooding it with distinct allowed claims only clears it
    flood = _b({"principals": ["*"], "namespaces": [f"ns-{i}" for i in range(50)]})
    for i in range(10_050):
        flood.check_principal(f"p{i}", f"ns-{i % 50}", "orders.created")
    assert len(flood._seen) <= 10_001
    with pytest.raises(NamespaceNotAllowedError):
        flood.check_principal("p1", "ns-50", "orders.created")


def test_anonymous_is_not_a_principal_name() -> None:
    """A token whose sub is literally '(anonymous)' gets nothing from an anonymous entry."""
    b = _b({"anonymous": True, "namespaces": ["order-events"]})
    b.check_principal(None, "order-events", "orders.created")
    with pytest.raises(PrincipalNotAllowedError):
        b.check_principal("(anonymous)", "order-events", "orders.created")


def test_hostile_claims_are_bounded_and_escaped_in_errors() -> None:
    b = _b({"principals": ["svc-orders"], "namespaces": ["order-events"]})
    with pytest.raises(NamespaceNotAllowedError) as e:
        b.check_principal("svc-orders", "\x1b[31mbilling" + "x" * 5000, "orders.created")
    text = str(e.value)
    assert "\x1b" not in text and len(text) < 1000


def _topology(producers: list[dict]) -> Topology:
    return Topology.model_validate({
        "name": "t", "namespace": "order-events", "sources": [{"topic": "orders.created"}],
        "stages": [{"name": "normalize", "settings": {}},
                   {"name": "authenticate", "settings": AuthenticateStage(jwks="jwks.json")},
                   {"name": "verify_signature", "settings": VerifySignatureStage(keyring="signing.json")}],
        "producers": producers})


def _ring(tmp_path: Path):
    s = base64.b64encode(b"k" * 32).decode()
    path = tmp_path / "ring.json"
    path.write_text(json.dumps({"keys": [
        {"id": "orders-key", "algorithm": "hmac-sha256", "secret_b64": s},
        {"id": "billing-key", "algorithm": "hmac-sha256", "secret_b64": s, "namespaces": ["billing"]}]}))
    return load_signing_keyring(path)


def test_start_up_refuses_key_ids_the_keyring_cannot_use(tmp_path: Path) -> None:
    ring = _ring(tmp_path)
    assert keyring_scopes(ring) == {"orders-key": None, "billing-key": frozenset({"billing"})}
    topo = _topology([{"key_ids": ["orders-key", "typo-key"], "namespaces": ["order-events"]},
                      {"key_ids": ["billing-key"], "namespaces": ["order-events"]}])
    with pytest.raises(ConfigError) as e:
        check_key_ids_known(ProducerBindings.from_topology(topo), ring.verify_all.keys, keyring_scopes(ring), topo)
    text = str(e.value)
    assert "producers[0].key_ids: 'typo-key' is not a key in the signing keyring" in text
    assert "producers[1].key_ids: 'billing-key' is scoped in the keyring to ['billing']" in text
    assert e.value.code == "bad_config"
    ok = _topology([{"key_ids": ["orders-key"], "namespaces": ["order-events"]},
                    {"key_ids": ["billing-key"], "namespaces": ["billing", "x"]}])
    check_key_ids_known(ProducerBindings.from_topology(ok), ring.verify_all.keys, keyring_scopes(ring), ok)


@pytest.mark.parametrize("claimed", ["order\u2010events", "ORDER-EVENTS", "order-events ", "order-events\x00",
                                     "order-events.", ""])
def test_lookalike_namespaces_are_other_namespaces(claimed: str) -> None:
    b = _b({"principals": ["svc-orders"], "namespaces": ["order-events"]})
    with pytest.raises(NamespaceNotAllowedError):
        b.check_principal("svc-orders", claimed, "orders.created")
