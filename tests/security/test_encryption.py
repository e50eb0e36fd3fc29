"""Payload encryption: round trips, known answers, tampering, policy, audit, rotation, KMS."""

from __future__ import annotations

import base64
import json
import logging
import socket
import struct
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto.server import ThreadedMotoServer

from app._gen.prism.envelope.v1 import envelope_pb2 as pb
from app.envelope import Envelope, Layout, convert, decode, encode, new_envelope
from app.envelope.model import Payload
from app.errors import (
    AlgorithmError,
    AuditError,
    DecryptionError,
    EncryptionError,
    KeyNotUsableError,
    PayloadError,
    UnknownKeyError,
)
from app.security.algorithms import FIPS_POLICY, AlgorithmPolicy
from app.security.encryption import (
    AAD_PREFIX,
    AuditRecord,
    build_aad,
    decrypt_envelope,
    decrypt_to_envelope,
    encrypt_envelope,
)
from app.security.keys import AwsKmsProvider, FileKeyring, KeyUse, new_key_record
from app.security.signing import SigningKey, VerificationKeys, sign, verify

FIXTURES = Path(__file__).parent / "fixtures"
KAT = json.loads((FIXTURES / "kat-envelopes.json").read_text())

ALGORITHMS = {  # algorithm -> a key id of the KAT keyring
    "aes-256-gcm": "kat-sym",
    "chacha20-poly1305": "kat-sym",
    "rsa-oaep-3072": "kat-rsa-3072",
    "rsa-oaep-4096": "kat-rsa-4096",
    "ml-kem-768": "kat-ml-kem-768",
    "ml-kem-1024": "kat-ml-kem-1024",
    "x25519-ml-kem-1024": "kat-hybrid",
}
EXPECTED_TYPE = {
    "aes-256-gcm": pb.ENCRYPTION_TYPE_SYMMETRIC,
    "chacha20-poly1305": pb.ENCRYPTION_TYPE_SYMMETRIC,
    "rsa-oaep-3072": pb.ENCRYPTION_TYPE_ASYMMETRIC,
    "rsa-oaep-4096": pb.ENCRYPTION_TYPE_ASYMMETRIC,
    "ml-kem-768": pb.ENCRYPTION_TYPE_POST_QUANTUM,
    "ml-kem-1024": pb.ENCRYPTION_TYPE_POST_QUANTUM,
    "x25519-ml-kem-1024": pb.ENCRYPTION_TYPE_HYBRID,
}
QUIET = AlgorithmPolicy(warn_non_fips=False)


def no_audit(_record: AuditRecord) -> None:
    return None


@pytest.fixture(scope="module")
def ring() -> FileKeyring:
    """The committed test keyring (TEST KEYS ONLY, see fixtures/make_kat.py)."""
    return FileKeyring.load(FIXTURES / "kat-keyring.json")


def envelope(payload: bytes = b'{"order_id": 42}', **kw: object) -> Envelope:
    return new_envelope("orders.created", payload, namespace="orders", content_type="application/json", **kw)


def encrypted(ring: FileKeyring, algorithm: str, payload: bytes = b'{"order_id": 42}', **kw: object) -> Envelope:
    env = envelope(payload, **kw)
    encrypt_envelope(env, ring, key_id=ALGORITHMS[algorithm], algorithm=algorithm, policy=QUIET, audit=no_audit)
    return env


