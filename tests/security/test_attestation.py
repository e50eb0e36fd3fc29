"""DLQ identity attestations: a genuine one verifies for its record only; every alteration,
another key, another record, an old one and malformed input each fail with their own code."""

from __future__ import annotations

import base64
import json
from types import MappingProxyType

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.errors import (
    AttestationError,
    AttestationExpiredError,
    AttestationMismatchError,
    AttestationUntrustedKeyError,
    ConfigError,
)
from app.security.attestation import (
    DOMAIN,
    HEADER,
    AttestationVerifier,
    Attester,
    describe,
    header_value,
    record_digest,
    trusted_keys,
)
from app.security.jwt_auth import Identity
from app.security.signing import SigningKey, write_dev_keyring

NOW = 1_800_000_000.0
IDENTITY = Identity("orders-service", "commerce", MappingProxyType({"sub": "orders-service", "iss": "https://idp",
                                                                   "aud": ["prism"], "exp": 1_799_999_000}),
                    "idp-key-1", "EdDSA")
WORKER = SigningKey.ed25519("prism-worker-1", Ed25519PrivateKey.generate())
OTHER = SigningKey.ed25519("prism-worker-1", Ed25519PrivateKey.generate())  # same id, other key
RECORD = {"key": b"k1", "value": b"\x0a\x03abc-payload", "headers": [("content-type", b"application/json"),
                                                                    ("Authorization", b"*" * 20)]}


def attest(key: SigningKey = WORKER, identity: Identity = IDENTITY, *, now: float = NOW, **record) -> bytes:
    r = {**RECORD, **record}
    return Attester(key).header(identity, message_id="m-1", topic="orders", partition=2, offset=41,
                                now=now, **r)[1]


def verifier(max_age_s: float = 3600) -> AttestationVerifier:
    return AttestationVerifier({WORKER.key_id: WORKER.private_key.public_key()}, max_age_s=max_age_s)


def check(raw: bytes, *, now: float = NOW + 10, message_id: str = "m-1", topic: str = "orders", **record):
    r = {**RECORD, **record}
    return verifier().verify(raw, message_id=message_id, topic=topic, now=now, **r)


def resign(raw: bytes, edit, key: SigningKey = WORKER) -> bytes:
    """The attestation with its body edited by `edit(doc)`, signed again by `key`."""
    body = json.loads(base64.urlsafe_b64decode(raw.split(b".")[0] + b"=="))
    edit(body)
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    sig = key.private_key.sign(DOMAIN + data)
    return b".".join(base64.urlsafe_b64encode(x).rstrip(b"=") for x in (data, sig))


def test_genuine_attestation_gives_back_the_identity() -> None:
    att = check(attest())
    assert att.identity.publisher_id == "orders-service" and att.identity.publisher_team == "commerce"
    assert dict(att.identity.claims)["aud"] == ["prism"] and att.identity.key_id == "idp-key-1"
    assert (att.message_id, att.topic, att.partition, att.offset, att.key_id) == ("m-1", "orders", 2, 41,
                                                                                  "prism-worker-1")


def test_error_context_headers_and_the_attestation_itself_are_outside_the_digest() -> None:
    raw = attest()
    replayed = [*RECORD["headers"], (HEADER, raw)]  # what the worker sees after replay
    assert check(raw, headers=replayed).identity.publisher_id == "orders-service"
    with_context = [*RECORD["headers"], ("prism.errors.reason", b"policy_violation")]
    assert record_digest(b"k1", with_context) == record_digest(b"k1", RECORD["headers"])


def test_signed_by_another_key_with_the_same_id_is_invalid() -> None:
    with pytest.raises(AttestationError) as e:
        check(attest(OTHER))
    assert e.value.code == "attestation_invalid"


def test_identity_edited_after_signing_is_invalid() -> None:
    raw = attest()
    body, sig = raw.split(b".")
    doc = json.loads(base64.urlsafe_b64decode(body + b"=="))
    doc["publisher_id"] = "payments-admin"
    forged = base64.urlsafe_b64encode(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).rstrip(b"=")
    with pytest.raises(AttestationError) as e:
        check(forged + b"." + sig)
    assert e.value.code == "attestation_invalid"


def test_untrusted_key_id_is_refused_before_any_verification() -> None:
    stranger = SigningKey.ed25519("someone-else", Ed25519PrivateKey.generate())
    with pytest.raises(AttestationUntrustedKeyError) as e:
        check(attest(stranger))
    assert e.value.code == "attestation_untrusted_key"


@pytest.mark.parametrize("change", [
    {"value": b"\x0a\x03abc-payloaX"},
    {"key": b"k2"},
    {"key": None},
    {"headers": [("content-type", b"application/json")]},
    {"headers": [("Authorization", b"*" * 20), ("content-type", b"application/json")]},  # order matters
    {"message_id": "m-2"},
    {"topic": "payments"},
])
def test_a_genuine_attestation_on_another_record_is_a_mismatch(change: dict) -> None:
    with pytest.raises(AttestationMismatchError) as e:
        check(attest(), **change)
    assert e.value.code == "attestation_mismatch"


