"""Classification enforced at the consumer (app/sdk/audit.py): clearance, withheld messages,
the audit record written before every classified delivery and every refused read, signed by the
delivering client's key, and `prism audit` reading them back - verifying each, so a forged record
(unsigned, or signed by another service's key) is shown as FAILED and never like a real one.

The first test runs on every real backend; the attacker and audit-failure tests on the
embedded Kafka broker, where transport headers exist to be forged."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from app.envelope.codec import Layout, decode, encode
from app.envelope.model import new_envelope
from app.errors import ConfigError, DeliveryAuditError, SignatureError
from app.sdk import PrismClient, PrismPublishOptions
from app.sdk.audit import (
    REFUSALS_PER_RECORD,
    AuditFilter,
    Clearance,
    classification_of,
    read_audit,
    refusals_record,
    refused_reads,
)
from app.security.signing import SigningKey, VerificationKeys, sign

pytestmark = pytest.mark.integration

PRODUCER = SigningKey.hmac_sha256("orders-producer-1", os.urandom(32))
TRUSTED = VerificationKeys.of([PRODUCER])
#: each subscriber service's own key (the keyring binds it to the principal: publisher_id)
READERS = {p: SigningKey.hmac_sha256(f"{p}-key", os.urandom(32))
           for p in ("svc-billing", "svc-risk", "svc-a", "svc-b", "svc-ceo")}


def write_keyring(path: Path, principals: tuple[str, ...] = tuple(READERS), unbound: SigningKey | None = None) -> Path:
    """The signing keyring `prism audit --keyring` verifies with: each reader's key bound to it."""
    keys = [{"id": READERS[p].key_id, "algorithm": "hmac-sha256", "secret_b64": base64.b64encode(READERS[p].secret).decode(),
             "publisher_id": p} for p in principals]
    if unbound is not None:
        keys.append({"id": unbound.key_id, "algorithm": "hmac-sha256",
                     "secret_b64": base64.b64encode(unbound.secret).decode()})
    path.write_text(yaml.safe_dump({"keys": keys}))
    return path
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
    public_topic = topic + "-public"
    caplog.set_level(logging.WARNING, logger="prism.sdk")
    async with PrismClient(backend_url, namespace="order-events", signing_key=READERS["svc-billing"]) as client:
        await publish_levels(client, low_topic)
        ids = await publish_levels(client, high_topic)
        public_ids = await publish_levels(client, public_topic)

        # a public feed is refused internal and unlabelled data too: every refusal is audited
        async with client.subscribe(public_topic, group="feed", clearance="public", audit_topic=audit_topic) as sub:
            got = await drain(sub, len(LEVELS))
        assert [m.message_id for m in got] == [public_ids["public"]]
        assert sub.withheld == {"internal": 2, "confidential": 1, "restricted": 1}

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
    # each refused read leaves a record, not only a log line (several from one fetch share one record)
    refused = [(r["group"], r["classification"], r["clearance"], r["principal"]) for rec in records
               for r in refused_reads(rec)]
    assert sorted(refused) == [("billing", "restricted", "confidential", "svc-billing"),
                               ("dashboard", "confidential", "internal", None),
                               ("dashboard", "restricted", "internal", None),
                               ("feed", "confidential", "public", None), ("feed", "internal", "public", None),
                               ("feed", "internal", "public", None), ("feed", "restricted", "public", None)]
    feed = {r["message_id"] for rec in records for r in refused_reads(rec) if r["group"] == "feed"}
    assert feed == {public_ids[x] for x in ("internal", None, "confidential", "restricted")}
    records = [r for r in records if r["event"] == "classified_delivery"]
    assert len(records) == 1
    rec = records[0]
    assert rec["principal"] == "svc-billing" and rec["group"] == "billing"
    assert rec["message_id"] == ids["confidential"] and rec["classification"] == "confidential"
    assert rec["namespace"] == "order-events" and rec["topic"] == high_topic and rec["time"].endswith("Z")
    assert "4111" not in json.dumps(rec) and "payload" not in rec  # never the data