def decrypt(env: Envelope, provider: object, **kw: object) -> bytes:
    kw.setdefault("policy", QUIET)
    kw.setdefault("audit", no_audit)
    return decrypt_envelope(env, provider, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("size", [0, 1, 300, 4000])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_round_trip_every_algorithm_both_layouts(ring: FileKeyring, algorithm: str, size: int) -> None:
    plaintext = bytes((i * 7 + 3) % 256 for i in range(size))
    env = envelope(plaintext)
    meta = encrypt_envelope(env, ring, key_id=ALGORITHMS[algorithm], algorithm=algorithm, policy=QUIET,
                            audit=no_audit)
    assert meta.algorithm == algorithm and meta.encryption_type == EXPECTED_TYPE[algorithm]
    assert meta.key_id == ALGORITHMS[algorithm]
    assert env.is_encrypted and bytes(env.payload.value) != plaintext
    assert meta.aad == build_aad(env.message_id, "orders", "orders.created", algorithm, meta.key_id)
    if meta.HasField("iv"):
        assert len(meta.iv) == 12
    for layout in Layout:
        wire = encode(env, layout)
        assert plaintext not in wire or size < 8
        back = decode(wire)
        assert back.header.security.encryption == meta
        assert decrypt(back, ring) == plaintext
    assert decrypt(env, ring) == plaintext


def test_patterns_record_what_a_consumer_needs(ring: FileKeyring) -> None:
    small, large = b"x" * 100, b"y" * 2000
    rsa_small = encrypted(ring, "rsa-oaep-3072", small).header.security.encryption
    assert json.loads(rsa_small.algorithm_params)["mode"] == "direct"
    assert not rsa_small.HasField("iv") and not rsa_small.HasField("encapsulated_key")
    assert rsa_small.public_key_id == "kat-rsa-3072.pub"
    rsa_large = encrypted(ring, "rsa-oaep-3072", large).header.security.encryption
    assert json.loads(rsa_large.algorithm_params) == {"mode": "wrapped", "oaep": "sha-256", "oaep_label": "aad",
                                                      "dem": "aes-256-gcm"}
    assert len(rsa_large.encapsulated_key) == 384  # RSA-OAEP-3072 wrapping the AES-256-GCM key
    # the RFC's limit: k/8 - 66 bytes direct, one byte more is wrapped
    assert json.loads(encrypted(ring, "rsa-oaep-4096", b"z" * 446).header.security.encryption
                      .algorithm_params)["mode"] == "direct"
    assert json.loads(encrypted(ring, "rsa-oaep-4096", b"z" * 447).header.security.encryption
                      .algorithm_params)["mode"] == "wrapped"
    pq = encrypted(ring, "ml-kem-1024").header.security.encryption
    assert len(pq.encapsulated_key) == 1568 and pq.public_key_id == "kat-ml-kem-1024.pub"
    hybrid = encrypted(ring, "x25519-ml-kem-1024").header.security.encryption
    params = json.loads(hybrid.algorithm_params)
    assert len(base64.b64decode(params["x25519_ephemeral_public"])) == 32
    assert params["kdf"] == "hkdf-sha256"
    assert base64.b64decode(params["kdf_salt"]) == b"prism-envelope/x25519-ml-kem-1024/v1"
    sym = encrypted(ring, "aes-256-gcm").header.security.encryption
    assert not sym.HasField("public_key_id") and not sym.HasField("encapsulated_key")


def test_nonces_are_fresh_per_message(ring: FileKeyring) -> None:
    ivs = {bytes(encrypted(ring, "aes-256-gcm").header.security.encryption.iv) for _ in range(200)}
    assert len(ivs) == 200


def test_current_key_is_used_when_no_key_id_is_given(ring: FileKeyring) -> None:
    for algorithm, kid in ALGORITHMS.items():
        env = envelope()
        meta = encrypt_envelope(env, ring, algorithm=algorithm, policy=QUIET, audit=no_audit)
        assert meta.key_id == kid
        assert decrypt(env, ring) == b'{"order_id": 42}'


def test_producer_with_public_keys_only_cannot_decrypt(ring: FileKeyring) -> None:
    producer = ring.public_only()
    for algorithm in ("rsa-oaep-4096", "ml-kem-768", "x25519-ml-kem-1024"):
        env = envelope()
        encrypt_envelope(env, producer, key_id=ALGORITHMS[algorithm] + ".pub", algorithm=algorithm, policy=QUIET,
                         audit=no_audit)
        with pytest.raises(KeyNotUsableError, match="no private key"):
            decrypt(env, producer)
        assert decrypt(env, ring) == b'{"order_id": 42}'


def test_decrypt_to_envelope_removes_encryption_and_signature(ring: FileKeyring) -> None:
    env = envelope(b'{"order_id": 42}' * 50, content_encoding="gzip", data_classification="restricted")
    compressed = bytes(env.payload.value)
    encrypt_envelope(env, ring, key_id="kat-sym", audit=no_audit)
    key = SigningKey.hmac_sha256("sig", b"k" * 32)
    signed = sign(env, key, Layout.DRAFT)
    assert verify(signed, VerificationKeys.of([key])).key_id == "sig"
    received = decode(signed)
    with pytest.raises(PayloadError, match="encrypted"):
        received.payload_bytes()
    assert decrypt(received, ring) == compressed  # bytes as they were before encryption
    plain = decrypt_to_envelope(received, ring, audit=no_audit)
    assert plain.payload_bytes() == b'{"order_id": 42}' * 50
    assert not plain.is_encrypted
    assert plain.security is not None and plain.security.data_classification == "restricted"
    assert not plain.security.HasField("signature") and not plain.security.HasField("signature_key_id")
    assert received.is_encrypted  # the input is not modified
    assert decode(encode(plain, Layout.DRAFT)).payload_bytes() == b'{"order_id": 42}' * 50


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_decrypts_after_draft_round_trip_and_layout_conversion(ring: FileKeyring, algorithm: str) -> None:
    env = encrypted(ring, algorithm, b"p" * 700)
    draft = encode(env, Layout.DRAFT)
    reviewed, dropped = convert(draft, Layout.REVIEWED)
    assert not [d for d in dropped if "encryption" in d]
    again, _ = convert(reviewed, Layout.DRAFT)
    for wire in (draft, reviewed, again):
        back = decode(wire)
        assert back.header.security.encryption == env.header.security.encryption
        assert decrypt(back, ring) == b"p" * 700


# --------------------------------------------------------------------------- known answers


@pytest.mark.parametrize("case", KAT["cases"], ids=[c["name"] for c in KAT["cases"]])
def test_known_answer_envelopes_decrypt(ring: FileKeyring, case: dict) -> None:
    wire = base64.b64decode(case["envelope_b64"])
    env = decode(wire)
    assert env.header.security.encryption.algorithm == case["algorithm"]
    plaintext = decrypt(env, ring, require_aad=case["require_aad"])
    assert plaintext == base64.b64decode(case["plaintext_b64"])
    if not case["require_aad"]:  # RFC-style producers set no AAD: refused unless asked for
        with pytest.raises(DecryptionError, match="aad does not match"):
            decrypt(env, ring)


def test_known_answer_set_covers_every_algorithm_layout_and_legacy_name() -> None:
    algorithms = {c["algorithm"] for c in KAT["cases"]}
    assert algorithms >= set(ALGORITHMS) | {"kyber1024", "x25519-kyber1024"}
    assert {c["layout"] for c in KAT["cases"]} == {"draft", "reviewed"}


def test_aad_bytes_match_the_documented_format() -> None:
    aad = build_aad("m-1", "orders", "orders.created", "aes-256-gcm", "key-é")
    expected = (b"prism-envelope-aad/v1\x00"
                + b"\x00\x00\x00\x03m-1"
                + b"\x00\x00\x00\x06orders"
                + b"\x00\x00\x00\x0eorders.created"
                + b"\x00\x00\x00\x0baes-256-gcm"
                + b"\x00\x00\x00\x06key-\xc3\xa9")
    assert aad == expected
    assert aad.startswith(AAD_PREFIX)
    # length prefixes keep shifted boundaries apart
    assert build_aad("ab", "c", "t", "a", "k") != build_aad("a", "bc", "t", "a", "k")
    assert struct.unpack(">I", aad[len(AAD_PREFIX):len(AAD_PREFIX) + 4]) == (3,)


# --------------------------------------------------------------------------- tampering


def flip(data: bytes, index: int = 0, bit: int = 0) -> bytes:
    b = bytearray(data)
    b[index] ^= 1 << bit
    return bytes(b)


def with_payload(env: Envelope, value: bytes) -> Envelope:
    out = env.copy()
    out.payload = Payload(value, env.payload.type_url)
    return out


def with_meta(env: Envelope, change: Callable[[pb.EncryptionMetadata], None]) -> Envelope:
    out = env.copy()
    change(out.header.security.encryption)
    return out


def set_params(meta: pb.EncryptionMetadata, **kw: object) -> None:
    params = json.loads(meta.algorithm_params)
    params.update(kw)
    meta.algorithm_params = json.dumps(params)


TAMPERS: dict[str, Callable[[Envelope], Envelope]] = {
    "ciphertext-first-bit": lambda e: with_payload(e, flip(bytes(e.payload.value), 0)),
    "tag-last-bit": lambda e: with_payload(e, flip(bytes(e.payload.value), -1, 7)),
    "truncated": lambda e: with_payload(e, bytes(e.payload.value)[:-1]),
    "extended": lambda e: with_payload(e, bytes(e.payload.value) + b"\x00"),
    "empty": lambda e: with_payload(e, b""),
    "aad": lambda e: with_meta(e, lambda m: setattr(m, "aad", flip(m.aad, -1))),
    "message-id": lambda e: (lambda o: (setattr(o.header.metadata, "message_id", "another-id"), o)[1])(e.copy()),
    "namespace": lambda e: (lambda o: (setattr(o.header.metadata, "namespace", "billing"), o)[1])(e.copy()),
    "topic": lambda e: (lambda o: (setattr(o.header.metadata, "topic", "orders.deleted"), o)[1])(e.copy()),
    "encryption-type": lambda e: with_meta(e, lambda m: setattr(m, "encryption_type",
                                                                 pb.ENCRYPTION_TYPE_HYBRID
                                                                 if m.encryption_type != pb.ENCRYPTION_TYPE_HYBRID
                                                                 else pb.ENCRYPTION_TYPE_SYMMETRIC)),
    "params-not-json": lambda e: with_meta(e, lambda m: setattr(m, "algorithm_params", "{not json")),
    "params-not-object": lambda e: with_meta(e, lambda m: setattr(m, "algorithm_params", "[1]")),
}
NONCE_TAMPERS = {
    "iv-bit": lambda e: with_meta(e, lambda m: setattr(m, "iv", flip(m.iv, 5, 3))),
    "iv-short": lambda e: with_meta(e, lambda m: setattr(m, "iv", m.iv[:8])),
    "iv-missing": lambda e: with_meta(e, lambda m: m.ClearField("iv")),
}
KEM_TAMPERS = {
    "encapsulated-key-bit": lambda e: with_meta(e, lambda m: setattr(m, "encapsulated_key", flip(m.encapsulated_key, 17))),
    "encapsulated-key-short": lambda e: with_meta(e, lambda m: setattr(m, "encapsulated_key", m.encapsulated_key[:-1])),
    "encapsulated-key-missing": lambda e: with_meta(e, lambda m: m.ClearField("encapsulated_key")),
}
HYBRID_TAMPERS = {
    "ephemeral-bit": lambda e: with_meta(e, lambda m: set_params(m, x25519_ephemeral_public=base64.b64encode(
        flip(base64.b64decode(json.loads(m.algorithm_params)["x25519_ephemeral_public"]), 3)).decode())),
    "ephemeral-missing": lambda e: with_meta(e, lambda m: setattr(m, "algorithm_params", "{}")),
    "ephemeral-not-b64": lambda e: with_meta(e, lambda m: set_params(m, x25519_ephemeral_public="@@@")),
    "ephemeral-zero": lambda e: with_meta(e, lambda m: set_params(m, x25519_ephemeral_public=base64.b64encode(
        bytes(32)).decode())),
    "kdf-other": lambda e: with_meta(e, lambda m: set_params(m, kdf="hkdf-sha1")),
}
RSA_TAMPERS = {
    "mode-other": lambda e: with_meta(e, lambda m: set_params(m, mode="raw")),
    "oaep-sha1": lambda e: with_meta(e, lambda m: set_params(m, oaep="sha-1")),
}


def tamper_cases() -> Iterator[tuple[str, int, str]]:
    for alg in sorted(ALGORITHMS):
        for size in (64, 3000):  # RSA: direct and wrapped
            names = list(TAMPERS)
            if alg.startswith(("aes", "chacha", "ml-kem", "x25519")) or size == 3000:
                names += list(NONCE_TAMPERS)
            if alg.startswith(("ml-kem", "x25519")) or (alg.startswith("rsa") and size == 3000):
                names += list(KEM_TAMPERS)
            if alg.startswith("x25519"):
                names += list(HYBRID_TAMPERS)
            if alg.startswith("rsa"):
                names += list(RSA_TAMPERS)
            for name in names:
                yield alg, size, name


ALL_TAMPERS = {**TAMPERS, **NONCE_TAMPERS, **KEM_TAMPERS, **HYBRID_TAMPERS, **RSA_TAMPERS}


@pytest.fixture(scope="module")
def sealed(ring: FileKeyring) -> dict[tuple[str, int], Envelope]:
    return {(alg, size): encrypted(ring, alg, bytes(range(256)) * (size // 256) + bytes(size % 256))
            for alg in ALGORITHMS for size in (64, 3000)}


@pytest.mark.parametrize(("algorithm", "size", "tamper"), list(tamper_cases()))
def test_tampering_raises_decryption_error(ring: FileKeyring, sealed: dict, algorithm: str, size: int,
                                           tamper: str) -> None:
    env = sealed[(algorithm, size)]
    bad = ALL_TAMPERS[tamper](env)
    for candidate in (bad, decode(encode(bad, Layout.DRAFT)), decode(encode(bad, Layout.REVIEWED))):
        with pytest.raises(DecryptionError):
            decrypt(candidate, ring)
    assert decrypt(env, ring)  # the original still decrypts


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_wrong_key_with_the_same_id_raises_decryption_error(ring: FileKeyring, algorithm: str) -> None:
    env = encrypted(ring, algorithm, b"secret order" * 40)
    kid = ALGORITHMS[algorithm]
    impostor = FileKeyring([new_key_record(kid, ring.records[kid].key_type,
                                           created=datetime(2026, 1, 1, tzinfo=UTC))])
    with pytest.raises(DecryptionError):
        decrypt(env, impostor)


def test_ciphertext_moved_to_another_envelope_is_refused(ring: FileKeyring) -> None:
    original = encrypted(ring, "aes-256-gcm")
    other = envelope(b"innocent")
    other.ensure_security().encryption.CopyFrom(original.header.security.encryption)
    other.payload = Payload(bytes(original.payload.value))
    with pytest.raises(DecryptionError, match="aad does not match") as info:
        decrypt(other, ring)
    assert info.value.path == "security.encryption.aad"
    with pytest.raises(DecryptionError, match="aad does not match"):  # a Prism-format AAD is always checked
        decrypt(other, ring, require_aad=False)


def test_key_id_swapped_to_another_key_of_the_same_type(ring: FileKeyring) -> None:
    keys = FileKeyring([new_key_record("a", "symmetric-256", created=datetime(2026, 1, 1, tzinfo=UTC)),
                        new_key_record("b", "symmetric-256", created=datetime(2026, 1, 1, tzinfo=UTC),
                                       purpose="other")])
    env = envelope()
    encrypt_envelope(env, keys, key_id="a", audit=no_audit)
    env.header.security.encryption.key_id = "b"
    with pytest.raises(DecryptionError):
        decrypt(env, keys)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_mutations_of_encrypted_envelopes_only_raise_decryption_errors(ring: FileKeyring, sealed: dict,
                                                                             data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(sealed)))
    env = sealed[key]
    meta_field = data.draw(st.sampled_from(["payload", "iv", "aad", "encapsulated_key", "algorithm_params"]))
    if meta_field == "payload":
        blob = bytes(env.payload.value)
    else:
        value = getattr(env.header.security.encryption, meta_field)
        blob = value.encode() if isinstance(value, str) else bytes(value)
    if not blob:
        return
    pos = data.draw(st.integers(0, len(blob) - 1))
    mutated = bytearray(blob)
    mutated[pos] ^= data.draw(st.integers(1, 255))
    if meta_field == "payload":
        bad = with_payload(env, bytes(mutated))
    elif meta_field == "algorithm_params":
        bad = with_meta(env, lambda m: setattr(m, meta_field, mutated.decode("utf-8", "replace")))
    else:
        bad = with_meta(env, lambda m: setattr(m, meta_field, bytes(mutated)))
    try:
        plaintext = decrypt(bad, ring)
    except DecryptionError:
        return
    # A mutation may only survive where it is not authenticated and not used: JSON params
    # whose meaning did not change (e.g. the informational kdf_salt or "dem" of ML-KEM).
    assert meta_field == "algorithm_params" and plaintext == decrypt(env, ring)


# --------------------------------------------------------------------------- policy


@pytest.mark.parametrize("algorithm", ["aes-128-gcm", "rsa-2048", "rsa-oaep-2048", "3des", "rc4", "des", "md5",
                                       "sha-1"])
def test_deprecated_algorithms_cannot_encrypt_or_decrypt(ring: FileKeyring, algorithm: str) -> None:
    env = envelope()
    with pytest.raises(AlgorithmError, match="deprecated"):
        encrypt_envelope(env, ring, key_id="kat-sym", algorithm=algorithm, audit=no_audit)
    assert not env.is_encrypted and bytes(env.payload.value) == b'{"order_id": 42}'
    received = encrypted(ring, "aes-256-gcm")
    received.header.security.encryption.algorithm = algorithm
    with pytest.raises(AlgorithmError, match="deprecated"):
        decrypt(received, ring)


def test_fips_mode_on_both_sides(ring: FileKeyring) -> None:
    for algorithm in ("chacha20-poly1305", "x25519-ml-kem-1024"):
        with pytest.raises(AlgorithmError, match="not FIPS"):
            encrypt_envelope(envelope(), ring, key_id=ALGORITHMS[algorithm], algorithm=algorithm,
                             policy=FIPS_POLICY, audit=no_audit)
        with pytest.raises(AlgorithmError, match="not FIPS"):
            decrypt(encrypted(ring, algorithm), ring, policy=FIPS_POLICY)
    for algorithm in ("aes-256-gcm", "rsa-oaep-3072", "rsa-oaep-4096", "ml-kem-768", "ml-kem-1024"):
        env = envelope()
        encrypt_envelope(env, ring, key_id=ALGORITHMS[algorithm], algorithm=algorithm, policy=FIPS_POLICY,
                         audit=no_audit)
        assert decrypt(env, ring, policy=FIPS_POLICY) == b'{"order_id": 42}'


def test_allowlist_policy_applies_to_consumers(ring: FileKeyring) -> None:
    policy = AlgorithmPolicy(allowlist={"ml-kem-1024"})
    with pytest.raises(AlgorithmError, match="allowlist"):
        decrypt(encrypted(ring, "aes-256-gcm"), ring, policy=policy)
    legacy = next(c for c in KAT["cases"] if c["algorithm"] == "kyber1024")
    assert decrypt(decode(base64.b64decode(legacy["envelope_b64"])), ring, policy=policy, require_aad=False)


def test_legacy_names_are_not_written(ring: FileKeyring) -> None:
    with pytest.raises(AlgorithmError, match="decrypt only"):
        encrypt_envelope(envelope(), ring, key_id="kat-ml-kem-1024", algorithm="kyber1024", audit=no_audit)


def test_algorithm_and_key_type_must_agree(ring: FileKeyring) -> None:
    with pytest.raises(KeyNotUsableError, match="needs a rsa-4096 key"):
        encrypt_envelope(envelope(), ring, key_id="kat-rsa-3072", algorithm="rsa-oaep-4096", audit=no_audit)
    with pytest.raises(KeyNotUsableError, match="not a symmetric one"):
        encrypt_envelope(envelope(), ring, key_id="kat-hybrid", algorithm="aes-256-gcm", audit=no_audit)
    env = encrypted(ring, "ml-kem-768")
    env.header.security.encryption.algorithm = "ml-kem-1024"
    env.header.security.encryption.aad = build_aad(env.message_id, env.namespace, env.topic, "ml-kem-1024",
                                                   "kat-ml-kem-768")
    with pytest.raises(KeyNotUsableError, match="needs a ml-kem-1024 key"):
        decrypt(env, ring)


def test_misuse_is_reported_precisely(ring: FileKeyring) -> None:
    env = encrypted(ring, "aes-256-gcm")
    with pytest.raises(EncryptionError, match="already encrypted"):
        encrypt_envelope(env, ring, audit=no_audit)
    with pytest.raises(DecryptionError, match="not encrypted"):
        decrypt(envelope(), ring)
    with pytest.raises(UnknownKeyError, match="'nope' is not in keyring"):
        encrypt_envelope(envelope(), ring, key_id="nope", audit=no_audit)
    anonymous = with_meta(env, lambda m: setattr(m, "key_id", ""))
    with pytest.raises(DecryptionError, match="key_id is empty"):
        decrypt(anonymous, ring)


# --------------------------------------------------------------------------- rotation


def test_rotation_overlap_through_envelopes() -> None:
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    now = [t0 + timedelta(days=1)]
    records = [new_key_record("orders-v1", "symmetric-256", created=t0, namespace="orders"),
               new_key_record("orders-v2", "symmetric-256", created=t0 + timedelta(days=90), namespace="orders")]
    ring = FileKeyring(records, clock=lambda: now[0])
    old = envelope()
    assert encrypt_envelope(old, ring, audit=no_audit).key_id == "orders-v1"
    now[0] = t0 + timedelta(days=92)
    new = envelope()
    assert encrypt_envelope(new, ring, audit=no_audit).key_id == "orders-v2"
    assert decrypt(old, ring) == decrypt(new, ring) == b'{"order_id": 42}'
    now[0] = t0 + timedelta(days=98)
    with pytest.raises(KeyNotUsableError, match=r"'orders-v1' retired at .* decrypt overlap ended"):
        decrypt(old, ring)
    assert decrypt(new, ring) == b'{"order_id": 42}'


# --------------------------------------------------------------------------- audit


def test_every_operation_and_key_use_is_audited_without_key_material(ring: FileKeyring) -> None:
    records: list[AuditRecord] = []
    env = envelope()
    encrypt_envelope(env, ring, algorithm="x25519-ml-kem-1024", policy=QUIET, audit=records.append)
    decrypt_envelope(env, ring, policy=QUIET, audit=records.append)
    assert [(r.operation, r.purpose, r.success) for r in records] == [
        ("key_use", "encrypt", True), ("encrypt", "", True), ("key_use", "decrypt", True), ("decrypt", "", True)]
    for r in records:
        assert (r.key_id, r.algorithm, r.message_id) == ("kat-hybrid", "x25519-ml-kem-1024", env.message_id)
        assert (r.namespace, r.topic, r.provider) == ("orders", "orders.created", "file")
        assert abs(r.timestamp - datetime.now(UTC).timestamp()) < 60
    bad = with_payload(env, flip(bytes(env.payload.value), 3))
    with pytest.raises(DecryptionError):
        decrypt_envelope(bad, ring, policy=QUIET, audit=records.append)
    assert (records[-1].operation, records[-1].success, records[-1].error) == ("decrypt", False, "decryption_failed")
    with pytest.raises(AlgorithmError):
        encrypt_envelope(envelope(), ring, algorithm="rc4", audit=records.append)
    assert (records[-1].operation, records[-1].success, records[-1].error) == (
        "encrypt", False, "algorithm_not_allowed")
    with pytest.raises(UnknownKeyError):
        encrypt_envelope(envelope(), ring, key_id="ghost", audit=records.append)
    assert [(r.operation, r.success, r.error) for r in records[-2:]] == [
        ("key_use", False, "unknown_key"), ("encrypt", False, "unknown_key")]
    dumped = json.dumps([r.to_dict() for r in records])
    private = ring.get_private_key("kat-hybrid").key
    sym = ring.get_symmetric_key("kat-sym", KeyUse.DECRYPT).secret
    for secret in (private.x25519.private_bytes_raw(), private.ml_kem.private_bytes_raw(), sym):
        assert base64.b64encode(secret).decode() not in dumped and secret.hex() not in dumped


def test_default_audit_goes_to_the_prism_audit_logger(ring: FileKeyring, caplog: pytest.LogCaptureFixture) -> None:
    env = envelope()
    with caplog.at_level(logging.INFO, logger="prism.audit"):
        encrypt_envelope(env, ring, key_id="kat-sym")
        decrypt_envelope(env, ring)
    lines = [r for r in caplog.records if r.name == "prism.audit"]
    assert [r.prism_audit["operation"] for r in lines] == ["key_use", "encrypt", "key_use", "decrypt"]
    assert all(r.prism_audit["message_id"] == env.message_id for r in lines)
    assert "decrypt ok key_id=kat-sym algorithm=aes-256-gcm message_id=" in lines[-1].getMessage()


def test_a_failing_audit_sink_refuses_the_operation(ring: FileKeyring) -> None:
    env = encrypted(ring, "aes-256-gcm")

    def broken(record: AuditRecord) -> None:
        if record.operation == "decrypt":
            raise OSError("disk full")

    with pytest.raises(AuditError, match="audit sink failed"):
        decrypt_envelope(env, ring, audit=broken)
    fresh = envelope()
    with pytest.raises(AuditError):
        encrypt_envelope(fresh, ring, key_id="kat-sym", audit=lambda r: broken(AuditRecord(**{**r.to_dict(),
                                                                                              "operation": "decrypt"})))
    assert not fresh.is_encrypted


# --------------------------------------------------------------------------- AWS KMS (moto server)


@pytest.fixture(scope="module")
def kms() -> Iterator[tuple[AwsKmsProvider, str, str]]:
    """moto's KMS as a real HTTP server on a free loopback port; boto3 talks to it over HTTP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = boto3.client("kms", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{port}",
                              aws_access_key_id="testing", aws_secret_access_key="testing",
                              config=Config(retries={"max_attempts": 1}))
        arn = client.create_key(Description="prism orders")["KeyMetadata"]["Arn"]
        alias = f"alias/prism-orders-{uuid.uuid4().hex[:12]}"  # moto's backend is shared process-wide
        client.create_alias(AliasName=alias, TargetKeyId=arn)
        yield (AwsKmsProvider(namespace_keys={"orders": alias},
                              encryption_context={"environment": "test"}, client=client), arn, f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.mark.parametrize("algorithm", ["aes-256-gcm", "chacha20-poly1305"])
def test_kms_envelope_encryption_round_trip(kms: tuple, algorithm: str) -> None:
    provider, arn, _ = kms
    records: list[AuditRecord] = []
    env = envelope(b"card=4111" * 100)
    meta = encrypt_envelope(env, provider, algorithm=algorithm, policy=QUIET, audit=records.append)
    assert meta.key_id == arn and meta.encryption_type == pb.ENCRYPTION_TYPE_SYMMETRIC
    assert json.loads(meta.algorithm_params) == {"key_wrap": "aws-kms"}
    assert len(meta.encapsulated_key) > 32
    for layout in Layout:
        back = decode(encode(env, layout))
        assert decrypt(back, provider, audit=records.append) == b"card=4111" * 100
    assert {(r.operation, r.purpose, r.provider) for r in records} == {
        ("key_use", "wrap", "aws-kms"), ("encrypt", "", "aws-kms"), ("key_use", "unwrap", "aws-kms"),
        ("decrypt", "", "aws-kms")}


def test_kms_tampering_and_context_binding(kms: tuple, ring: FileKeyring) -> None:
    provider, _, endpoint = kms
    env = envelope()
    encrypt_envelope(env, provider, audit=no_audit)
    with pytest.raises(DecryptionError):
        decrypt(with_meta(env, lambda m: setattr(m, "encapsulated_key", flip(m.encapsulated_key, -4))), provider)
    with pytest.raises(DecryptionError):
        decrypt(with_payload(env, flip(bytes(env.payload.value), 0)), provider)
    prod = AwsKmsProvider(encryption_context={"environment": "production"}, endpoint_url=endpoint,
                          region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    with pytest.raises(DecryptionError, match="KMS Decrypt refused"):
        decrypt(env, prod)
    with pytest.raises(KeyNotUsableError, match="wrapped by 'aws-kms'"):
        decrypt(env, ring)
    with pytest.raises(KeyNotUsableError, match="symmetric data keys only"):
        encrypt_envelope(envelope(), provider, algorithm="ml-kem-1024", audit=no_audit)
    with pytest.raises(UnknownKeyError, match="namespace billing"):
        encrypt_envelope(new_envelope("b", b"x", namespace="billing"), provider, audit=no_audit)
