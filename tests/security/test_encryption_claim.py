"""`check_encryption_claim`: a payload that claims to be encrypted must have the shape its
algorithm produces (issue 31 item 4; docs/encryption.md, "Claims of encryption").

Every algorithm the policy allows, each as Prism writes it (must pass: nothing that decrypts
today may be refused) and each broken the ways a producer or an attacker breaks it: the
issue's case (an algorithm and a key id over plaintext), truncated, empty and over-long fields,
swapped fields, a label naming another algorithm, an AAD of another envelope, broken params.
Random metadata (hypothesis) gives a spec or a `PrismError`, nothing else."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app._gen.prism.envelope.draft import envelope_pb2 as dpb
from app._gen.prism.envelope.v1 import envelope_pb2 as pb
from app.envelope import Envelope, Layout, decode, encode, new_envelope
from app.envelope.model import Payload
from app.errors import AlgorithmError, DecryptionError, EncryptionClaimError, PrismError
from app.security.algorithms import APPROVED, FIPS_POLICY, AlgorithmPolicy
from app.security.encryption import (
    AuditRecord,
    build_aad,
    check_encryption_claim,
    decrypt_envelope,
    encrypt_envelope,
    envelope_aad,
)
from app.security.keys import FileKeyring

FIXTURES = Path(__file__).parent / "fixtures"
KAT = json.loads((FIXTURES / "kat-envelopes.json").read_text())
QUIET = AlgorithmPolicy(warn_non_fips=False)
KEYS = {  # every algorithm the policy allows -> a key of the committed test keyring
    "aes-256-gcm": "kat-sym",
    "chacha20-poly1305": "kat-sym",
    "rsa-oaep-3072": "kat-rsa-3072",
    "rsa-oaep-4096": "kat-rsa-4096",
    "ml-kem-768": "kat-ml-kem-768",
    "ml-kem-1024": "kat-ml-kem-1024",
    "x25519-ml-kem-1024": "kat-hybrid",
}
CANARY = b"canary-4111-1111-1111-1111"
#: A payload large enough that RSA wraps it (AES-256-GCM under an RSA-encapsulated key).
LARGE = b'{"card":"' + CANARY + b'","pad":"' + b"x" * 600 + b'"}'


def no_audit(_record: AuditRecord) -> None:
    return None


@pytest.fixture(scope="module")
def ring() -> FileKeyring:
    """The committed test keyring (TEST KEYS ONLY, see fixtures/make_kat.py)."""
    return FileKeyring.load(FIXTURES / "kat-keyring.json")


def plain(payload: bytes = b'{"card":"' + CANARY + b'"}') -> Envelope:
    return new_envelope("orders.created", payload, namespace="orders", content_type="application/json",
                        data_classification="confidential")


def encrypted(ring: FileKeyring, algorithm: str, payload: bytes | None = None) -> Envelope:
    env = plain() if payload is None else plain(payload)
    encrypt_envelope(env, ring, key_id=KEYS[algorithm], algorithm=algorithm, policy=QUIET, audit=no_audit)
    return env


def claim(env: Envelope) -> pb.EncryptionMetadata:
    return env.header.security.encryption


def refused(env: Envelope, *fragments: str) -> EncryptionClaimError:
    """The claim is refused with one typed error that names what is wrong, where, and the fix,
    and never quotes the payload."""
    with pytest.raises(EncryptionClaimError) as info:
        check_encryption_claim(env, QUIET)
    err = info.value
    assert err.code == "encryption_claim_invalid" and err.path and err.hint
    text = str(err)
    assert CANARY not in text.encode()
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return err


# --------------------------------------------------------------------------- what passes


@pytest.mark.parametrize("payload", [b"", b"x", LARGE], ids=["empty", "one-byte", "large"])
@pytest.mark.parametrize("algorithm", sorted(KEYS))
def test_every_algorithm_as_prism_writes_it_passes_in_both_layouts(ring: FileKeyring, algorithm: str,
                                                                  payload: bytes) -> None:
    """Nothing that decrypts today is refused: an empty plaintext (a bare tag), one byte, RSA
    direct and wrapped, every pattern, after a round trip through either wire layout."""
    env = encrypted(ring, algorithm, payload)
    assert check_encryption_claim(env, QUIET).name == algorithm
    for layout in Layout:
        back = decode(encode(env, layout))
        assert check_encryption_claim(back, QUIET).name == algorithm
        assert decrypt_envelope(back, ring, policy=QUIET, audit=no_audit) == payload


@pytest.mark.parametrize("case", KAT["cases"], ids=[c["name"] for c in KAT["cases"]])
def test_every_known_answer_envelope_passes(case: dict) -> None:
    """The known-answer envelopes - Prism's, the ones built from the docs alone, and the legacy
    RFC-031 forms without AAD - are on the wire already: each must pass."""
    env = decode(base64.b64decode(case["envelope_b64"]))
    assert check_encryption_claim(env, QUIET).name == case["algorithm"]


def test_a_kms_wrapped_data_key_passes_and_needs_its_wrapped_key() -> None:
    """Symmetric with `key_wrap` (AWS KMS envelope encryption): a KMS CiphertextBlob of its own
    size in `encapsulated_key`; without it no consumer could unwrap the data key."""
    env = plain()
    meta = env.ensure_security().encryption
    meta.algorithm, meta.key_id, meta.encryption_type = "aes-256-gcm", "arn:aws:kms:eu-west-1:1:key/k", 1
    meta.algorithm_params, meta.encapsulated_key, meta.iv = '{"key_wrap":"aws-kms"}', bytes(184), bytes(12)
    meta.aad = envelope_aad(env, meta.algorithm, meta.key_id)
    env.payload = Payload(bytes(64), "")
    assert check_encryption_claim(env, QUIET).name == "aes-256-gcm"
    meta.ClearField("encapsulated_key")
    refused(env, "encapsulated_key is missing: key_wrap 'aws-kms' needs the wrapped data key")
    meta.encapsulated_key = bytes(184)
    meta.algorithm_params = '{"key_wrap":["aws-kms"]}'
    refused(env, "key_wrap is ['aws-kms'], not the name of a key service")


# --------------------------------------------------------------------------- what is refused


@pytest.mark.parametrize("algorithm", sorted(KEYS))
def test_the_reported_case_an_algorithm_and_a_key_id_over_plaintext(algorithm: str) -> None:
    env = plain()
    meta = env.ensure_security().encryption
    meta.algorithm, meta.key_id = algorithm, KEYS[algorithm]
    err = refused(env, f"the payload claims {algorithm} encryption")
    assert "problem(s)" in err.message


def _aead_algorithms() -> list[str]:
    return sorted(KEYS)  # RSA below is made to wrap (LARGE), so every pattern has an iv and a tag


@pytest.mark.parametrize("algorithm", _aead_algorithms())
@pytest.mark.parametrize("iv_len", [0, 1, 11, 13, 16, 24])
def test_an_iv_of_the_wrong_length(ring: FileKeyring, algorithm: str, iv_len: int) -> None:
    env = encrypted(ring, algorithm, LARGE)
    claim(env).iv = bytes(iv_len)
    refused(env, f"security.encryption.iv is {iv_len} bytes", "12-byte nonce")


@pytest.mark.parametrize("algorithm", _aead_algorithms())
@pytest.mark.parametrize("size", [0, 1, 15])
def test_a_payload_shorter_than_the_tag(ring: FileKeyring, algorithm: str, size: int) -> None:
    env = encrypted(ring, algorithm, LARGE)
    env.payload = Payload(bytes(env.payload.value)[:size], env.payload.type_url)
    refused(env, f"payload is {size} bytes", "16-byte tag")


ENCAPSULATED = {"rsa-oaep-3072": 384, "rsa-oaep-4096": 512, "ml-kem-768": 1088, "ml-kem-1024": 1568,
                "x25519-ml-kem-1024": 1568}


@pytest.mark.parametrize("algorithm", sorted(ENCAPSULATED))
@pytest.mark.parametrize("change", ["empty", "truncated", "one-more", "other-parameter-set"])
def test_an_encapsulated_key_of_the_wrong_size(ring: FileKeyring, algorithm: str, change: str) -> None:
    env = encrypted(ring, algorithm, LARGE)
    key = bytes(claim(env).encapsulated_key)
    assert len(key) == ENCAPSULATED[algorithm]
    other = {384: 512, 512: 384, 1088: 1568, 1568: 1088}[len(key)]
    new = {"empty": b"", "truncated": key[:-1], "one-more": key + b"\x00", "other-parameter-set": bytes(other)}[change]
    claim(env).encapsulated_key = new
    refused(env, f"security.encryption.encapsulated_key is {len(new)} bytes")


@pytest.mark.parametrize("algorithm", ["ml-kem-768", "ml-kem-1024", "x25519-ml-kem-1024", "rsa-oaep-4096"])
def test_swapped_iv_and_encapsulated_key(ring: FileKeyring, algorithm: str) -> None:
    env = encrypted(ring, algorithm, LARGE)
    meta = claim(env)
    meta.iv, meta.encapsulated_key = bytes(meta.encapsulated_key), bytes(meta.iv)
    refused(env, "security.encryption.iv is", "security.encryption.encapsulated_key is 12 bytes")


@pytest.mark.parametrize("algorithm", ["aes-256-gcm", "chacha20-poly1305"])
def test_a_symmetric_claim_with_a_kem_ciphertext_fits_another_algorithm(ring: FileKeyring, algorithm: str) -> None:
    """An IV in the key field, or a KEM ciphertext under a symmetric label: symmetric without
    `key_wrap` carries no wrapped key."""
    env = encrypted(ring, algorithm)
    claim(env).encapsulated_key = claim(env).iv
    refused(env, "encapsulated_key is 12 bytes", "the fields fit another algorithm")


def test_rsa_direct_is_exactly_one_block(ring: FileKeyring) -> None:
    for algorithm, block in (("rsa-oaep-3072", 384), ("rsa-oaep-4096", 512)):
        env = encrypted(ring, algorithm)  # small payload: direct mode
        assert json.loads(claim(env).algorithm_params)["mode"] == "direct"
        assert len(env.payload.value) == block
        for size in (0, block - 1, block + 1, 3 * block):
            env.payload = Payload(bytes(size), "")
            refused(env, f"payload is {size} bytes; {algorithm} in direct mode is exactly one {block}-byte RSA block")
        claim(env).ClearField("algorithm_params")  # no params: direct, as the RFC's Go code writes it
        env.payload = Payload(bytes(block), "")
        assert check_encryption_claim(env, QUIET).name == algorithm


@pytest.mark.parametrize("params, fragment", [
    ('{"mode":"stream"}', "mode is 'stream'; rsa-oaep-4096 knows direct and wrapped"),
    ('{"mode":"wrapped","oaep":"sha-1"}', "oaep is 'sha-1'; only sha-256 is used"),
    ('{"mode":"wrapped","dem":"aes-128-gcm"}', "dem is 'aes-128-gcm'; only aes-256-gcm is used"),
    ('{"mode":', "algorithm_params is not valid JSON"),
    ('["mode","wrapped"]', "algorithm_params is a JSON list, not an object"),
    ("[" * 50_000, "algorithm_params is not valid JSON"),
])
def test_rsa_params_that_no_consumer_follows(ring: FileKeyring, params: str, fragment: str) -> None:
    env = encrypted(ring, "rsa-oaep-4096", LARGE)
    claim(env).algorithm_params = params
    refused(env, fragment)


@pytest.mark.parametrize("params, fragment", [
    ({"kdf": "hkdf-sha512"}, "kdf is 'hkdf-sha512'"),
    ({"x25519_ephemeral_public": None}, "x25519_ephemeral_public is missing or not base64"),
    ({"x25519_ephemeral_public": "not base64!"}, "x25519_ephemeral_public is missing or not base64"),
    ({"x25519_ephemeral_public": base64.b64encode(bytes(31)).decode()}, "x25519_ephemeral_public is 31 bytes"),
    ({"x25519_ephemeral_public": 42}, "x25519_ephemeral_public is missing or not base64"),
])
def test_hybrid_params_that_no_consumer_follows(ring: FileKeyring, params: dict, fragment: str) -> None:
    env = encrypted(ring, "x25519-ml-kem-1024")
    current = json.loads(claim(env).algorithm_params)
    current.update(params)
    claim(env).algorithm_params = json.dumps({k: v for k, v in current.items() if v is not None})
    refused(env, fragment)


@pytest.mark.parametrize("algorithm", sorted(KEYS))
def test_a_label_naming_another_algorithm_is_refused(ring: FileKeyring, algorithm: str) -> None:
    """Each algorithm's metadata as Prism writes it, relabelled as every other algorithm: the
    `encryption_type` and the AAD (which binds the algorithm) name the real one, and most
    shapes differ too."""
    for other in sorted(KEYS):
        if other == algorithm:
            continue
        env = encrypted(ring, algorithm, LARGE)
        claim(env).algorithm = other
        refused(env, f"the payload claims {other} encryption")


def test_a_relabel_with_a_recomputed_aad_is_refused_where_the_shapes_differ(ring: FileKeyring) -> None:
    """The AAD is public: a forger recomputes it for the new label and clears the type. The
    shapes still differ, except between the two symmetric AEADs (12-byte nonce, 16-byte tag
    each) and a hybrid relabelled ML-KEM-1024 (the same 1568-byte ciphertext): those pass the
    check and fail at the consumer, which only the consumer's key can tell (docs)."""
    same_shape = {("aes-256-gcm", "chacha20-poly1305"), ("chacha20-poly1305", "aes-256-gcm"),
                  ("x25519-ml-kem-1024", "ml-kem-1024")}
    for algorithm in sorted(KEYS):
        for other in sorted(KEYS):
            if other == algorithm:
                continue
            env = encrypted(ring, algorithm, LARGE)
            meta = claim(env)
            meta.algorithm = other
            meta.ClearField("encryption_type")
            meta.aad = envelope_aad(env, other, meta.key_id)
            if (algorithm, other) in same_shape:
                assert check_encryption_claim(env, QUIET).name == other
                with pytest.raises(PrismError):  # the consumer's decryption is what tells
                    decrypt_envelope(env, ring, policy=QUIET, audit=no_audit)
            else:
                refused(env, f"the payload claims {other} encryption")


