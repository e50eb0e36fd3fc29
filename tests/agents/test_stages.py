"""Each stage alone, without a broker: success path and every rejection it owns."""

import time

import pytest

from app.agents.authenticate import Authenticate
from app.agents.dedup import Dedup
from app.agents.enrich import Enrich, SchemaInfo
from app.agents.normalize import Normalize
from app.agents.policy import Policy
from app.agents.validate import Validate
from app.agents.verify_signature import VerifySignature
from app.envelope import Layout, decode, encode, new_envelope
from app.envelope.model import Payload
from app.errors import (
    AlgorithmError,
    AuthError,
    DuplicateError,
    EncryptionClaimError,
    ExpiredError,
    FormatError,
    PolicyError,
    SignatureError,
    TokenExpiredError,
    ValidationError,
)
from app.security.signing import SigningKey, sign
from app.tables.dedup import DedupWindow
from app.topology import (
    AuthenticateStage,
    NormalizeStage,
    PolicyStage,
    ValidateStage,
    VerifySignatureStage,
)
from tests.agents.conftest import envelope_bytes, make_msg

NS = {"orders.created": "order-events"}


def normalized(value, headers=None, fmt="auto", key=None):
    msg = make_msg(value, headers, key=key)
    Normalize(NormalizeStage(), namespaces=NS, formats={"orders.created": fmt}).process(msg)
    return msg


def test_normalize_envelope_and_legacy_and_declared_format():
    env, data = envelope_bytes()
    msg = normalized(data)
    assert msg.original_is_envelope and msg.env.message_id == env.message_id
    legacy = normalized(b'{"a":1}', [("correlation-id", b"c-1"), ("Authorization", b"Bearer tok-123456789")])
    assert not legacy.original_is_envelope
    assert legacy.env.metadata.correlation_id == "c-1" and legacy.env.namespace == "order-events"
    assert legacy.secrets == [b"tok-123456789"]  # remembered only to scrub DLQ copies
    with pytest.raises(FormatError, match="declared as 'prism'"):
        normalized(b'{"a":1}', fmt="prism")


def test_normalize_reads_an_absent_security_context_as_empty_and_leaves_it_absent():
    """normalize reads the token and the publisher off `header.security` without asking
    whether it is there: an absent one must read as empty and stay absent (the envelope, as
    encoded later, gains no empty security record)."""
    env = new_envelope("orders.created", b"{}", namespace="order-events")
    assert not env.header.HasField("security")
    data = encode(env)
    msg = normalized(data)
    assert msg.claimed == ("", "") and msg.secrets == []
    assert not msg.env.header.HasField("security") and encode(msg.env) == data
    signed = new_envelope("orders.created", b"{}", namespace="order-events")
    sec = signed.ensure_security()
    sec.publisher_id, sec.publisher_team, sec.auth_token = "svc-a", "team-a", "opaque-token-1234"
    msg = normalized(encode(signed))
    assert msg.claimed == ("svc-a", "team-a") and msg.secrets == [b"opaque-token-1234"]


def test_normalize_seeds_a_generated_id_with_the_records_topic_partition_and_offset():
    """The stage's seed is formatted lazily (only a shape that may need an id calls it): the id
    it generates is the one the formatted seed gives, the same on a redelivery of the record,
    another at another offset."""
    from app.formats.detect import normalize

    msg = make_msg(b"raw bytes, no id", offset=41)
    Normalize(NormalizeStage(), namespaces=NS, formats={"orders.created": "auto"}).process(msg)
    assert msg.generated_id
    expected = normalize(b"raw bytes, no id", topic="orders.created", namespace="order-events",
                         now_ms=msg.timestamp_ms, id_seed=b"orders.created/0/41").envelope.message_id
    assert msg.env.message_id == expected
    again = make_msg(b"raw bytes, no id", offset=41)
    again.timestamp_ms = msg.timestamp_ms
    Normalize(NormalizeStage(), namespaces=NS, formats={"orders.created": "auto"}).process(again)
    assert again.env.message_id == expected
    other = make_msg(b"raw bytes, no id", offset=42)
    other.timestamp_ms = msg.timestamp_ms
    Normalize(NormalizeStage(), namespaces=NS, formats={"orders.created": "auto"}).process(other)
    assert other.env.message_id != expected


