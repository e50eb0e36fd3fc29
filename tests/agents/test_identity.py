"""The identity rule (app/agents/identity.py), through the chain the worker builds for the
shipped topology and the publisher that signs its outputs - no broker.

* a spoofed svc-orders identity from a producer with no credential, through every input shape
  (tests/security/adversarial/spoofs.py), comes out with no publisher, method `none`, and the
  claim visible under `prism.claimed.*`, in both layouts, under a valid worker signature;
* a verified JWT, a key bound to a publisher and a DLQ attestation each establish the identity
  (method token / key / attestation), and a differing claim is kept beside it;
* a producer cannot pre-state the worker-owned extensions;
* the classification floor raises an unauthenticated producer's classification before the
  policy stage (so a floor that requires encryption is enforced), never an authenticated one's;
* the keyring binding and the topology floor are validated at load.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.agents.base import Message
from app.agents.chain import Chain, Outcome, Result
from app.agents.identity import (
    CLAIMED_CLASSIFICATION,
    CLAIMED_PUBLISHER_ID,
    CLAIMED_PUBLISHER_TEAM,
    KEY_ID_EXTENSION,
    METHOD_EXTENSION,
    IdentityRule,
    SettleIdentity,
    insert_identity_stage,
    settle,
    stated_publisher,
)
from app.agents.publish import Publisher
from app.envelope import Envelope, Layout, decode, encode, new_envelope
from app.errors import ConfigError
from app.formats.detect import InputShape
from app.security.attestation import AttestationVerifier, Attester, trusted_keys
from app.security.devkeys import DevKeys
from app.security.jwt_auth import Identity
from app.security.signing import SigningKey, VerificationKeys, load_signing_keyring, sign, verify
from app.tables.dedup import DedupWindow
from app.topology import Topology, load_topology
from app.worker.pipeline import build_stages
from tests.security.adversarial.spoofs import EVERY_SHAPE, NO_METADATA, PUBLISHER, TEAM, Spoof
from tests.worker.conftest import make_topology

SHADOW = SigningKey.hmac_sha256("shadow-key", b"shadow-unbound-key-0123456789xyz")


class Pipeline:
    """The shipped topology's chain (as `build_stages` makes it) and publisher, run in-process."""

    def __init__(self, tmp_path: Path, keys: DevKeys, edit: Callable[[dict[str, Any]], None] | None = None,
                 keyring_path: Path | None = None) -> None:
        self.topology = _topology(tmp_path, keys, edit, keyring_path)
        self.keyring = load_signing_keyring(keyring_path or keys.signing_path)
        worker = self.keyring.worker_key()
        assert worker is not None
        self.attester = Attester(worker)
        stages = build_stages(self.topology, keyring=self.keyring, schema=None,
                              dedup_window=lambda w: DedupWindow({}, window=w),
                              attestations=AttestationVerifier(trusted_keys(self.keyring, [], default=worker.key_id)))
        self.chain = Chain(stages, dlq_topic_for=lambda t: t + ".dlq")
        self.publisher = Publisher(self.topology, worker_key=worker)
        self.worker_keys = VerificationKeys.of([worker])
        self.topic = self.topology.sources[0].topic
        self.offset = 0

    def run(self, value: bytes, headers: list[tuple[str, bytes]] | None = None, *, key: bytes = b"k",
            topic: str | None = None) -> tuple[Result, dict[str, Envelope]]:
        """The chain's result and, when emitted, each output layout's envelope (signature checked)."""
        self.offset += 1
        msg = Message(topic=topic or self.topic, partition=0, offset=self.offset, value=value, key=key,
                      headers=list(headers or []), timestamp_ms=int(time.time() * 1000))
        result = self.chain.run(msg)
        if result.outcome is not Outcome.EMITTED:
            return result, {}
        out: dict[str, Envelope] = {}
        for e in self.publisher.emissions(msg):
            suffix = e.topic.rsplit(".", 1)[1]
            layout = Layout.DRAFT if suffix == "v2" else Layout.REVIEWED
            verify(e.record.value, self.worker_keys, layout=layout)  # the worker vouches for these bytes
            out[suffix] = decode(e.record.value)
            names = {k.lower() for k, _ in e.record.headers}
            assert not names & {"publisher-id", "publisher-team", "x-publisher-id", "x-publisher-team",
                                "data-classification", "x-data-classification"}, names
        assert set(out) == {"v2", "v3"}
        return result, out


