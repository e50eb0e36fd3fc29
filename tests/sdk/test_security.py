"""Signing + verification and encryption + decryption through the SDK, on every backend.

PostgreSQL is the interesting one: it stores JSON, not the signed bytes, so the SDK signs
its deterministic encoding there (labels make the ordinary encoding irreproducible)."""

from __future__ import annotations

import asyncio
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.envelope.codec import Layout, decode
from app.errors import ConfigError, DecryptionError, PayloadError, SignatureError, TopicMismatchError, UnknownKeyError
from app.sdk import EncryptionOptions, PrismClient, PrismPublishOptions
from app.security import keys as keymod
from app.security.algorithms import KEY_ML_KEM_768, KEY_SYMMETRIC_256
from app.security.signing import SCOPE_PAIR, SCOPE_V2, SigningKey, VerificationKeys, sign, sign_layouts

pytestmark = pytest.mark.integration

PRODUCER = SigningKey.hmac_sha256("orders-producer-1", os.urandom(32))
WORKER = SigningKey.ed25519("prism-worker-1", Ed25519PrivateKey.generate())
STRANGER = SigningKey.hmac_sha256("somebody-else", os.urandom(32))
TRUSTED = VerificationKeys.of([PRODUCER, WORKER])
LABELS = {f"label-{i}": str(i) for i in range(12)}  # maps: the case a re-encoding would reorder


@pytest.fixture(scope="module")
def keyring() -> keymod.FileKeyring:
    return keymod.generate(namespace="order-events", key_types=(KEY_SYMMETRIC_256, KEY_ML_KEM_768))


async def receive_all(client: PrismClient, topic: str, count: int, **subscribe_kwargs) -> list:
    """Settle every message: keep the good ones, record (and drop) the ones that fail."""
    out: list = []
    async with asyncio.timeout(30), client.subscribe(topic, group="secure", **subscribe_kwargs) as sub:
        while len(out) < count:
            try:
                msg = await sub.receive(timeout=1)
            except (SignatureError, UnknownKeyError, TopicMismatchError) as err:
                out.append(err)
                await err.delivery.ack()  # a real consumer would dead-letter it first
                continue
            if msg is not None:
                out.append(msg)
                await msg.ack()
    return out


async def test_signed_and_encrypted_messages_are_verified_and_decrypted_on_every_backend(backend_url, topic,
                                                                                         keyring):
    async with PrismClient(backend_url, namespace="order-events", signing_key=PRODUCER) as client:
        ok_id = await client.publish(topic, {"order_id": 1}, PrismPublishOptions(labels=LABELS))
        await client.publish(topic, {"order_id": 2}, PrismPublishOptions(signing_key=STRANGER))
    async with PrismClient(backend_url, namespace="order-events") as unsigned:
        await unsigned.publish(topic, {"order_id": 3})
        enc_id = await unsigned.publish(topic, {"order_id": 4, "card": "4111"}, PrismPublishOptions(
            signing_key=WORKER, labels=LABELS, encryption=EncryptionOptions(keyring)))

        got = await receive_all(unsigned, topic, 4, verify_with=TRUSTED, decrypt_with=keyring)

    good, stranger, unsigned_err, encrypted = got
    assert good.message_id == ok_id and good.verified_key_id == "orders-producer-1"
    assert good.payload() == {"order_id": 1} and good.labels == LABELS
    assert good.security.signature_scope == SCOPE_V2 == encrypted.security.signature_scope  # the SDK's default
    assert isinstance(stranger, UnknownKeyError) and "somebody-else" in str(stranger)
    assert isinstance(unsigned_err, SignatureError) and "not signed" in str(unsigned_err)
    assert encrypted.message_id == enc_id and encrypted.verified_key_id == "prism-worker-1"
    assert encrypted.is_encrypted and encrypted.security.encryption.algorithm == "aes-256-gcm"
    assert encrypted.payload() == {"order_id": 4, "card": "4111"}


