"""A plaintext payload that claims to be encrypted (issue 31 item 4), through the policy stage
and through the whole stage chain without a broker (`build_stages`, the publisher, both output
layouts).

Rules (app/agents/policy.py, docs/encryption.md "Claims of encryption"):

* a claim with the shape its algorithm produces passes through untouched, as before;
* a claim without it goes to the DLQ as `encryption_claim_invalid` - or, where the topology's
  `encryption:` block lists the message's classification, the worker encrypts the payload as
  the plaintext it may be, and the rejected algorithm is kept in `prism.claimed.encryption_algorithm`;
* a classification a source's `classification_floor` raised counts like a stated one: the
  anonymous producer's claimed-encrypted plaintext is encrypted or refused, never emitted.

Every algorithm the policy allows, three ways of faking a claim, anonymous and authenticated
(token, bound signing key) producers, with and without `encrypt_unencrypted`: every message
lands exactly once - emitted encrypted, or in the DLQ with one reason - and no output record
carries the plaintext.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app._gen.prism.envelope.v1 import envelope_pb2 as pb
from app.agents.base import Message
from app.agents.chain import Outcome, Result
from app.agents.policy import CLAIMED_ENCRYPTION, Policy
from app.envelope import Envelope, Layout, decode, encode, new_envelope
from app.envelope.model import Payload
from app.errors import AlgorithmError, EncryptionClaimError, PolicyError, PrismError
from app.formats import cloudevents as ce
from app.security import keys as keymod
from app.security.algorithms import KEY_X25519_ML_KEM_1024, lookup
from app.security.devkeys import DevKeys
from app.security.encryption import (
    AuditRecord,
    check_encryption_claim,
    decrypt_envelope,
    encrypt_envelope,
    envelope_aad,
)
from app.security.keys import FileKeyring
from app.security.signing import sign, verify
from app.security.worker_encryption import build_worker_encryption
from app.topology import PolicyStage
from tests.agents.test_identity import Pipeline

NS = "order-events"
FIXTURES = Path(__file__).resolve().parents[1] / "security" / "fixtures"
ALGORITHMS = {  # every algorithm the policy allows -> its key in the committed test keyring
    "aes-256-gcm": "kat-sym",
    "chacha20-poly1305": "kat-sym",
    "rsa-oaep-3072": "kat-rsa-3072",
    "rsa-oaep-4096": "kat-rsa-4096",
    "ml-kem-768": "kat-ml-kem-768",
    "ml-kem-1024": "kat-ml-kem-1024",
    "x25519-ml-kem-1024": "kat-hybrid",
}
ENCAPSULATED = {"symmetric": 0, "asymmetric": 0, "post_quantum": 1088, "hybrid": 1568}


def no_audit(_record: AuditRecord) -> None:
    return None


def canary() -> bytes:
    return f"canary-{uuid.uuid4().hex}".encode()


def fake_claim(env: Envelope, algorithm: str, kind: str) -> None:
    """Label `env`'s plaintext payload as encrypted with `algorithm`, the way `kind` says:

    * `bare` - the reported case: an algorithm and a key id, nothing else;
    * `short-iv` - everything as the algorithm writes it (type, AAD, params, encapsulated key of
      the right size), but an 11-byte IV;
    * `iv-in-key-field` - the nonce put in `encapsulated_key`, `iv` empty.
    """
    spec = lookup(algorithm)
    meta = env.ensure_security().encryption
    meta.algorithm, meta.key_id = algorithm, ALGORITHMS[algorithm]
    if kind == "bare":
        return
    meta.encryption_type = spec.encryption_type
    meta.aad = envelope_aad(env, algorithm, meta.key_id)
    if spec.pattern == "asymmetric":
        meta.algorithm_params = json.dumps({"mode": "wrapped", "oaep": "sha-256", "dem": "aes-256-gcm"})
        size = (spec.rsa_bits or 0) // 8
    else:
        size = 1568 if spec.pattern == "hybrid" else 1088 if algorithm == "ml-kem-768" else 1568
    if spec.pattern == "hybrid":
        meta.algorithm_params = json.dumps({"x25519_ephemeral_public": "A" * 43 + "=", "kdf": "hkdf-sha256"})
    if kind == "short-iv":
        meta.iv = bytes(11)
        if spec.pattern != "symmetric":
            meta.encapsulated_key = bytes(size)
    else:
        assert kind == "iv-in-key-field"
        meta.encapsulated_key = bytes(12)


# --------------------------------------------------------------------------- the stage alone


def policy_msg(env: Envelope) -> Message:
    return Message("orders.created", 0, 0, b"", envelope=env)


@pytest.fixture(scope="module")
def kat() -> FileKeyring:
    return FileKeyring.load(FIXTURES / "kat-keyring.json")


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_the_stage_passes_a_real_claim_untouched_and_refuses_a_fake_one(kat: FileKeyring, algorithm: str) -> None:
    stage = Policy(PolicyStage(require_encryption_for=["confidential", "restricted"]))
    env = new_envelope("orders.created", {"card": "4111"}, namespace=NS, data_classification="restricted")
    encrypt_envelope(env, kat, key_id=ALGORITHMS[algorithm], algorithm=algorithm, audit=no_audit)
    before = (env.header.security.SerializeToString(), bytes(env.payload.value))
    stage.process(policy_msg(env))  # the worker holds no key: the claim and ciphertext stay as they were
    assert (env.header.security.SerializeToString(), bytes(env.payload.value)) == before
    for kind in ("bare", "short-iv", "iv-in-key-field"):
        for classification in ("public", "internal", "confidential", "restricted", ""):
            fake = new_envelope("orders.created", {"card": "4111"}, namespace=NS,
                                data_classification=classification or None)
            fake_claim(fake, algorithm, kind)
            with pytest.raises(EncryptionClaimError) as info:
                stage.process(policy_msg(fake))
            assert info.value.code == "encryption_claim_invalid", (kind, classification)


def test_what_held_before_still_holds() -> None:
    """A refused algorithm is still `algorithm_not_allowed`, and unclaimed classified plaintext
    still `policy_violation`, with the claim check in place."""
    stage = Policy(PolicyStage(require_encryption_for=["restricted"], fips_mode=True))
    env = new_envelope("orders.created", b"\x00" * 64, namespace=NS, data_classification="restricted")
    meta = env.ensure_security().encryption
    meta.algorithm, meta.key_id, meta.iv = "chacha20-poly1305", "k", bytes(12)  # well-formed, not FIPS
    with pytest.raises(AlgorithmError):
        stage.process(policy_msg(env))
    meta.algorithm = "aes-128-gcm"
    with pytest.raises(AlgorithmError):
        stage.process(policy_msg(env))
    with pytest.raises(PolicyError):
        stage.process(policy_msg(new_envelope("orders.created", {"a": 1}, namespace=NS,
                                              data_classification="restricted")))


def test_the_worker_encrypts_a_fake_claim_of_a_listed_classification(tmp_path: Path) -> None:
    consumer = FileKeyring([keymod.new_key_record("hyb-1", KEY_X25519_ML_KEM_1024, namespace=NS)])
    consumer.public_only().save(tmp_path / "pub.yaml")
    topo = _policy_topology(tmp_path)
    enc = build_worker_encryption(topo)
    assert enc is not None
    stage = Policy(topo.stage("policy"), enc)
    secret = canary()
    env = new_envelope("orders.created", {"card": secret.decode()}, namespace=NS, data_classification="restricted")
    original = env.payload_bytes()
    fake_claim(env, "ml-kem-1024", "short-iv")
    stage.process(policy_msg(env))
    meta = env.header.security.encryption
    assert (meta.algorithm, meta.key_id) == ("x25519-ml-kem-1024", "hyb-1")
    assert env.extensions[CLAIMED_ENCRYPTION] == b"ml-kem-1024"
    assert secret not in encode(env, Layout.REVIEWED) and secret not in encode(env, Layout.DRAFT)
    assert decrypt_envelope(env, consumer, audit=no_audit) == original
    assert enc.encrypted == {"restricted": 1}
    public = new_envelope("orders.created", {"card": "4111"}, namespace=NS, data_classification="public")
    fake_claim(public, "aes-256-gcm", "bare")
    with pytest.raises(EncryptionClaimError):  # public is not listed: refused, not encrypted
        stage.process(policy_msg(public))


def _policy_topology(tmp_path: Path) -> Any:
    from tests.agents.test_policy_encryption import topology

    return topology(tmp_path, {"provider": "file", "path": str(tmp_path / "pub.yaml"),
                               "encrypt_unencrypted": ["confidential", "restricted"],
                               "algorithm": "x25519-ml-kem-1024"})


# --------------------------------------------------------------------------- the whole chain


class Chain:
    """The shipped topology's chain on a source with `classification_floor: confidential`,
    with or without the worker's `encryption:` block (consumers' public hybrid key)."""

    def __init__(self, tmp_path: Path, keys: DevKeys, *, worker_encrypts: bool) -> None:
        self.consumer = FileKeyring([keymod.new_key_record("hyb-1", KEY_X25519_ML_KEM_1024, namespace=NS)])
        self.consumer.public_only().save(tmp_path / "worker-keys.yaml")

        def edit(doc: dict[str, Any]) -> None:
            doc["sources"][0]["classification_floor"] = "confidential"
            if worker_encrypts:
                doc["encryption"] = {"provider": "file", "path": str(tmp_path / "worker-keys.yaml"),
                                     "encrypt_unencrypted": ["confidential", "restricted"],
                                     "algorithm": "x25519-ml-kem-1024"}

        self.p = Pipeline(tmp_path, keys, edit)
        self.keys = keys

    def run(self, value: bytes, headers: list[tuple[str, bytes]] | None = None
            ) -> tuple[Result, dict[str, tuple[Envelope, bytes]]]:
        """The chain's result and, when emitted, each output layout's envelope and its record's
        bytes (value and headers, what a plain reader of the topic gets)."""
        p = self.p
        p.offset += 1
        msg = Message(topic=p.topic, partition=0, offset=p.offset, value=value, key=b"k",
                      headers=list(headers or []), timestamp_ms=int(time.time() * 1000))
        result = p.chain.run(msg)
        out: dict[str, tuple[Envelope, bytes]] = {}
        if result.outcome is Outcome.EMITTED:
            for e in p.publisher.emissions(msg):
                suffix = e.topic.rsplit(".", 1)[1]
                verify(e.record.value, p.worker_keys, layout=Layout.DRAFT if suffix == "v2" else Layout.REVIEWED)
                raw = e.record.value + b"".join(k.encode() + (v or b"") for k, v in e.record.headers)
                out[suffix] = (decode(e.record.value), raw)
            assert set(out) == {"v2", "v3"}
        return result, out


def anonymous(topic: str, env: Envelope) -> tuple[bytes, list[tuple[str, bytes]]]:
    return encode(env, Layout.REVIEWED), []


def anonymous_draft(topic: str, env: Envelope) -> tuple[bytes, list[tuple[str, bytes]]]:
    return encode(env, Layout.DRAFT), []


def anonymous_cloudevent(topic: str, env: Envelope) -> tuple[bytes, list[tuple[str, bytes]]]:
    rec = ce.to_kafka_binary(env)  # the claim rides in the `prismencryption` attribute
    return rec.value, [(k, v if isinstance(v, bytes) else str(v).encode()) for k, v in rec.headers]


PRODUCERS: dict[str, Callable[..., Any]] = {
    "anonymous": anonymous,
    "anonymous-draft": anonymous_draft,
    "anonymous-cloudevent": anonymous_cloudevent,
    "token": None,   # a verified svc-orders JWT in an Authorization header
    "key": None,     # signed by dev-producer-1, bound to svc-orders
}


def produce(chain: Chain, producer: str, env: Envelope) -> tuple[bytes, list[tuple[str, bytes]]]:
    if producer == "token":
        token = chain.keys.mint_token("svc-orders")
        return encode(env, Layout.REVIEWED), [("Authorization", f"Bearer {token}".encode())]
    if producer == "key":
        return sign(env, chain.keys.keyring.signing["dev-producer-1"]), []
    return PRODUCERS[producer](chain.p.topic, env)


def message(chain: Chain, producer: str, secret: bytes) -> Envelope:
    """Anonymous producers state `public` (the floor raises it to confidential); authenticated
    ones state `confidential` themselves (the floor does not apply to them)."""
    stated = "public" if producer.startswith("anonymous") else "confidential"
    return new_envelope(chain.p.topic, {"card": secret.decode()}, namespace=NS, data_classification=stated)


@pytest.mark.parametrize("worker_encrypts", [True, False], ids=["encrypt_unencrypted", "no-encryption-block"])
def test_fake_claims_through_the_chain_never_emit_plaintext(tmp_path: Path, dev_keys: DevKeys,
                                                            worker_encrypts: bool) -> None:
    chain = Chain(tmp_path, dev_keys, worker_encrypts=worker_encrypts)
    emitted = dlq = 0
    for producer in PRODUCERS:
        for algorithm in sorted(ALGORITHMS):
            for kind in ("bare", "short-iv", "iv-in-key-field"):
                secret = canary()
                env = message(chain, producer, secret)
                original = env.payload_bytes()
                fake_claim(env, algorithm, kind)
                result, out = chain.run(*produce(chain, producer, env))
                where = (producer, algorithm, kind)
                if not worker_encrypts:
                    assert (result.outcome, result.stage, result.reason) == \
                        (Outcome.DLQ, "policy", "encryption_claim_invalid"), where
                    dlq += 1
                    continue
                assert result.outcome is Outcome.EMITTED, (where, result)
                emitted += 1
                for suffix, (got, raw) in out.items():
                    assert secret not in raw, (where, suffix)
                    assert got.security.data_classification == "confidential"
                    assert got.security.encryption.algorithm == "x25519-ml-kem-1024"
                    assert got.extensions[CLAIMED_ENCRYPTION] == algorithm.encode()
                    assert decrypt_envelope(got, chain.consumer, audit=no_audit) == original, where
    assert chain.p.chain.stats.outcomes[Outcome.DLQ] == dlq  # (emitted is counted by the worker after its writes)
    assert emitted + dlq == len(PRODUCERS) * len(ALGORITHMS) * 3  # every message landed, once


@pytest.mark.parametrize("worker_encrypts", [True, False], ids=["encrypt_unencrypted", "no-encryption-block"])
def test_the_floor_raised_message_is_encrypted_or_refused_and_real_ciphertext_passes(
        tmp_path: Path, dev_keys: DevKeys, kat: FileKeyring, worker_encrypts: bool) -> None:
    """Controls through the same chain: the anonymous producer's unclaimed plaintext (raised to
    confidential by the floor) is encrypted or a `policy_violation`; a fake claim on data an
    authenticated producer states is `public` is refused either way (public is not listed);
    producer ciphertext of every algorithm passes byte for byte."""
    chain = Chain(tmp_path, dev_keys, worker_encrypts=worker_encrypts)
    secret = canary()
    env = message(chain, "anonymous", secret)
    result, out = chain.run(*produce(chain, "anonymous", env))
    if worker_encrypts:
        assert result.outcome is Outcome.EMITTED and all(secret not in raw for _, raw in out.values())
        assert out["v3"][0].security.data_classification == "confidential"
    else:
        assert (result.outcome, result.reason) == (Outcome.DLQ, "policy_violation")

    public = new_envelope(chain.p.topic, {"card": secret.decode()}, namespace=NS, data_classification="public")
    fake_claim(public, "aes-256-gcm", "bare")
    result, _ = chain.run(*produce(chain, "key", public))
    assert (result.outcome, result.stage, result.reason) == (Outcome.DLQ, "policy", "encryption_claim_invalid")

    for producer in ("anonymous", "token", "key"):
        for algorithm in sorted(ALGORITHMS):
            env = message(chain, producer, secret)
            encrypt_envelope(env, kat, key_id=ALGORITHMS[algorithm], algorithm=algorithm, audit=no_audit)
            ciphertext = bytes(env.payload.value)
            result, out = chain.run(*produce(chain, producer, env))
            assert result.outcome is Outcome.EMITTED, (producer, algorithm, result)
            for got, _ in out.values():
                assert bytes(got.payload.value) == ciphertext
                assert got.security.encryption.algorithm == algorithm and CLAIMED_ENCRYPTION not in got.extensions
                assert got.security.encryption.encryption_type != pb.ENCRYPTION_TYPE_UNSPECIFIED


def test_a_producer_cannot_pre_state_the_claimed_encryption_extension(tmp_path: Path, dev_keys: DevKeys) -> None:
    """`prism.claimed.*` is the worker's: an input carrying `prism.claimed.encryption_algorithm`
    loses it (identity stage), so only the worker says a claim was rejected."""
    chain = Chain(tmp_path, dev_keys, worker_encrypts=True)
    env = message(chain, "anonymous", canary())
    env.extensions[CLAIMED_ENCRYPTION] = b"aes-256-gcm"
    result, out = chain.run(*produce(chain, "anonymous", env))
    assert result.outcome is Outcome.EMITTED
    assert all(CLAIMED_ENCRYPTION not in got.extensions for got, _ in out.values())


def test_an_empty_payload_with_a_claim(tmp_path: Path, dev_keys: DevKeys) -> None:
    """An empty payload cannot hold even the tag: refused without the block, encrypted with it."""
    for worker_encrypts in (False, True):
        (tmp_path / str(worker_encrypts)).mkdir()
        chain = Chain(tmp_path / str(worker_encrypts), dev_keys, worker_encrypts=worker_encrypts)
        env = message(chain, "anonymous", canary())
        env.payload = Payload(b"", env.payload.type_url)
        fake_claim(env, "chacha20-poly1305", "short-iv")
        result, out = chain.run(*produce(chain, "anonymous", env))
        if worker_encrypts:
            assert result.outcome is Outcome.EMITTED
            assert decrypt_envelope(out["v3"][0], chain.consumer, audit=no_audit) == b""
        else:
            assert (result.outcome, result.reason) == (Outcome.DLQ, "encryption_claim_invalid")


# --------------------------------------------------------------------------- random claims, the stage


_LENGTHS = st.sampled_from([0, 1, 11, 12, 13, 16, 384, 512, 1088, 1568])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(algorithm=st.sampled_from([*sorted(ALGORITHMS), "kyber1024", "aes-128-gcm", ""]) | st.text(max_size=12),
       key_id=st.text(max_size=6), etype=st.integers(0, 6), iv=st.none() | _LENGTHS, encapsulated=st.none() | _LENGTHS,
       payload=_LENGTHS, params=st.none() | st.sampled_from(['{"mode":"wrapped"}', '{"key_wrap":"aws-kms"}', "[]",
                                                            "{", '{"kdf":"x"}']),
       classification=st.sampled_from(["", "public", "internal", "confidential", "restricted"]))
def test_random_claims_through_the_stage_are_encrypted_passed_or_refused_typed(
        tmp_path: Path, algorithm: str, key_id: str, etype: int, iv: int | None, encapsulated: int | None,
        payload: int, params: str | None, classification: str) -> None:
    """Whatever the claim, the stage (with `encrypt_unencrypted: [confidential, restricted]`)
    raises a `PrismError`, or the envelope leaves it with a claim that passes the check - the
    producer's, untouched, or the worker's own encryption - never with a claim that fails it."""
    stage = _random_stage(tmp_path)
    env = new_envelope("orders.created", {"card": "4111"}, namespace=NS, data_classification=classification or None)
    meta = env.ensure_security().encryption
    meta.algorithm, meta.key_id, meta.encryption_type = algorithm, key_id, etype
    if iv is not None:
        meta.iv = bytes(iv)
    if encapsulated is not None:
        meta.encapsulated_key = bytes(encapsulated)
    if params is not None:
        meta.algorithm_params = params
    env.payload = Payload(bytes(payload), "")
    before = env.header.security.encryption.SerializeToString()
    try:
        stage.process(policy_msg(env))
    except PrismError as exc:
        assert exc.code in {"encryption_claim_invalid", "algorithm_not_allowed"}, exc.code
        return
    check_encryption_claim(env)
    worker = CLAIMED_ENCRYPTION in env.extensions
    assert worker == (env.header.security.encryption.SerializeToString() != before)
    assert not worker or classification in ("confidential", "restricted")


_STAGES: dict[str, Policy] = {}


def _random_stage(tmp_path: Path) -> Policy:
    """One stage for every example (building the worker's keys per example costs more than it
    tests)."""
    if "stage" not in _STAGES:
        FileKeyring([keymod.new_key_record("hyb-1", KEY_X25519_ML_KEM_1024, namespace=NS)]).public_only().save(
            tmp_path / "pub.yaml")
        topo = _policy_topology(tmp_path)
        _STAGES["stage"] = Policy(topo.stage("policy"), build_worker_encryption(topo))
    return _STAGES["stage"]