async def test_on_postgresql_a_withheld_message_stays_for_a_cleared_subscriber(pg_url, topic):
    """PostgreSQL's queue has one `consumed` flag per row, shared by every subscriber: withholding
    used to ack the row, so a message above one subscriber's clearance was gone for the
    subscribers that had the clearance too."""
    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"
    async with PrismClient(pg_url, namespace="order-events", signing_key=READERS["svc-billing"]) as client:
        ids = await publish_levels(client, topic)
        async with client.subscribe(topic, group="dashboard", audit_topic=audit_topic, batch_size=2) as low:
            got = await drain(low, len(LEVELS))
            assert {m.message_id for m in got} == {ids[x] for x in ("public", "internal", None)}
            assert low.withheld == {"confidential": 1, "restricted": 1}
            # this subscription never claims the withheld rows again (no busy loop over them)
            assert await low.receive(timeout=1.5) is None
            assert low.stats["withheld"] == 2
            # while the first subscription is still open, a cleared one gets what it withheld
            async with client.subscribe(topic, group="billing", clearance="restricted", principal="svc-billing",
                                        audit_topic=audit_topic) as high:
                got_high = await drain(high, 2)
        assert {m.message_id for m in got_high} == {ids["confidential"], ids["restricted"]}
        assert high.stats["withheld"] == 0 and high.stats["audited"] == 2
        # consumed now: no later subscriber sees them
        async with client.subscribe(topic, group="late", clearance="restricted", principal="svc-billing",
                                    audit_topic=audit_topic) as late:
            assert await late.receive(timeout=1.5) is None
    records, _ = await read_audit(pg_url, audit_topic=audit_topic)
    records = [r for rec in records for r in (refused_reads(rec) or [rec])]
    assert sorted((r["event"], r["group"], r["classification"]) for r in records) == [
        ("classified_delivery", "billing", "confidential"), ("classified_delivery", "billing", "restricted"),
        ("classified_refused", "dashboard", "confidential"), ("classified_refused", "dashboard", "restricted")]


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
    async with PrismClient(kafka_url, namespace="order-events", signing_key=READERS["svc-risk"]) as client:
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


def test_prism_audit_reads_and_filters(kafka_url, topic, tmp_path):
    """Synchronous: the command runs its own event loop, as from a shell."""
    from app.cli.main import build_app

    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"
    keyring = write_keyring(tmp_path / "keyring.yaml")

    async def deliver() -> dict[str | None, str]:
        async with PrismClient(kafka_url, namespace="order-events") as client:
            ids = await publish_levels(client, topic)
        for group, principal in (("a", "svc-a"), ("b", "svc-b")):
            async with PrismClient(kafka_url, namespace="order-events", signing_key=READERS[principal]) as client, \
                    client.subscribe(topic, group=group, clearance="restricted", principal=principal,
                                     audit_topic=audit_topic) as sub:
                await drain(sub, len(LEVELS))
        return ids

    ids = asyncio.run(deliver())
    url = kafka_url.split("?")[0]

    def run(*args: str):
        result = CliRunner().invoke(build_app(), ["audit", "--url", url, "--audit-topic", audit_topic,
                                                  "--keyring", str(keyring), *args])
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
    assert "4 audited deliveries, 0 refused reads" in run("--since", "1h")
    assert all(r["verified"] and r["signed_by"] == READERS[r["principal"]].key_id for r in everything)
    bad = CliRunner().invoke(build_app(), ["audit", "--url", url, "--classification", "public", "--since", "soon"])
    assert bad.exit_code == 2 and "--classification" in bad.output and "--since" in bad.output
    assert "--keyring" in bad.output