def _topology(tmp_path: Path, keys: DevKeys, edit: Callable[[dict[str, Any]], None] | None,
              keyring_path: Path | None) -> Topology:
    make_topology(tmp_path, keys, partitions=1)  # writes tmp_path/topology.yaml, edited here
    path = tmp_path / "topology.yaml"
    doc = yaml.safe_load(path.read_text())
    if keyring_path is not None:
        for st in doc["stages"]:
            if "verify_signature" in st:
                st["verify_signature"]["keyring"] = str(keyring_path)
    if edit is not None:
        edit(doc)
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


def _ext(env: Envelope, key: str) -> str | None:
    raw = env.extensions.get(key)
    return None if raw is None else raw.decode()


def _identity(env: Envelope) -> tuple[str, str, str | None]:
    sec = env.security
    return (sec.publisher_id if sec else "", sec.publisher_team if sec else "", _ext(env, METHOD_EXTENSION))


def _shadow_keyring(tmp_path: Path, keys: DevKeys) -> Path:
    """The dev keyring plus `shadow-key`: trusted for every namespace, bound to no publisher."""
    doc = json.loads(keys.signing_path.read_text())
    doc["keys"].append({"id": SHADOW.key_id, "algorithm": "hmac-sha256",
                        "secret_b64": base64.b64encode(SHADOW.secret or b"").decode()})
    path = tmp_path / "shadow-keyring.json"
    path.write_text(json.dumps(doc))
    return path


def _declare_shadow(doc: dict[str, Any]) -> None:
    """`producers:` binds key ids once any entry names one: declare the shadow key."""
    doc["producers"][1]["key_ids"] = [SHADOW.key_id]


# --------------------------------------------------------------------------- spoofs, every shape


def test_the_spoof_list_covers_every_shape_that_carries_metadata() -> None:
    assert {s.shape for s in EVERY_SHAPE} | NO_METADATA == set(InputShape)


@pytest.mark.parametrize("spoof", EVERY_SHAPE, ids=lambda s: s.label)
def test_a_spoofed_identity_comes_out_unverified_in_every_shape(tmp_path: Path, dev_keys: DevKeys,
                                                               spoof: Spoof) -> None:
    # an LNMP `source` must be one of the source's known_sources (on in the shipped topology):
    # the spoofer is a known LNMP service claiming someone else's identity
    p = Pipeline(tmp_path, dev_keys, edit=lambda doc: doc["sources"][0].setdefault("lnmp", {}).update(
        known_sources=[*doc["sources"][0].get("lnmp", {}).get("known_sources", []), PUBLISHER]))
    value, headers = spoof.build(p.topic)
    result, out = p.run(value, headers)
    assert result.outcome is Outcome.EMITTED, result
    for layout, env in out.items():
        assert _identity(env) == ("", "", "none"), (spoof.label, layout)
        assert not env.security.HasField("publisher_id") and not env.security.HasField("publisher_team")
        assert _ext(env, CLAIMED_PUBLISHER_ID) == PUBLISHER, layout
        assert _ext(env, CLAIMED_PUBLISHER_TEAM) == (TEAM if spoof.claims_team else None), layout
        assert _ext(env, KEY_ID_EXTENSION) is None


def test_a_signature_by_a_key_bound_to_no_publisher_does_not_vouch_for_the_claim(tmp_path: Path,
                                                                                  dev_keys: DevKeys) -> None:
    p = Pipeline(tmp_path, dev_keys, _declare_shadow, keyring_path=_shadow_keyring(tmp_path, dev_keys))
    env = new_envelope(p.topic, {"order_id": "o-1"}, namespace="order-events", data_classification="internal")
    env.ensure_security().publisher_id = PUBLISHER
    result, out = p.run(sign(env, SHADOW))
    assert result.outcome is Outcome.EMITTED, result
    for env_out in out.values():
        assert _identity(env_out) == ("", "", "none")
        assert _ext(env_out, CLAIMED_PUBLISHER_ID) == PUBLISHER


