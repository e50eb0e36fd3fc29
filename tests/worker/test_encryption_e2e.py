"""Encrypted envelopes through the running worker (RFC-031 revision 2) on the embedded broker.

Producers encrypt with each of the four patterns - symmetric, asymmetric (RSA-OAEP),
post-quantum (ML-KEM) and hybrid (X25519 + ML-KEM) - and the worker passes the ciphertext
through byte for byte: it holds none of those keys. Classified payloads that arrive in
plaintext are encrypted by the worker with the consumers' *public* hybrid key, read from a
Kubernetes-style Secret mount that is rotated (the `..data` swap kubelet does) while the worker
runs. An SDK consumer with the private keys decrypts all of it to the originals."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from app.envelope import decode, new_envelope
from app.errors import KeyNotUsableError
from app.sdk import PrismClient
from app.security import keys as keymod
from app.security.algorithms import KEY_X25519_ML_KEM_1024
from app.security.encryption import encrypt_envelope
from app.security.keys import MountedSecretsKeyProvider, write_secret_mount
from app.security.signing import SigningKey, sign
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline

NS = "order-events"
PRODUCER_PATTERNS = ("aes-256-gcm", "rsa-oaep-3072", "ml-kem-1024", "x25519-ml-kem-1024")
PRIVATE_FIELDS = ("private_pem", "private_seed", "x25519_private", "ml_kem_private_seed", "secret")


def public_file(record: keymod.KeyRecord) -> str:
    return yaml.safe_dump(keymod.FileKeyring([record]).public_only().to_mapping()["keys"][0])


async def test_four_patterns_through_the_worker_and_worker_side_encryption(broker, tmp_path: Path, dev_keys,
                                                                           caplog) -> None:
    caplog.set_level(logging.DEBUG)
    now = datetime.now(UTC).replace(microsecond=0)
    hyb_v1 = keymod.new_key_record("orders-hybrid-v1", KEY_X25519_ML_KEM_1024, created=now - timedelta(hours=2),
                                   not_before=now - timedelta(hours=2), namespace=NS,
                                   public_key_id="orders-hybrid-v1.pub")
    hyb_v2 = keymod.new_key_record("orders-hybrid-v2", KEY_X25519_ML_KEM_1024, created=now - timedelta(hours=1),
                                   not_before=now - timedelta(hours=1), namespace=NS,
                                   public_key_id="orders-hybrid-v2.pub")
    generated = keymod.generate(namespace=NS, key_types=("symmetric-256", "rsa-3072", "ml-kem-1024",
                                                         "x25519-ml-kem-1024"))
    consumer = keymod.FileKeyring([*generated.records.values(), hyb_v1, hyb_v2], source="consumer")
    producer_public = consumer.public_only()  # producers of public-key patterns cannot decrypt either

    mount = tmp_path / "worker-keys"  # what a Secret volume looks like inside the worker's pod
    write_secret_mount(mount, {"orders-hybrid-v1.yaml": public_file(hyb_v1)}, version="2026_01_01_00_00_00.1")
    topo = make_topology(tmp_path, dev_keys, partitions=1, encryption={
        "provider": "k8s-secrets", "path": str(mount), "refresh_s": 0.2,
        "encrypt_unencrypted": ["confidential", "restricted"], "algorithm": "x25519-ml-kem-1024"})
    topic = topo.sources[0].topic
    producer_key = dev_keys.keyring.signing["dev-producer-1"]

    plain: dict[str, bytes] = {}    # message id -> the producer's plaintext payload
    sent_ciphertext: dict[str, bytes] = {}

    def envelope(classification: str, label: str) -> tuple[object, bytes]:
        canary = f"canary-{label}-{uuid.uuid4().hex}"
        env = new_envelope(topic, {"card": canary}, namespace=NS, data_classification=classification)
        plain[env.message_id] = env.payload_bytes()
        return env, canary.encode()

    canaries: list[bytes] = []
    producer_encrypted: list[bytes] = []
    by_pattern: dict[str, str] = {}
    for alg in PRODUCER_PATTERNS:
        env, canary = envelope("restricted", alg)
        canaries.append(canary)
        ring = consumer if alg == "aes-256-gcm" else producer_public  # symmetric: the shared key
        key_id = next(k for k, r in consumer.records.items() if r in generated.records.values()
                      and r.key_type == {"aes-256-gcm": "symmetric-256", "rsa-oaep-3072": "rsa-3072",
                                         "ml-kem-1024": "ml-kem-1024",
                                         "x25519-ml-kem-1024": "x25519-ml-kem-1024"}[alg])
        encrypt_envelope(env, ring, algorithm=alg, key_id=key_id)
        sent_ciphertext[env.message_id] = bytes(env.payload.value)
        by_pattern[alg] = env.message_id
        producer_encrypted.append(sign(env, producer_key))
    legacy_first: list[bytes] = []
    worker_encrypted_ids: list[str] = []
    for classification in ("restricted", "confidential"):
        env, canary = envelope(classification, f"plain-{classification}")
        canaries.append(canary)
        worker_encrypted_ids.append(env.message_id)
        legacy_first.append(sign(env, producer_key))
    env, canary = envelope("restricted", "after-rotation")
    canaries.append(canary)
    after_rotation_id = env.message_id
    after_rotation = sign(env, producer_key)

    first_worker_record = len(caplog.records)  # the producers' own encryptions above are not the worker's
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w") as p:
        provider = p.pipeline.encryption.provider
        # The worker's configuration holds no private key of any pattern whose recipients are consumers.
        assert isinstance(provider, MountedSecretsKeyProvider) and provider.public_only
        assert keymod.private_key_ids(provider) == [] and provider.private_key_ids() == []
        for kid in provider.list_key_ids():
            try:
                provider.get_private_key(kid)
                raise AssertionError(f"the worker holds the private key {kid}")
            except KeyNotUsableError:
                pass
        for f in mount.iterdir():
            if not f.name.startswith("."):
                assert not any(field in f.read_text() for field in PRIVATE_FIELDS), f.name
        for value in producer_encrypted + legacy_first:
            await p.send(value)
        await p.wait_read(len(producer_encrypted) + len(legacy_first))
        # kubelet rotates the Secret: the new key is valid and newer; no restart
        write_secret_mount(mount, {"orders-hybrid-v1.yaml": public_file(hyb_v1),
                                   "orders-hybrid-v2.yaml": public_file(hyb_v2)}, version="2026_02_01_00_00_00.2")
        await asyncio.sleep(0.5)
        await p.send(after_rotation)
        await p.wait_read(len(producer_encrypted) + len(legacy_first) + 1)
        out = await p.outputs()
        assert provider.reloads >= 1

    summary = p.pipeline.summary()
    assert summary["emitted"] == 7 and summary["dlq"] == 0, summary
    assert p.pipeline.encryption.encrypted == {"restricted": 2, "confidential": 1}

    # Outputs carry ciphertext only; the producer's ciphertext is passed through untouched.
    for name in (f"{topic}.v2", f"{topic}.v3"):
        assert len(out[name]) == 7
        for rec in out[name]:
            blob = rec.value + b"".join(k.encode() + (v or b"") for k, v in rec.headers)
            assert not any(c in blob for c in canaries), f"plaintext in {name}"
            env = decode(rec.value)
            assert env.is_encrypted
            if env.message_id in sent_ciphertext:
                assert bytes(env.payload.value) == sent_ciphertext[env.message_id]
            else:
                meta = env.security.encryption
                assert meta.algorithm == "x25519-ml-kem-1024"
                expected = "orders-hybrid-v2" if env.message_id == after_rotation_id else "orders-hybrid-v1"
                assert meta.key_id == expected, (env.message_id, meta.key_id)
    assert {decode(r.value).security.encryption.algorithm for r in out[f"{topic}.v3"]} >= set(PRODUCER_PATTERNS)

    # The worker never decrypted: its audit trail has encryptions (its own) and public-key uses only.
    worker_records = caplog.records[first_worker_record:]
    audits = [r.prism_audit for r in worker_records if hasattr(r, "prism_audit")]
    assert audits and all(a["operation"] in ("encrypt", "key_use") for a in audits)
    assert all(a["purpose"] in ("", "encrypt") for a in audits)
    assert {a["message_id"] for a in audits if a["operation"] == "encrypt"} == {*worker_encrypted_ids,
                                                                               after_rotation_id}
    log_text = "\n".join(r.getMessage() for r in worker_records)
    assert not any(c.decode() in log_text for c in canaries)

    # An SDK consumer with the private keys reads every one of them, from either layout.
    worker_keys = dev_keys.keyring.keys_for(NS)
    url = f"kafka://{broker.bootstrap}?session_timeout_ms=2000&heartbeat_interval_ms=500"
    reader_key = SigningKey.hmac_sha256("svc-analytics-key", os.urandom(32))  # signs its audit records
    async with PrismClient(url, namespace=NS, signing_key=reader_key) as client:
        for layout in ("v3", "v2"):
            got = {}
            async with asyncio.timeout(60), client.subscribe(
                    f"{topic}.{layout}", group=f"analytics-{layout}", decrypt_with=consumer, verify_with=worker_keys,
                    clearance="restricted", principal="svc-analytics",
                    audit_topic=f"audit.{uuid.uuid4().hex[:8]}") as sub:
                while len(got) < 7:
                    msg = await sub.receive(timeout=1)
                    if msg is not None:
                        got[msg.message_id] = msg.payload_bytes()
                        await msg.ack()
            assert got == plain, layout
            assert sub.stats["audited"] == 7
    assert set(by_pattern.values()) <= set(plain)