def test_forged_audit_records_are_shown_as_failed(kafka_url, topic, tmp_path):
    """The attacker who can write the audit topic: an unsigned record claiming that svc-ceo read
    a restricted message, one signed by svc-a's (trusted) key but naming svc-ceo, one signed by a
    key the keyring binds to nobody, one signed by an unknown key and one deeply nested. Each is
    listed marked FAILED with why, the real one is `ok`, and the command exits 1."""
    from app.cli.main import build_app
    from app.sdk.audit import audit_envelope, audit_record
    from app.sdk.backends.base import Outgoing

    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"
    loner = SigningKey.hmac_sha256("nobodys-key", os.urandom(32))
    keyring = write_keyring(tmp_path / "keyring.yaml", unbound=loner)
    target = new_envelope(topic, {"card": "4111"}, namespace="order-events", data_classification="restricted")

    async def forge() -> None:
        async with PrismClient(kafka_url, namespace="order-events") as client:
            await client.connect()
            ceo = audit_record(target, "restricted", principal="svc-ceo", group="ceo", backend="kafka", ref="0:1")
            deep = new_envelope(audit_topic, b'{"event": "classified_delivery", "x": ' + b"[" * 5000 + b"]" * 5000
                                + b"}", namespace="order-events", content_type="application/json")
            outs = [Outgoing(audit_topic, audit_envelope(ceo, audit_topic, "order-events"), Layout.REVIEWED),
                    Outgoing(audit_topic, audit_envelope(ceo, audit_topic, "order-events"), Layout.REVIEWED,
                             READERS["svc-a"]),
                    Outgoing(audit_topic, audit_envelope(ceo, audit_topic, "order-events"), Layout.REVIEWED, loner),
                    Outgoing(audit_topic, audit_envelope(ceo, audit_topic, "order-events"), Layout.REVIEWED,
                             SigningKey.hmac_sha256("svc-ceo-key", os.urandom(32))),
                    Outgoing(audit_topic, deep, Layout.REVIEWED, READERS["svc-ceo"])]
            await client.backend.publish(outs)
        async with PrismClient(kafka_url, namespace="order-events", signing_key=READERS["svc-ceo"]) as client:
            await client.publish(topic, {"card": "4111"}, PrismPublishOptions(data_classification="restricted"))
            async with client.subscribe(topic, group="ceo", clearance="restricted", principal="svc-ceo",
                                        audit_topic=audit_topic) as sub:
                await drain(sub, 1)

    asyncio.run(forge())
    res = CliRunner().invoke(build_app(), ["audit", "--url", kafka_url.split("?")[0], "--audit-topic", audit_topic,
                                           "--keyring", str(keyring), "--json"])
    assert res.exit_code == 1, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [r["verified"] for r in rows] == [False, False, False, False, True]
    problems = [r["problem"] for r in rows[:4]]
    assert problems[0].startswith("unsigned")
    assert "of 'svc-a', but the record names principal 'svc-ceo'" in problems[1]
    assert "binds to no principal" in problems[2]
    assert "signature does not verify" in problems[3]
    human = CliRunner().invoke(build_app(), ["audit", "--url", kafka_url.split("?")[0], "--audit-topic", audit_topic,
                                             "--keyring", str(keyring)])
    assert human.exit_code == 1
    assert human.output.count("FAILED:") == 4 and "4 record(s) FAILED verification" in human.output
    assert "1 other messages" in human.output  # the deeply nested one: not an audit record, and no crash