@pytest.mark.parametrize("value", [1, 2, 3, 4, 5, 99, 2**31 - 1])
def test_an_encryption_type_of_another_pattern_or_none_known(ring: FileKeyring, value: int) -> None:
    env = encrypted(ring, "ml-kem-768")
    claim(env).encryption_type = value
    if value == pb.ENCRYPTION_TYPE_POST_QUANTUM:
        assert check_encryption_claim(env, QUIET).name == "ml-kem-768"
        return
    name = pb.EncryptionType.Name(value) if value in pb.EncryptionType.values() else str(value)
    refused(env, f"security.encryption.encryption_type is {name}, but ml-kem-768 is ENCRYPTION_TYPE_POST_QUANTUM")


def test_an_unknown_encryption_type_is_a_decryption_error_not_a_crash(ring: FileKeyring) -> None:
    """Before: `EncryptionType.Name(99)` raised ValueError out of `decrypt_envelope`."""
    env = encrypted(ring, "aes-256-gcm")
    claim(env).encryption_type = 99
    with pytest.raises(DecryptionError, match="encryption_type 99 does not match"):
        decrypt_envelope(env, ring, policy=QUIET, audit=no_audit)
    claim(env).encryption_type = 1
    claim(env).algorithm_params = "[" * 50_000  # before: RecursionError
    with pytest.raises(DecryptionError, match="not valid JSON"):
        decrypt_envelope(env, ring, policy=QUIET, audit=no_audit)