async def test_tampered_bytes_fail_verification(redis_url, topic):
    """A signed envelope whose payload changed in transit (written straight to the stream)."""
    import redis.asyncio as aredis

    from app.bindings import redis as rb

    async with PrismClient(redis_url, namespace="order-events") as client:
        env = client.build_envelope(topic, {"amount": 10})
        fields = rb.encode_stream_fields(env, Layout.REVIEWED, sign_with=PRODUCER)
        fields["envelope"] = fields["envelope"].replace(b'"amount":10', b'"amount":99')
        r = aredis.Redis.from_url(redis_url.split("?")[0])
        await r.xadd(client.backend.key(topic), fields)
        await r.aclose()
        with pytest.raises(SignatureError, match="forged or tampered") as info:
            async with asyncio.timeout(10), client.subscribe(topic, group="g", verify_with=TRUSTED) as sub:
                await sub.receive(timeout=5)
        assert info.value.delivery.ref  # the stream entry id, for the DLQ record


@pytest.mark.parametrize("layout", list(Layout))
async def test_worker_pair_signed_copies_verify_through_the_sdk(redis_url, topic, layout):
    """What the worker publishes by default (one pair-scope signature for the `.v2` and `.v3`
    copies): an SDK consumer of either copy verifies it alone, and a copy carrying the wrong
    sibling digest is refused."""
    import redis.asyncio as aredis

    from app.bindings import redis as rb

    async with PrismClient(redis_url, namespace="order-events") as client:
        env = client.build_envelope(topic, {"amount": 10})
        copies = dict(zip(Layout, sign_layouts(env, WORKER, list(Layout), scope=SCOPE_PAIR), strict=True))
        good = rb.encode_stream_fields(env, layout)
        good["envelope"] = copies[layout]
        other = copies[Layout.REVIEWED if layout is Layout.DRAFT else Layout.DRAFT]
        swapped = dict(good, envelope=copies[layout].replace(
            decode(copies[layout]).security.sibling_digest, decode(other).security.sibling_digest))
        r = aredis.Redis.from_url(redis_url.split("?")[0])
        for fields in (good, swapped):
            await r.xadd(client.backend.key(topic), fields)
        await r.aclose()
        got = await receive_all(client, topic, 2, verify_with=TRUSTED)
    assert got[0].verified_key_id == "prism-worker-1" and got[0].payload() == {"amount": 10}
    assert got[0].security.signature_scope == SCOPE_PAIR
    assert isinstance(got[1], SignatureError) and "forged or tampered" in str(got[1])


async def test_encrypted_payload_needs_the_right_keys(redis_url, topic, keyring):
    other = keymod.generate(namespace="order-events", key_types=(KEY_SYMMETRIC_256,))
    async with PrismClient(redis_url, namespace="order-events") as client:
        await client.publish(topic, {"secret": 1}, PrismPublishOptions(encryption=EncryptionOptions(keyring)))
        async with asyncio.timeout(10), client.subscribe(topic, group="no-keys") as sub:
            msg = await sub.receive(timeout=5)
            assert msg.metadata.topic == topic  # headers stay readable without keys
            with pytest.raises(PayloadError, match="decrypt_with"):
                msg.payload()
        async with asyncio.timeout(10), client.subscribe(topic, group="wrong-keys", decrypt_with=other) as sub:
            msg = await sub.receive(timeout=5)
            with pytest.raises((DecryptionError, UnknownKeyError)):
                msg.payload()


async def test_post_quantum_encryption_and_draft_layout(redis_url, topic, keyring):
    async with PrismClient(redis_url, namespace="order-events", layout=Layout.DRAFT, signing_key=PRODUCER) as client:
        await client.publish(topic, b"\x01\x02 binary", PrismPublishOptions(
            encryption=EncryptionOptions(keyring, algorithm="ml-kem-768")))
        async with asyncio.timeout(10), client.subscribe(topic, group="pq", decrypt_with=keyring,
                                                         verify_with=TRUSTED) as sub:
            msg = await sub.receive(timeout=5)
    assert msg.security.encryption.algorithm == "ml-kem-768"
    assert msg.payload_bytes() == b"\x01\x02 binary"