def test_a_flood_of_refusals_is_audited_in_bounded_records(kafka_url, topic, tmp_path):
    """The attacker who can publish to a topic labels 600 small messages `internal`, above a
    public subscriber's clearance. Every refusal is audited - each message id in a signed record
    that `prism audit --keyring` verifies and lists - but in one record per fetch, not one per
    message: the audit topic gets fewer records and fewer bytes than the attacker sent."""
    from app.cli.main import build_app

    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"
    keyring = write_keyring(tmp_path / "keyring.yaml")
    flood = 600

    async def attack() -> tuple[list[str], int, dict[str, int], int]:
        async with PrismClient(kafka_url, namespace="order-events") as attacker:
            ids = await attacker.publish_batch([(topic, {"i": i}, PrismPublishOptions(data_classification="internal"))
                                                for i in range(flood)])
        sent = sum(len(r.value) for r in await attacker.backend.sample(topic, flood + 10))
        async with PrismClient(kafka_url, namespace="order-events", signing_key=READERS["svc-a"]) as client, \
                client.subscribe(topic, group="feed", clearance="public", principal="svc-a",
                                 audit_topic=audit_topic, batch_size=64) as sub:
            assert await drain(sub, flood, timeout=60) == []
            stats = dict(sub.stats)
        written = sum(len(r.value) for r in await client.backend.sample(audit_topic, flood + 10))
        return ids, sent, stats, written

    ids, sent, stats, written = asyncio.run(attack())
    assert stats["withheld"] == flood
    assert stats["refusal_records"] <= flood // 10  # ~one per fetch of up to 64, never one per message
    assert written < sent  # the flood costs the audit topic less than it cost the attacker
    res = CliRunner().invoke(build_app(), ["audit", "--url", kafka_url.split("?")[0], "--audit-topic", audit_topic,
                                           "--keyring", str(keyring), "--json", "--classification", "internal"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert sorted(r["message_id"] for r in rows) == sorted(ids)  # every refused read, each once
    assert all(r["verified"] and r["signed_by"] == READERS["svc-a"].key_id and r["event"] == "classified_refused"
               and r["clearance"] == "public" and r["principal"] == "svc-a" for r in rows)
    human = CliRunner().invoke(build_app(), ["audit", "--url", kafka_url.split("?")[0], "--audit-topic", audit_topic,
                                             "--keyring", str(keyring), "--principal", "svc-a"])
    assert human.exit_code == 0 and f"0 audited deliveries, {flood} refused reads" in human.output
    assert human.output.count("REFUSED svc-a") == flood


async def test_no_refusal_is_settled_without_its_record(kafka_url, topic):
    """The shared refusal record fails once: every message it stood for is nacked, comes back,
    and is refused - and audited - again; none is settled unaudited."""
    audit_topic = f"audit.{uuid.uuid4().hex[:10]}"
    async with PrismClient(kafka_url, namespace="order-events", signing_key=READERS["svc-a"]) as client:
        ids = await client.publish_batch([(topic, {"i": i}, PrismPublishOptions(data_classification="restricted"))
                                          for i in range(5)])
        real = client.backend.publish
        failures = []

        async def flaky(items):
            if items and items[0].topic == audit_topic and not failures:
                failures.append(items[0].envelope.message_id)
                raise ConnectionError("audit topic unreachable")
            return await real(items)

        client.backend.publish = flaky  # type: ignore[method-assign]
        async with asyncio.timeout(30), client.subscribe(topic, group="g", audit_topic=audit_topic) as sub:
            with pytest.raises(DeliveryAuditError) as info:
                while True:
                    await sub.receive(timeout=1)
            assert info.value.code == "delivery_audit_failed" and "refusal audit record" in str(info.value)
            assert sub.stats["refusal_records"] == 0 and info.value.delivery._settled == "nacked"
            audited: set[str] = set()
            while audited != set(ids):  # they come back, are refused again, and this time audited
                assert await sub.receive(timeout=1) is None, "a restricted message reached an internal subscriber"
                records, _ = await read_audit(kafka_url, audit_topic=audit_topic)
                audited = {r["message_id"] for rec in records for r in refused_reads(rec)}
            assert sub.stats["withheld"] > len(ids)  # the nacked ones were refused a second time
        client.backend.publish = real  # type: ignore[method-assign]
    records, _ = await read_audit(kafka_url, audit_topic=audit_topic)
    assert {r["message_id"] for rec in records for r in refused_reads(rec)} == set(ids)


def test_a_record_of_several_refusals_stays_bounded_and_filterable():
    """`refusals_record` names each message; `AuditFilter` matches it when one of them matches;
    `refused_reads` skips malformed entries a forger might add instead of crashing."""
    envs = [new_envelope("t", {"a": i}, namespace=f"ns{i % 2}", data_classification=c)
            for i, c in enumerate(["internal", "restricted", "confidential"])]
    entries = [{"message_id": e.message_id, "namespace": e.namespace, "classification": c, "ref": f"0:{i}"}
               for i, (e, c) in enumerate(zip(envs, ["internal", "restricted", "confidential"], strict=True))]
    rec = refusals_record(envs[0], entries, clearance="public", principal=None, group="g", backend="kafka")
    assert rec["count"] == 3 and rec["classification"] == "restricted" and rec["principal"] is None
    assert [r["message_id"] for r in refused_reads(rec)] == [e.message_id for e in envs]
    assert AuditFilter(classification="confidential").matches(rec)
    assert AuditFilter(namespace="ns1").matches(rec) and not AuditFilter(namespace="ns9").matches(rec)
    assert rec["messages"][0] == [envs[0].message_id, "internal", "0:0"]  # compact: namespace only where it differs
    assert rec["messages"][1] == [envs[1].message_id, "restricted", "0:1", "ns1"]
    forged = {**rec, "messages": [*rec["messages"], "junk", [5, "a", "b"], ["x", "internal"], {"message_id": "y"}]}
    assert len(refused_reads(forged)) == 3
    big = [{**entries[0], "message_id": "x" * 36} for _ in range(REFUSALS_PER_RECORD)]
    encoded = json.dumps(refusals_record(envs[0], big, clearance="public", principal="p", group="g", backend="k"))
    assert len(encoded) < 64 * 1024  # what the reader (`prism audit`) accepts


def test_an_audited_clearance_needs_a_signing_key():
    with pytest.raises(ConfigError, match="signing_key"):
        Clearance.of("confidential", "svc-billing", None, "orders", signed=False)
    assert Clearance.of("confidential", "svc-billing", None, "orders", signed=True).level == "confidential"


def test_clearance_settings_are_validated_all_at_once():
    with pytest.raises(ConfigError) as info:
        Clearance.of("secret", "has space", "bad topic!", "orders")
    text = str(info.value)
    assert "clearance='secret'" in text and "principal=" in text and "audit_topic=" in text
    with pytest.raises(ConfigError, match="needs principal="):
        Clearance.of("restricted", None, None, "orders", signed=True)
    with pytest.raises(ConfigError, match="subscribed topic itself"):
        Clearance.of("confidential", "svc", "orders", "orders", signed=True)
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