def test_the_aad_of_another_envelope_is_refused(ring: FileKeyring) -> None:
    """A genuine ciphertext moved into another envelope: Prism's AAD names the other message."""
    donor = encrypted(ring, "aes-256-gcm")
    env = plain()
    env.ensure_security().encryption.CopyFrom(claim(donor))
    env.payload = Payload(bytes(donor.payload.value), "")
    refused(env, "security.encryption.aad is Prism's binding of another message id")
    env.header.metadata.message_id = donor.message_id  # the same id: then it is that envelope's claim
    assert check_encryption_claim(env, QUIET).name == "aes-256-gcm"
    claim(env).aad = b"rfc-style-aad"  # not Prism's format: the legacy interop the consumer may allow
    assert check_encryption_claim(env, QUIET).name == "aes-256-gcm"


def test_an_empty_key_id_is_refused(ring: FileKeyring) -> None:
    env = encrypted(ring, "ml-kem-1024")
    claim(env).key_id = ""
    claim(env).aad = envelope_aad(env, "ml-kem-1024", "")
    refused(env, "security.encryption.key_id is empty")


def test_every_problem_is_reported_at_once(ring: FileKeyring) -> None:
    env = encrypted(ring, "x25519-ml-kem-1024")
    meta = claim(env)
    meta.iv, meta.encapsulated_key, meta.encryption_type = b"", b"", pb.ENCRYPTION_TYPE_SYMMETRIC
    env.payload = Payload(b"", "")
    err = refused(env, "(4 problem(s))", "encryption_type is ENCRYPTION_TYPE_SYMMETRIC", "encapsulated_key is 0",
                  "iv is 0", "payload is 0")
    assert err.path == "security.encryption.encryption_type"