def test_validate_rejects_with_every_problem():
    env, _ = envelope_bytes(published_at_ms=int(time.time() * 1000) + 3_600_000)
    env.metadata.message_id = "x" * 300
    msg = make_msg(b"")
    msg.envelope = env
    with pytest.raises(ValidationError) as e:
        Validate(ValidateStage()).process(msg)
    assert {p.path for p in e.value.problems} == {"metadata.published_at_ms", "metadata.message_id"}


def _auth(dev_keys, policy="required"):
    return Authenticate(AuthenticateStage(policy=policy, jwks=str(dev_keys.jwks_path), issuer="https://auth.prism.dev",
                                          audience="prism", algorithms=["EdDSA"]), jwks_path=str(dev_keys.jwks_path))


def _with_token(token):
    env, _ = envelope_bytes()
    env.ensure_security().auth_token = token
    msg = make_msg(b"")
    msg.envelope = env
    return msg


def test_authenticate_sets_identity_and_strips_token(dev_keys):
    stage = _auth(dev_keys)
    msg = _with_token(dev_keys.mint_token("svc-orders", team="commerce"))
    stage.process(msg)
    sec = msg.env.security
    assert (sec.publisher_id, sec.publisher_team) == ("svc-orders", "commerce")
    assert not sec.HasField("auth_token")
    stage.process(_with_token(dev_keys.mint_token("svc-orders", team="commerce")))  # cached path too


def test_authenticate_cache_forgets_tokens_of_a_key_removed_from_the_jwks(dev_keys, tmp_path):
    """A cached token must not outlive its key: once the JWKS file drops the key (rotation after
    a leak), the same token is refused, without waiting for the cache entry to expire."""
    import json
    import shutil

    from app.errors import AuthError

    jwks = tmp_path / "jwks.json"
    shutil.copy(dev_keys.jwks_path, jwks)
    stage = Authenticate(AuthenticateStage(policy="required", jwks=str(jwks), issuer="https://auth.prism.dev",
                                           audience="prism", algorithms=["EdDSA"]), jwks_path=str(jwks))
    stage.authenticator.keyring.reload_interval_seconds = 0  # re-check the file on every message
    token = dev_keys.mint_token("svc-orders")
    stage.process(_with_token(token))
    stage.process(_with_token(token))  # served from the cache
    jwks.write_text(json.dumps({"keys": []}))  # the key is revoked
    with pytest.raises(AuthError, match="not in the JWKS"):
        stage.process(_with_token(token))


@pytest.mark.parametrize(
    ("token_of", "error"),
    [
        (lambda k: k.mint_token("svc", ttl_s=-10, now=time.time() - 3600), TokenExpiredError),
        (lambda k: k.mint_token("svc", audience="someone-else"), AuthError),
        (lambda k: "not.a.jwt", AuthError),
        (lambda k: "", AuthError),
    ],
    ids=["expired", "wrong-audience", "garbage", "missing"],
)
def test_authenticate_rejections_still_strip_the_token(dev_keys, token_of, error):
    msg = _with_token(token_of(dev_keys))
    with pytest.raises(error):
        _auth(dev_keys).process(msg)
    assert not msg.env.security.auth_token


def test_authenticate_optional_policy_passes_unauthenticated(dev_keys):
    msg = _with_token("")
    _auth(dev_keys, "optional").process(msg)


def test_verify_signature_paths(dev_keys):
    stage = VerifySignature(VerifySignatureStage(policy="required", keyring="x"), keyring=dev_keys.keyring)
    good = dev_keys.keyring.signing["dev-producer-1"]
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    msg = normalized(sign(env, good))
    stage.process(msg)
    assert msg.signature.key_id == "dev-producer-1"
    forged = normalized(sign(new_envelope("orders.created", {"a": 1}, namespace="order-events"),
                             SigningKey.hmac_sha256("dev-producer-1", b"f" * 32)))
    with pytest.raises(SignatureError, match="forged or tampered"):
        stage.process(forged)
    with pytest.raises(SignatureError, match="carries no signature"):
        stage.process(normalized(b'{"legacy":true}', [("correlation-id", b"1")]))
    optional = VerifySignature(VerifySignatureStage(policy="optional", keyring="x"), keyring=dev_keys.keyring)
    optional.process(normalized(b'{"legacy":true}', [("correlation-id", b"1")]))