def test_a_producer_cannot_pre_state_the_worker_owned_extensions(tmp_path: Path, dev_keys: DevKeys) -> None:
    p = Pipeline(tmp_path, dev_keys)
    env = new_envelope(p.topic, {"order_id": "o-1"}, namespace="order-events", data_classification="internal")
    env.ensure_security().publisher_id = PUBLISHER
    env.extensions[METHOD_EXTENSION] = b"token"
    env.extensions[KEY_ID_EXTENSION] = b"dev-producer-1"
    env.extensions[CLAIMED_PUBLISHER_ID] = b"someone-else"
    env.extensions["prism.claimed.anything"] = b"x"
    env.extensions["prism.identity.verified"] = b"yes"
    env.extensions["header.kept"] = b"kept"
    _, out = p.run(encode(env))
    for env_out in out.values():
        ext = dict(env_out.extensions)
        assert {k for k in ext if k.startswith(("prism.identity.", "prism.claimed."))} == {
            METHOD_EXTENSION, CLAIMED_PUBLISHER_ID}
        assert ext[METHOD_EXTENSION] == b"none" and ext[CLAIMED_PUBLISHER_ID] == PUBLISHER.encode()
        assert ext["header.kept"] == b"kept"


# --------------------------------------------------------------------------- verified identities


def test_a_verified_token_establishes_the_identity_and_a_differing_claim_is_kept(tmp_path: Path,
                                                                                dev_keys: DevKeys) -> None:
    p = Pipeline(tmp_path, dev_keys)
    env = new_envelope(p.topic, {"order_id": "o-1"}, namespace="order-events", data_classification="internal")
    sec = env.ensure_security()
    sec.auth_token = dev_keys.mint_token("svc-orders", team="commerce")
    sec.publisher_id, sec.publisher_team = "svc-mallory", "commerce"
    _, out = p.run(encode(env))
    for env_out in out.values():
        assert _identity(env_out) == ("svc-orders", "commerce", "token")
        assert _ext(env_out, CLAIMED_PUBLISHER_ID) == "svc-mallory"
        assert _ext(env_out, CLAIMED_PUBLISHER_TEAM) is None  # the claim matched the token

    # the same token in a Kafka header, the claim in the legacy headers
    _, out = p.run(b'{"order_id": "o-2"}', [("publisher-id", b"svc-orders"), ("publisher-team", b"billing"),
                                            ("Authorization", f"Bearer {dev_keys.mint_token('svc-orders')}".encode())])
    for env_out in out.values():
        assert _identity(env_out) == ("svc-orders", "commerce", "token")
        assert _ext(env_out, CLAIMED_PUBLISHER_ID) is None
        assert _ext(env_out, CLAIMED_PUBLISHER_TEAM) == "billing"


def test_a_key_bound_to_a_publisher_establishes_that_publisher(tmp_path: Path, dev_keys: DevKeys) -> None:
    assert dev_keys.keyring.publishers["dev-producer-1"].publisher_id == "svc-orders"
    p = Pipeline(tmp_path, dev_keys)
    producer = dev_keys.keyring.signing["dev-producer-1"]
    for claimed in ("", "svc-orders", "svc-mallory"):
        env = new_envelope(p.topic, {"order_id": "o-1"}, namespace="order-events", data_classification="internal")
        if claimed:
            env.ensure_security().publisher_id = claimed
        result, out = p.run(sign(env, producer))
        assert result.outcome is Outcome.EMITTED, result
        for env_out in out.values():
            assert _identity(env_out) == ("svc-orders", "commerce", "key")
            assert _ext(env_out, KEY_ID_EXTENSION) == "dev-producer-1"
            assert _ext(env_out, CLAIMED_PUBLISHER_ID) == (claimed if claimed == "svc-mallory" else None)