def test_a_refused_algorithm_stays_an_algorithm_error(ring: FileKeyring) -> None:
    """What held before still holds: the algorithm is checked first, with its own reason."""
    env = plain()
    meta = env.ensure_security().encryption
    for name in ("aes-128-gcm", "rsa-oaep-2048", "3des", "", "rot13"):
        meta.algorithm, meta.key_id = name, "k"
        with pytest.raises(AlgorithmError):
            check_encryption_claim(env, QUIET)
    with pytest.raises(AlgorithmError):
        check_encryption_claim(encrypted(ring, "chacha20-poly1305"), FIPS_POLICY)
    with pytest.raises(AlgorithmError):
        check_encryption_claim(encrypted(ring, "ml-kem-768"), AlgorithmPolicy(allowlist={"ml-kem-1024"}))


def test_an_envelope_without_a_claim_is_refused_by_name() -> None:
    with pytest.raises(EncryptionClaimError, match="claims no encryption"):
        check_encryption_claim(plain(), QUIET)


def test_the_draft_layout_carries_the_fields_the_check_reads(ring: FileKeyring) -> None:
    """The draft layout holds the rev-2 fields in `prism.enc.*` extensions: read back, they are
    checked like the reviewed fields, and a draft envelope without them (a draft-only producer's
    algorithm, key id and iv) is missing its encapsulated key."""
    env = encrypted(ring, "ml-kem-1024")
    wire = encode(env, Layout.DRAFT)
    assert check_encryption_claim(decode(wire), QUIET).name == "ml-kem-1024"
    draft = dpb.PrismEnvelope.FromString(wire)
    for key in [k for k in draft.extensions if k.startswith("prism.enc.")]:
        del draft.extensions[key]
    refused(decode(draft.SerializeToString()), "encapsulated_key is 0 bytes; a ml-kem-1024 ciphertext is 1568 bytes")