def test_signature_key_scoped_to_other_namespace_is_refused(tmp_path):
    import base64
    import json

    from app.errors import KeyNamespaceError
    from app.security.signing import load_signing_keyring

    path = tmp_path / "k.json"
    secret = base64.b64encode(b"s" * 32).decode()
    path.write_text(json.dumps({"keys": [{"id": "billing", "algorithm": "hmac-sha256", "secret_b64": secret,
                                          "namespaces": ["billing"]}]}))
    ring = load_signing_keyring(path)
    stage = VerifySignature(VerifySignatureStage(policy="required", keyring="x"), keyring=ring)
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    with pytest.raises(KeyNamespaceError) as e:  # the key is known; the claim is not its namespace
        stage.process(normalized(sign(env, ring.signing["billing"])))
    assert e.value.code == "key_not_allowed_for_namespace"


def _policy_msg(**kw):
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events", **kw)
    msg = make_msg(b"")
    msg.envelope = env
    return msg


def test_policy_expiry_priority_classification_algorithms():
    p = Policy(PolicyStage())
    msg = _policy_msg()
    p.process(msg)
    assert msg.env.priority == 5 and msg.env.metadata.HasField("priority")
    with pytest.raises(ExpiredError):
        p.process(_policy_msg(ttl_seconds=1, published_at_ms=int(time.time() * 1000) - 5000))
    with pytest.raises(PolicyError, match="restricted data must be encrypted"):
        p.process(_policy_msg(data_classification="restricted"))
    enc = _policy_msg(data_classification="restricted")
    e = enc.env.ensure_security().encryption
    e.key_id, e.algorithm = "k", "aes-128-gcm"
    with pytest.raises(AlgorithmError):
        p.process(enc)
    e.algorithm = "aes-256-gcm"
    with pytest.raises(EncryptionClaimError):  # an algorithm and a key id over plaintext: not a ciphertext
        p.process(enc)
    e.iv = bytes(12)
    enc.env.payload = Payload(bytes(40), enc.env.payload.type_url)  # the shape aes-256-gcm produces
    p.process(enc)
    with pytest.raises(AlgorithmError):
        fips = _policy_msg(data_classification="restricted")
        f = fips.env.ensure_security().encryption
        f.key_id, f.algorithm = "k", "chacha20-poly1305"
        Policy(PolicyStage(fips_mode=True)).process(fips)


def test_dedup_window():
    stage = Dedup(DedupWindow({}, window=60))
    first = _policy_msg()
    stage.process(first)
    again = _policy_msg(message_id=first.env.message_id)
    with pytest.raises(DuplicateError):
        stage.process(again)


def test_dedup_pending_ids_outlive_their_batch_until_it_ends():
    """The worker overlaps batches: batch 2 runs the chain before batch 1's ids are recorded,
    so batch 1's ids must stay pending (and only they leave when batch 1 ends)."""
    stage = Dedup(DedupWindow({}, window=60))
    b1 = stage.begin_batch()
    first = _policy_msg()
    stage.process(first)
    b2 = stage.begin_batch()
    with pytest.raises(DuplicateError):
        stage.process(_policy_msg(message_id=first.env.message_id))  # batch 1 not recorded yet
    second = _policy_msg()
    stage.process(second)
    stage.record_emitted(first)
    stage.end_batch(b1)
    assert first.env.message_id not in stage.pending and second.env.message_id in stage.pending
    with pytest.raises(DuplicateError):
        stage.process(_policy_msg(message_id=first.env.message_id))  # now the window has it
    stage.end_batch(b2)  # batch 2's outputs failed: its id is free again for the redelivery
    stage.begin_batch()
    stage.process(_policy_msg(message_id=second.env.message_id))


def test_enrich_trace_and_schema():
    stage = Enrich(trace=True, schema=SchemaInfo(url="file:///s.proto", version="v2", format="protobuf",
                                                 hash="sha256:ab", name="OrderCreated", pii_fields=("email",)))
    msg = _policy_msg()
    obs = msg.env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1
    stage.process(msg)
    o = msg.env.observability
    assert o.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and o.parent_span_id == "00f067aa0ba902b7"
    assert o.span_id != "00f067aa0ba902b7"
    assert msg.env.schema.schema_version == "v2" and msg.env.security.contains_pii
    fresh = _policy_msg()
    stage.process(fresh)
    assert len(fresh.env.observability.trace_id) == 32  # a new trace was started


def test_layout_roundtrip_after_stages():
    msg = _policy_msg()
    Policy(PolicyStage()).process(msg)
    assert decode(encode(msg.env, Layout.DRAFT)).priority == 5