def test_age_limit_and_future_issue_time() -> None:
    raw = attest(now=NOW)
    assert check(raw, now=NOW + 3600).message_id == "m-1"
    with pytest.raises(AttestationExpiredError):
        check(raw, now=NOW + 3601)
    with pytest.raises(AttestationExpiredError):
        check(raw, now=NOW - 3600)


@pytest.mark.parametrize("raw", [
    b"", b"not-an-attestation", b"a.b.c", b"\xff\xfe.abc", b"!!!.abc", b"x" * 20_000,
    base64.urlsafe_b64encode(b"[1,2]").rstrip(b"=") + b".AAAA",
    base64.urlsafe_b64encode(b'{"v":1}').rstrip(b"=") + b".AAAA",
    base64.urlsafe_b64encode(b"[" * 100_00).rstrip(b"=") + b".AAAA",
    base64.urlsafe_b64encode(b'{"a":' * 900 + b"1" + b"}" * 900).rstrip(b"=") + b".AAAA",
])
def test_malformed_attestations_are_invalid_and_never_echoed(raw: bytes) -> None:
    with pytest.raises(AttestationError) as e:
        check(raw)
    assert e.value.code == "attestation_invalid"
    if len(raw) > 8:
        assert raw.decode(errors="replace")[:40] not in str(e.value)


@pytest.mark.parametrize("edit", [
    lambda d: d.update(v=2),
    lambda d: d.update(partition=True),
    lambda d: d.update(claims=[]),
    lambda d: d.update(extra=1),
    lambda d: d.pop("iat_ms"),
    lambda d: d.update(publisher_id=""),
])
def test_well_signed_but_wrong_shape_is_invalid(edit) -> None:
    with pytest.raises(AttestationError) as e:
        check(resign(attest(), edit))
    assert e.value.code == "attestation_invalid"


def test_two_attestation_headers_are_refused() -> None:
    raw = attest()
    assert header_value([(HEADER, raw)]) == raw and header_value([("x", b"1")]) is None
    with pytest.raises(AttestationError):
        header_value([(HEADER, raw), (HEADER, raw)])


def test_only_ed25519_worker_keys_can_be_trusted(tmp_path) -> None:
    ring = write_dev_keyring(tmp_path / "k.json")
    assert set(trusted_keys(ring, [], default="prism-worker-1")) == {"prism-worker-1"}
    old = SigningKey.ed25519("prism-worker-0", Ed25519PrivateKey.generate())  # rotated out: public half
    ring.verify_all.add(old.verification_key())
    assert set(trusted_keys(ring, ["prism-worker-0"], default="prism-worker-1")) == {"prism-worker-0",
                                                                                     "prism-worker-1"}
    with pytest.raises(ConfigError, match="hmac-sha256"):
        trusted_keys(ring, ["dev-producer-1"], default=None)  # a producer key must never vouch
    with pytest.raises(ConfigError, match="not in the keyring"):
        trusted_keys(ring, ["nope"], default=None)
    with pytest.raises(ConfigError):
        Attester(ring.signing["dev-producer-1"])
    with pytest.raises(ConfigError):
        AttestationVerifier({})


def test_describe_shows_claims_for_display_only() -> None:
    shown = describe(attest())
    assert shown is not None and shown["publisher_id"] == "orders-service" and shown["kid"] == "prism-worker-1"
    assert describe(b"\xff") is None and describe(b"!!.x") is None and describe(b"W10.x") is None  # [] body


def test_verdict_says_whether_a_listed_identity_is_genuine() -> None:
    """`prism dlq list|show` and the console show the attested identity. The header is one a
    producer can set: a forged `publisher_id` was listed as if attested. The verdict is the
    replay's own check, for display."""
    from app.security.attestation import verdict

    def say(raw: bytes, v: AttestationVerifier | None = verifier(), topic: str = "orders") -> str:
        return verdict(raw, v, topic=topic, now=NOW + 10, **RECORD)

    assert say(attest()) == "verified"
    forged = say(attest(OTHER))
    assert forged.startswith("NOT verified: ") and "signature does not verify" in forged
    assert say(attest(), topic="payments").startswith("NOT verified: attestation is for source topic")
    assert say(b"!!.x").startswith("NOT verified: ")
    assert say(attest(), None) == "not checked: no worker key here"
    assert verdict(attest(), None, topic="orders", unchecked="why", **RECORD) == "not checked: why"
    assert verdict(attest(), verifier(), topic="orders", now=NOW + 7200, **RECORD).startswith(
        "NOT verified: attestation is 7200 s old")
