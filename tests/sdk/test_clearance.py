"""Classification enforced at the consumer (app/sdk/audit.py): clearance, withheld messages,
the audit record written before every classified delivery, and `prism audit` reading it back.

The first test runs on every real backend; the attacker and audit-failure tests on the
embedded Kafka broker, where transport headers exist to be forged."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid

import pytest
from typer.testing import CliRunner

from app.envelope.codec import Layout, decode, encode
from app.envelope.model import new_envelope
from app.errors import ConfigError, DeliveryAuditError, SignatureError
from app.sdk import PrismClient, PrismPublishOptions
from app.sdk.audit import AuditFilter, Clearance, classification_of, read_audit
from app.security.signing import SigningKey, VerificationKeys, sign

pytestmark = pytest.mark.integration

PRODUCER = SigningKey.hmac_sha256("orders-producer-1", os.urandom(32))
TRUSTED = VerificationKeys.of([PRODUCER])
LEVELS = ["public", "internal", "confidential", "restricted", None]  # None: unclassified


async def publish_levels(client: PrismClient, topic: str) -> dict[str | None, str]:
    ids = {}
    for level in LEVELS:
        ids[level] = await client.publish(topic, {"level": level, "card": "4111-SECRET"},
                                          PrismPublishOptions(data_classification=level))
    return ids


async def drain(sub, count: int, timeout: float = 30) -> list:
    """Receive until `count` messages were either delivered or withheld."""
    got: list = []
    async with asyncio.timeout(timeout):
        while len(got) + sub.stats["withheld"] < count:
            msg = await sub.receive(timeout=1)
            if msg is not None:
                got.append(msg)
                await msg.ack()
    return got


async def test_clearance_withholds_and_audits_on_every_backend(backend_url, topic, caplog):
    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"
    low_topic, high_topic = topic + "-low", topic + "-high"  # PostgreSQL: one queue per topic, shared
    caplog.set_level(logging.WARNING, logger="prism.sdk")
    async with PrismClient(backend_url, namespace="order-events") as client:
        await publish_levels(client, low_topic)
        ids = await publish_levels(client, high_topic)

        async with client.subscribe(low_topic, group="dashboard", audit_topic=audit_topic) as sub:
            got = await drain(sub, len(LEVELS))
        assert sorted(str(m.security.data_classification) for m in got) == ["", "internal", "public"]
        assert sub.clearance.level == "internal"  # the default: classified data needs a declared clearance
        assert sub.stats["withheld"] == 2 and sub.withheld == {"confidential": 1, "restricted": 1}
        assert sub.stats["audited"] == 0
        assert any(getattr(r, "event", "") == "classified_withheld" for r in caplog.records)

        async with client.subscribe(high_topic, group="billing", clearance="confidential", principal="svc-billing",
                                    audit_topic=audit_topic) as sub:
            got = await drain(sub, len(LEVELS))
        assert {m.message_id for m in got} == {ids[x] for x in ("public", "internal", "confidential", None)}
        assert sub.withheld == {"restricted": 1} and sub.stats["audited"] == 1

    records, _ = await read_audit(backend_url, audit_topic=audit_topic)
    assert len(records) == 1
    rec = records[0]
    assert rec["principal"] == "svc-billing" and rec["group"] == "billing"
    assert rec["message_id"] == ids["confidential"] and rec["classification"] == "confidential"
    assert rec["namespace"] == "order-events" and rec["topic"] == high_topic and rec["time"].endswith("Z")
    assert "4111" not in json.dumps(rec) and "payload" not in rec  # never the data


async def test_a_forged_header_never_lowers_the_signed_classification(kafka_url, topic):
    """The attacker angle: the record says `data-classification: public` in every header
    spelling a producer uses, the signed envelope says restricted - the envelope wins. An
    envelope whose classification was rewritten after signing fails verification instead."""
    from aiokafka import AIOKafkaProducer

    bootstrap = kafka_url.split("://", 1)[1].split("?")[0]
    restricted = new_envelope(topic, {"card": "4111"}, namespace="order-events", data_classification="restricted")
    signed = sign(restricted, PRODUCER)
    downgraded = decode(signed)
    downgraded.security.data_classification = "public"  # signature kept, classification rewritten
    control = sign(new_envelope(topic, {"ok": 1}, namespace="order-events", data_classification="public"), PRODUCER)
    forged_headers = [("data-classification", b"public"), ("X-Data-Classification", b"public"),
                      ("prism-data-classification", b"public")]
    async with PrismClient(kafka_url, namespace="order-events") as client:
        await client.connect()
        await client.backend.ensure_topic(topic)  # type: ignore[attr-defined]
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for value in (signed, encode(downgraded, Layout.REVIEWED), control):
                await producer.send_and_wait(topic, value, headers=forged_headers)
        finally:
            await producer.stop()
        errors, delivered = [], []
        async with asyncio.timeout(30), client.subscribe(topic, group="g", verify_with=TRUSTED,
                                                         clearance="internal") as sub:
            while len(delivered) + len(errors) + sub.stats["withheld"] < 3:
                try:
                    msg = await sub.receive(timeout=1)
                except SignatureError as err:
                    errors.append(err)
                    await err.delivery.ack()
                    continue
                if msg is not None:
                    delivered.append(msg)
                    await msg.ack()
    assert sub.withheld == {"restricted": 1}  # judged by the signed envelope, not the headers
    assert len(errors) == 1 and "forged or tampered" in str(errors[0])
    assert [m.payload() for m in delivered] == [{"ok": 1}]


async def test_no_delivery_without_its_audit_record(kafka_url, topic):
    """The audit write fails once: the message is not handed out, it is nacked and comes back,
    and the second delivery is audited before the application sees it."""
    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"
    async with PrismClient(kafka_url, namespace="order-events") as client:
        mid = await client.publish(topic, {"x": 1}, PrismPublishOptions(data_classification="restricted"))
        real = client.backend.publish
        failures = []

        async def flaky(items):
            if items and items[0].topic == audit_topic and not failures:
                failures.append(items[0].envelope.message_id)
                raise ConnectionError("audit topic unreachable")
            return await real(items)

        client.backend.publish = flaky  # type: ignore[method-assign]
        async with asyncio.timeout(30), client.subscribe(topic, group="g", clearance="restricted",
                                                         principal="svc-risk", audit_topic=audit_topic) as sub:
            with pytest.raises(DeliveryAuditError) as info:
                while True:
                    await sub.receive(timeout=1)
            assert info.value.code == "delivery_audit_failed" and mid in str(info.value)
            assert info.value.delivery._settled == "nacked" and sub.stats["audited"] == 0
            msg = None
            while msg is None:
                msg = await sub.receive(timeout=1)
            assert msg.message_id == mid and sub.stats["audited"] == 1
            await msg.ack()
        client.backend.publish = real  # type: ignore[method-assign]
    records, _ = await read_audit(kafka_url, audit_topic=audit_topic)
    assert [r["message_id"] for r in records] == [mid] and records[0]["principal"] == "svc-risk"


def test_prism_audit_reads_and_filters(kafka_url, topic):
    """Synchronous: the command runs its own event loop, as from a shell."""
    from app.cli.main import build_app

    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"

    async def deliver() -> dict[str | None, str]:
        async with PrismClient(kafka_url, namespace="order-events") as client:
            ids = await publish_levels(client, topic)
            for group, principal in (("a", "svc-a"), ("b", "svc-b")):
                async with client.subscribe(topic, group=group, clearance="restricted", principal=principal,
                                            audit_topic=audit_topic) as sub:
                    await drain(sub, len(LEVELS))
        return ids

    ids = asyncio.run(deliver())
    url = kafka_url.split("?")[0]

    def run(*args: str):
        result = CliRunner().invoke(build_app(), ["audit", "--url", url, "--audit-topic", audit_topic, *args])
        assert result.exit_code == 0, result.output
        return result.output

    everything = [json.loads(line) for line in run("--json").splitlines()]
    assert len(everything) == 4  # two classified messages, two readers
    only_b = [json.loads(line) for line in run("--json", "--principal", "svc-b", "--topic", topic).splitlines()]
    assert {r["message_id"] for r in only_b} == {ids["confidential"], ids["restricted"]}
    assert {r["principal"] for r in only_b} == {"svc-b"}
    restricted = [json.loads(line) for line in run("--json", "--classification", "restricted").splitlines()]
    assert {r["message_id"] for r in restricted} == {ids["restricted"]}
    assert run("--json", "--topic", "another.topic") == ""
    assert run("--json", "--since", "2999-01-01T00:00:00Z") == ""
    assert "4 audited deliveries" in run("--since", "1h")
    bad = CliRunner().invoke(build_app(), ["audit", "--url", url, "--classification", "public", "--since", "soon"])
    assert bad.exit_code == 2 and "--classification" in bad.output and "--since" in bad.output


def test_clearance_settings_are_validated_all_at_once():
    with pytest.raises(ConfigError) as info:
        Clearance.of("secret", "has space", "bad topic!", "orders")
    text = str(info.value)
    assert "clearance='secret'" in text and "principal=" in text and "audit_topic=" in text
    with pytest.raises(ConfigError, match="needs principal="):
        Clearance.of("restricted", None, None, "orders")
    with pytest.raises(ConfigError, match="subscribed topic itself"):
        Clearance.of("confidential", "svc", "orders", "orders")
    c = Clearance.of(None, None, None, "orders")
    assert (c.level, c.audit_topic) == ("internal", "prism.audit")
    assert c.allows("internal") and not c.allows("confidential")


def test_an_unknown_or_missing_classification_is_judged_conservatively():
    env = new_envelope("t", {"a": 1}, namespace="ns")
    assert classification_of(env) == "internal"  # unlabelled data is not public
    env.ensure_security().data_classification = "top-secret"
    assert classification_of(env) == "restricted"  # an unknown word fails closed
    f = AuditFilter(principal="svc-a")
    assert f.matches({"principal": "svc-a", "time_ms": 1}) and not f.matches({"principal": "svc-b"})