def test_a_dlq_attestation_establishes_the_identity(tmp_path: Path, dev_keys: DevKeys) -> None:
    p = Pipeline(tmp_path, dev_keys)
    env = new_envelope(p.topic, {"order_id": "o-1"}, namespace="order-events", data_classification="internal")
    env.ensure_security().publisher_id = "svc-mallory"
    value = encode(env)
    who = Identity("svc-orders", "commerce", {}, "dev-issuer-1", "EdDSA")
    att = p.attester.header(who, message_id=env.message_id, topic=p.topic, partition=0, offset=0, key=b"k",
                            value=value, headers=[])
    result, out = p.run(value, [att])
    assert result.outcome is Outcome.EMITTED, result
    for env_out in out.values():
        assert _identity(env_out) == ("svc-orders", "commerce", "attestation")
        assert _ext(env_out, CLAIMED_PUBLISHER_ID) == "svc-mallory"


# --------------------------------------------------------------------------- classification floor


def _floor(level: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        doc["sources"][0]["classification_floor"] = level
    return edit


def test_an_unauthenticated_producer_cannot_go_below_the_floor(tmp_path: Path, dev_keys: DevKeys) -> None:
    p = Pipeline(tmp_path, dev_keys, _floor("internal"))
    # the reported case: a Kafka header saying public, from an anonymous producer
    _, out = p.run(b'{"order_id": "o-1"}', [("data-classification", b"public"), ("publisher-id", b"svc-orders")])
    for env_out in out.values():
        assert env_out.security.data_classification == "internal"
        assert _ext(env_out, CLAIMED_CLASSIFICATION) == "public"
        assert _identity(env_out) == ("", "", "none")
    # none stated: the floor
    _, out = p.run(b'{"order_id": "o-2"}', [("content-type", b"application/json")])
    for env_out in out.values():
        assert env_out.security.data_classification == "internal"
        assert _ext(env_out, CLAIMED_CLASSIFICATION) is None
    # above the floor: kept
    _, out = p.run(b'{"order_id": "o-3"}', [("X-Data-Classification", b"internal"), ("Nats-Msg-Id", b"n-3")])
    for env_out in out.values():
        assert env_out.security.data_classification == "internal"
        assert _ext(env_out, CLAIMED_CLASSIFICATION) is None


def test_an_authenticated_producer_states_its_own_classification(tmp_path: Path, dev_keys: DevKeys) -> None:
    p = Pipeline(tmp_path, dev_keys, _floor("internal"))
    token = dev_keys.mint_token("svc-orders")
    _, out = p.run(b'{"order_id": "o-1"}', [("data-classification", b"public"),
                                            ("Authorization", f"Bearer {token}".encode())])
    assert {e.security.data_classification for e in out.values()} == {"public"}
    env = new_envelope(p.topic, {"order_id": "o-2"}, namespace="order-events", data_classification="public")
    _, out = p.run(sign(env, dev_keys.keyring.signing["dev-producer-1"]))
    assert {e.security.data_classification for e in out.values()} == {"public"}
    assert {_ext(e, CLAIMED_CLASSIFICATION) for e in out.values()} == {None}


def test_the_floor_is_raised_before_the_policy_stage(tmp_path: Path, dev_keys: DevKeys) -> None:
    """A floor the policy requires encryption for: an anonymous producer's unencrypted public
    message is raised to it, and then refused by the policy like any confidential message."""
    p = Pipeline(tmp_path, dev_keys, _floor("confidential"))
    result, _ = p.run(b'{"order_id": "o-1"}', [("data-classification", b"public")])
    assert (result.outcome, result.stage, result.reason) == (Outcome.DLQ, "policy", "policy_violation")
    names = [s.name for s in p.chain.stages]
    assert names.index("identity") == names.index("verify_signature") + 1 < names.index("policy")


# --------------------------------------------------------------------------- the rule's parts


def test_the_identity_stage_runs_after_the_verifiers_in_any_chain() -> None:
    class Named(SettleIdentity):
        def __init__(self, name: str) -> None:
            super().__init__(IdentityRule())
            self.name = name  # type: ignore[misc]

    def order(*names: str) -> list[str]:
        return [s.name for s in insert_identity_stage([Named(n) for n in names], IdentityRule())]

    assert order("normalize", "validate", "authenticate", "verify_signature", "policy", "dedup", "enrich") == [
        "normalize", "validate", "authenticate", "verify_signature", "identity", "policy", "dedup", "enrich"]
    assert order("normalize", "policy") == ["normalize", "identity", "policy"]
    assert order("normalize", "authenticate") == ["normalize", "authenticate", "identity"]


def test_the_publisher_settles_a_message_no_chain_settled(dev_keys: DevKeys) -> None:
    from tests.agents.conftest import make_msg

    topo = Topology(name="t", namespace="ns", sources=[{"topic": "orders.created",
                                                         "classification_floor": "internal"}],
                    stages=[{"name": "normalize", "settings": {}}])
    pub = Publisher(topo, worker_key=dev_keys.keyring.worker_key())
    msg = make_msg(b"")
    msg.envelope = new_envelope("orders.created", {"a": 1}, namespace="ns", data_classification="public")
    msg.env.ensure_security().publisher_id = PUBLISHER
    out = [decode(e.record.value) for e in pub.emissions(msg)]
    for env in out:
        assert _identity(env) == ("", "", "none") and _ext(env, CLAIMED_PUBLISHER_ID) == PUBLISHER
        assert env.security.data_classification == "internal"
    settled = msg.env.extensions[METHOD_EXTENSION]
    settle(msg, IdentityRule(floors={"orders.created": "restricted"}))  # once only
    assert msg.env.extensions[METHOD_EXTENSION] == settled and msg.env.security.data_classification == "internal"


def test_stated_publisher_is_the_verified_one_else_the_claim() -> None:
    env = new_envelope("t", {"a": 1}, namespace="ns")
    assert stated_publisher(env) == ""
    env.extensions[CLAIMED_PUBLISHER_ID] = b"sensor-gw"
    assert stated_publisher(env) == "sensor-gw"
    env.ensure_security().publisher_id = "svc-orders"
    assert stated_publisher(env) == "svc-orders"


# --------------------------------------------------------------------------- start-up validation


def _keyring_file(tmp_path: Path, dev_keys: DevKeys, change: Callable[[dict[str, Any]], None]) -> Path:
    doc = json.loads(dev_keys.signing_path.read_text())
    change(doc)
    path = tmp_path / "k.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda d: d["keys"][0].pop("publisher_id"), "`publisher_id` must be a non-empty string"),
    (lambda d: d["keys"][0].update(publisher_id=""), "`publisher_id` must be a non-empty string"),
    (lambda d: d["keys"][0].update(publisher_id=7), "`publisher_id` must be a non-empty string"),
    (lambda d: d["keys"][0].update(publisher_team=" commerce"), "`publisher_team` must be a non-empty string"),
    (lambda d: d["keys"][1].update(publisher_id="svc-orders"), "the worker key signs for every publisher"),
])
def test_the_keyring_refuses_a_malformed_or_misplaced_publisher_binding(tmp_path: Path, dev_keys: DevKeys,
                                                                       change, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_signing_keyring(_keyring_file(tmp_path, dev_keys, change))


def test_a_key_without_a_binding_binds_nothing(tmp_path: Path, dev_keys: DevKeys) -> None:
    def unbind(d: dict[str, Any]) -> None:
        d["keys"][0].pop("publisher_id")
        d["keys"][0].pop("publisher_team")
    assert load_signing_keyring(_keyring_file(tmp_path, dev_keys, unbind)).publishers == {}


def test_the_topology_refuses_an_unknown_floor(tmp_path: Path, dev_keys: DevKeys) -> None:
    with pytest.raises(ConfigError, match=r"sources\[0\]\.classification_floor: Input should be .public., .internal."):
        _topology(tmp_path, dev_keys, _floor("secret"), None)
    assert _topology(tmp_path, dev_keys, _floor("confidential"), None).sources[0].classification_floor == \
        "confidential"