# --------------------------------------------------------------------------- random metadata


_ALGORITHM_NAMES = st.sampled_from([*APPROVED, "kyber768", "kyber1024", "x25519-kyber1024", "AES_256_GCM",
                                    "aes-128-gcm", "", "rsa-2048"]) | st.text(max_size=20)
_PARAM_VALUES = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.lists(st.integers(), max_size=2)
_PARAMS = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.dictionaries(st.sampled_from(["mode", "oaep", "dem", "kdf", "key_wrap", "x25519_ephemeral_public", "kem"]),
                    _PARAM_VALUES | st.sampled_from(["direct", "wrapped", "sha-256", "aes-256-gcm", "hkdf-sha256",
                                                     "aws-kms", base64.b64encode(bytes(32)).decode()]),
                    max_size=4).map(json.dumps),
)
_LENGTHS = st.sampled_from([0, 1, 11, 12, 13, 15, 16, 32, 384, 512, 1088, 1568])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(algorithm=_ALGORITHM_NAMES, key_id=st.text(max_size=8), etype=st.integers(0, 2**31 - 1) | st.integers(0, 5),
       iv=st.none() | _LENGTHS, encapsulated=st.none() | _LENGTHS, payload=_LENGTHS, params=_PARAMS,
       aad=st.sampled_from(["none", "own", "other", "foreign"]), layout=st.sampled_from(list(Layout)))
