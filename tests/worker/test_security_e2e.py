"""Security properties end to end on the real broker: a planted auth token never appears in
any output topic, DLQ record, archive record or log line; a forged signature always lands in
the DLQ; every forgery style is caught."""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path

from app.envelope import Layout, decode, encode, new_envelope
from app.envelope.wire import scan
from app.security.signing import SigningKey, sign, verify
from tests.worker import independent
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline


async def test_planted_tokens_never_leak(broker, tmp_path: Path, dev_keys, caplog) -> None:
    """librdkafka (C, logging to stderr, not Python logging) plays the producers, so every
    log record captured here is Prism's own."""
    caplog.set_level(logging.DEBUG)
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    topic = topo.sources[0].topic
    valid = dev_keys.mint_token(f"canary-{uuid.uuid4().hex}")  # unique, so a hit cannot be a coincidence
    expired = dev_keys.mint_token(f"canary-{uuid.uuid4().hex}", ttl_s=-5, now=time.time() - 600)
    opaque = f"opaque-canary-{uuid.uuid4().hex}"  # not JWT-shaped: found only because Prism remembers it
    canaries = [valid, expired, opaque]

    def env_with(token: str):
        e = new_envelope(topic, {"order": 1}, namespace="order-events")
        e.ensure_security().auth_token = token
        return e

    good = encode(env_with(valid))
    plain: list[bytes] = [encode(env_with(t), layout) for layout in Layout for t in canaries]
    plain.append(good[: len(good) - 5])  # malformed envelope with a token inside (detected by its shape)
    plain.append(json.dumps({"meta": {"auth_token": expired, "ts": int(time.time())}, "payload": 1}).encode())
    with_header = {valid: json.dumps({"a": 1}).encode(), opaque: json.dumps({"a": 2}).encode()}

    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w") as p:
        independent.produce(broker.bootstrap, topic, [(v, [], None) for v in plain])
        independent.produce(broker.bootstrap, topic, [(v, [("Authorization", f"Bearer {t}".encode())], None)
                                                      for t, v in with_header.items()])
        await p.wait_read(len(plain) + len(with_header))
        out = await p.outputs()

    summary = p.pipeline.summary()
    assert summary["emitted"] >= 3 and summary["dlq"] >= 6, summary
    records = [r for recs in out.values() for r in recs]
    assert len(records) == summary["emitted"] * len(topo.outputs.layouts) + summary["dlq"]
    for rec in records:
        blob = (rec.key or b"") + (rec.value or b"") + b"".join(k.encode() + (v or b"") for k, v in rec.headers)
        for c in canaries:
            assert c.encode() not in blob, f"token leaked into {rec.topic}"
    log_text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "orders.created" in log_text  # the capture did see the worker's own records
    for c in canaries:
        assert c not in log_text


async def test_every_forgery_lands_in_the_dlq(broker, tmp_path: Path, dev_keys) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    topic = topo.sources[0].topic
    real = dev_keys.keyring.signing["dev-producer-1"]

    def fresh(**kw):
        return new_envelope(topic, {"amount": 100}, namespace="order-events", **kw)

    forgeries: dict[str, bytes] = {}
    forgeries["wrong-secret-same-key-id"] = sign(fresh(), SigningKey.hmac_sha256("dev-producer-1", b"x" * 32))
    signed = bytearray(sign(fresh(), real))
    signed[-1] ^= 0x01  # payload changed after signing
    forgeries["payload-tampered"] = bytes(signed)
    from app.envelope.codec import encode_parts, security_record

    env = fresh()
    sign(env, real)                # env.security now holds a genuine signature ...
    env.metadata.priority = 9      # ... over metadata that is then changed
    head, _, payload = encode_parts(env)
    forgeries["metadata-tampered"] = b"".join([head, security_record(env), *payload])
    forgeries["unknown-key-id"] = sign(fresh(), SigningKey.hmac_sha256("stolen-key", b"y" * 32))
    truncated = fresh()
    raw = sign(truncated, real)
    sec = next(r for r in scan(raw) if r[0] == 2)
    bad = truncated.copy()
    bad.security.signature = truncated.security.signature[:16]
    head, _, payload = encode_parts(bad)
    forgeries["signature-truncated"] = b"".join([head, security_record(bad), *payload])
    assert sec  # the security record exists in what we tampered with
    for layout in (Layout.DRAFT,):
        forgeries[f"draft-{layout.value}-wrong-secret"] = sign(fresh(), SigningKey.hmac_sha256("dev-producer-1",
                                                                                                b"z" * 32), layout)
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w") as p:
        for i, value in enumerate(forgeries.values()):
            for _ in range(3):
                await p.send(value, key=f"k{i}".encode())
        await p.send(sign(fresh(), real))  # control: a genuine one is emitted
        await p.wait_read(len(forgeries) * 3 + 1)
        out = await p.outputs()
    s = p.pipeline.summary()
    assert s["emitted"] == 1 and s["dlq"] == len(forgeries) * 3, s
    assert set(s["dlq_reasons"]) <= {"bad_signature", "unknown_key"}
    dlq = out[topic + ".dlq"]
    assert len(dlq) == len(forgeries) * 3
    assert all(dict(r.headers)["prism.errors.stage"] == b"verify_signature" for r in dlq)


async def test_independent_client_produces_legacy_and_reads_v3(broker, tmp_path: Path, dev_keys) -> None:
    """An independent Kafka client (librdkafka) on both ends: it writes legacy messages with
    Kafka-header metadata and reads the signed reviewed envelopes back from `.v3`."""
    n = 60
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    topic = topo.sources[0].topic
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w") as p:
        independent.produce(broker.bootstrap, topic, [
            (json.dumps({"order_id": f"o-{i}"}).encode(),
             [("correlation-id", b"corr-independent"), ("content-type", b"application/json")], f"k{i}".encode())
            for i in range(n)])
        await p.wait_read(n)
        await p.outputs()  # outputs are flushed and readable
    recs = independent.consume_all(broker.bootstrap, f"{topic}.v3", 2, expected=n)
    assert len(recs) == n
    envs = [decode(m.value()) for m in recs]
    assert {e.payload_json()["order_id"] for e in envs} == {f"o-{i}" for i in range(n)}
    assert all(e.metadata.correlation_id == "corr-independent" and e.namespace == "order-events" for e in envs)
    keys = dev_keys.keyring.keys_for("order-events")
    assert all(verify(m.value(), keys).key_id == "prism-worker-1" for m in recs)
    assert all(dict(m.headers())["prism-message-id"].decode() == e.message_id for m, e in zip(recs, envs, strict=True))