def test_canonical_signature_survives_a_jsonb_round_trip():
    """Why PostgreSQL uses the deterministic encoding: the ordinary one reorders maps."""
    import json

    from app.bindings import postgres as pgb
    from app.envelope import decode, encode, new_envelope
    from app.sdk._canonical import canonical_wire, sign_canonical
    from app.security.signing import verify

    reordered = 0
    for i in range(30):
        labels = {f"k{(i * 7 + j) % 23}": str(j) for j in range(10)}
        env = new_envelope("t.x", {"i": i}, namespace="ns", labels=labels, extensions={f"e{j}": b"x" for j in range(5)})
        plain = sign(env.copy(), PRODUCER)
        sign_canonical(env, PRODUCER)
        back = pgb.from_document(json.loads(json.dumps(pgb.encode(env).envelope)))
        verify(canonical_wire(back), TRUSTED)  # always holds
        try:
            verify(encode(pgb.from_document(json.loads(json.dumps(pgb.encode(decode(plain)).envelope)))), TRUSTED)
        except SignatureError:
            reordered += 1
    assert reordered > 0  # the ordinary encoding really is not reproducible through JSONB


def test_canonical_signature_is_scope_v2_and_binds_the_security_context_through_jsonb():
    """The PostgreSQL path signs with scope v2 too: classification and PII flag survive the
    JSONB round trip signed, and a document edited in the table no longer verifies."""
    import json

    from app.bindings import postgres as pgb
    from app.envelope import new_envelope
    from app.sdk._canonical import canonical_wire, sign_canonical
    from app.security.signing import verify

    env = new_envelope("t.x", {"i": 1}, namespace="ns", labels=LABELS, data_classification="restricted",
                       contains_pii=True)
    env.ensure_security().publisher_id = "svc-orders"
    sign_canonical(env, PRODUCER)
    doc = json.loads(json.dumps(pgb.encode(env).envelope))
    assert verify(canonical_wire(pgb.from_document(doc)), TRUSTED).scope == SCOPE_V2
    for field, value in (("data_classification", "public"), ("contains_pii", False), ("publisher_id", "svc-x")):
        edited = json.loads(json.dumps(doc))
        edited["security"][field] = value
        with pytest.raises(SignatureError, match="forged or tampered"):
            verify(canonical_wire(pgb.from_document(edited)), TRUSTED)


async def test_a_signed_message_copied_from_another_topic_is_a_topic_mismatch(kafka_url, topic):
    """A signature proves who wrote the envelope, and `metadata.topic` is part of what it signs:
    a producer's valid message of `payments.refund.approved`, copied verbatim onto this topic,
    was handed out as verified. Now it raises TopicMismatchError with the delivery to settle;
    the worker's `<source>.v3` outputs (claiming their source) and declared aliases still pass."""
    from aiokafka import AIOKafkaProducer

    import app.bindings.kafka as kb

    async with PrismClient(kafka_url, namespace="payments", signing_key=PRODUCER) as client:
        await client.publish(topic, {"own": 1})
        copied = kb.encode(client.build_envelope("payments.refund.approved", {"refund": 10**6}), sign_with=PRODUCER)
        alias = kb.encode(client.build_envelope(topic + ".legacy", {"legacy": 1}), sign_with=PRODUCER)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_url.removeprefix("kafka://").split("?")[0])
        await producer.start()
        try:
            for rec in (copied, alias):
                await producer.send_and_wait(topic, rec.value, headers=list(rec.headers))
        finally:
            await producer.stop()
        await client.publish(topic, {"own": 2})
        got = await receive_all(client, topic, 4, verify_with=TRUSTED)
        assert [m.payload() for m in got if not isinstance(m, Exception)] == [{"own": 1}, {"own": 2}]
        refused = [m for m in got if isinstance(m, Exception)]
        assert len(refused) == 2 and all(isinstance(e, TopicMismatchError) for e in refused), refused
        assert "claims topic 'payments.refund.approved'" in refused[0].message
        assert refused[0].delivery.error is refused[0]
        # declared as an alias, the legacy topic's message is this topic's
        async with client.subscribe(topic, group="aliased", verify_with=TRUSTED,
                                    topic_aliases=[topic + ".legacy"]) as sub:
            seen = []
            while len(seen) < 4:
                try:
                    msg = await sub.receive(timeout=10)
                except TopicMismatchError as err:
                    seen.append("mismatch")
                    await err.delivery.ack()
                    continue
                assert msg is not None
                seen.append(msg.payload())
                await msg.ack()
        assert seen == [{"own": 1}, "mismatch", {"legacy": 1}, {"own": 2}]
    with pytest.raises(ConfigError, match="topic_aliases"):
        PrismClient(kafka_url, namespace="payments").subscribe(topic, group="g", topic_aliases=[""])