def test_random_metadata_gives_a_spec_or_a_prism_error(algorithm: str, key_id: str, etype: int, iv: int | None,
                                                       encapsulated: int | None, payload: int, params: str | None,
                                                       aad: str, layout: Layout) -> None:
    env = plain()
    meta = env.ensure_security().encryption
    meta.algorithm, meta.key_id, meta.encryption_type = algorithm, key_id, etype
    if iv is not None:
        meta.iv = bytes(iv)
    if encapsulated is not None:
        meta.encapsulated_key = bytes(encapsulated)
    if params is not None:
        meta.algorithm_params = params
    if aad == "own":
        meta.aad = envelope_aad(env, algorithm, key_id)
    elif aad == "other":
        meta.aad = build_aad("another-id", "orders", "orders.created", algorithm, key_id)
    elif aad == "foreign":
        meta.aad = b"\x00foreign"
    env.payload = Payload(bytes(payload), "")
    candidates = [env, decode(encode(env, layout))]  # and what the worker reads from the wire
    for candidate in candidates:
        try:
            spec = check_encryption_claim(candidate, QUIET)
        except PrismError as exc:
            assert exc.code in {"encryption_claim_invalid", "algorithm_not_allowed"}, exc.code
            assert exc.path and exc.hint
            continue
        got = candidate.header.security.encryption  # what passed has the shape its algorithm produces
        assert got.key_id and got.encryption_type in (pb.ENCRYPTION_TYPE_UNSPECIFIED, spec.encryption_type)
        if spec.pattern == "asymmetric" and json.loads(got.algorithm_params or "{}").get("mode", "direct") == "direct":
            assert len(candidate.payload.value) == (spec.rsa_bits or 0) // 8
        else:
            assert len(got.iv) == 12 and len(candidate.payload.value) >= 16


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(algorithm=st.sampled_from(sorted(KEYS)), field=st.sampled_from(["iv", "encapsulated_key", "payload", "aad",
                                                                       "algorithm_params", "key_id"]),
       cut=st.integers(0, 40), extra=st.binary(max_size=20))
def test_random_damage_to_a_real_claim_is_caught_or_harmless(ring: FileKeyring, algorithm: str, field: str,
                                                             cut: int, extra: bytes) -> None:
    """A real claim with one field shortened and/or extended: the check refuses it (typed) or
    passes it, never anything else; a changed iv or encapsulated-key length, or a payload
    shorter than the tag, is always refused."""
    env = encrypted(ring, algorithm, LARGE if "rsa" in algorithm else None)
    meta = claim(env)
    if field == "payload":
        before = bytes(env.payload.value)
        env.payload = Payload(before[:max(0, len(before) - cut)] + extra, "")
        after = bytes(env.payload.value)
    elif field in ("algorithm_params", "key_id"):
        before = getattr(meta, field).encode()
        after = before[:max(0, len(before) - cut)] + extra
        setattr(meta, field, after.decode("utf-8", "replace"))
    else:
        before = bytes(getattr(meta, field))
        after = before[:max(0, len(before) - cut)] + extra
        setattr(meta, field, after)
    changed = len(after) != len(before)
    must_refuse = (field in ("iv", "encapsulated_key") and changed) or (field == "payload" and len(after) < 16)
    try:
        check_encryption_claim(env, QUIET)
    except PrismError as exc:
        assert exc.code == "encryption_claim_invalid" and exc.path and exc.hint
    else:
        assert not must_refuse, (field, len(before), len(after))
