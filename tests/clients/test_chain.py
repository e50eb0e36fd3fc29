"""Across languages, through the worker, on Apache Kafka (issue 30): a client of one language
signs, the Python worker verifies and re-signs, a client of another language verifies the
worker's signature and decodes the payload.

* Go -> worker -> Rust: the Go client (clients/go/internal/interop, op `publish`) signs orders
  with an HMAC key; the worker (a real `WorkerProcess` running the shipped orders-created
  topology) verifies that key, establishes the producer's identity by it, stamps the schema
  context and re-signs with its Ed25519 key (batch scope); the Rust subscriber
  (clients/rust/examples/kafka_interop.rs) verifies with the worker's public key alone.
* Rust -> worker -> Go: the same the other way round.

* Go -> worker -> Go with a binary protobuf payload: the Go producer encodes each order by the
  schema the registry holds for the topic (OrderCreated, wire format, application/protobuf) and
  validates it before publishing; the Go consumer decodes it by the schema its envelope
  references.

The order schema (topologies/schemas/order_created.proto) is registered in a real Prism
registry that the test starts, and the worker's enrich stage resolves it from there
(`registry_type: prism`), so every envelope on `.v3` references it by URL and hash. The Go
consumer resolves that reference (checked: the topic's subject, the hash) and decodes the
payload by the schema - a `prism.examples.orders.OrderCreated` message, from the protobuf JSON
mapping or the wire format - and reports the decoded fields, which the test compares with what
the producer sent. The Rust consumer does the same (prism_client::schema_decode: the reference
checked the same way, the protobuf schema read from the registry's serialized descriptor).

What each test proves: every produced order arrives at the consumer exactly once, under the
worker's signature (its key id, scope batch), with `prism.identity.method: key` naming the
producer's key (a worker that had not verified the producer would say `none`), the schema
context of the topology's enrich stage, and the payload the producer wrote. Nothing goes to
the DLQ and `.v3` holds no copy beyond the one each order should have.

The producer keys are added to the dev keyring bound to a publisher (docs/signing.md "Keyring
files") and restricted to `order-events`, and declared in the topology's `producers:` with
their key id (docs/topologies.md "What a producer may claim") - otherwise the worker would not
accept them as the order producer's.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from app.broker.admin import ensure_topics
from app.demo.runner import read_all
from app.security.devkeys import DevKeys
from app.security.signing import SCOPE_BATCH, load_signing_keyring
from app.topology import Topology, load_topology
from app.worker.faust_app import WorkerProcess
from tests.clients.test_go import HMAC_SECRET, call, go_interop  # noqa: F401 - go_interop: a fixture
from tests.clients.test_rust_client import _conformance, _run, interop  # noqa: F401 - interop: a fixture
from tests.kafka.cluster import ApacheKafka
from tests.sdk.test_version_reports import registry_server  # noqa: F401 - a fixture
from tests.support import USERS
from tests.worker.conftest import ROOT, dev_keys, make_topology  # noqa: F401 - dev_keys: a fixture

TARGET = "app.worker.pipeline:app_from_env"
ORDERS = 5
GO_KEY_ID = "go-chain-1"
GO_PUBLISHER = "svc-go-orders"
RUST_PUBLISHER = "svc-rust-orders"
SCHEMA = {"name": "prism.examples.orders.OrderCreated", "version": "v2"}
ORDER_TYPE = "prism.examples.orders.OrderCreated"


def _rust_key() -> tuple[str, bytes]:
    """The HMAC key kafka_interop signs with (the conformance suite's test key)."""
    k = _conformance("signatures/scope-v2-hmac-sha256.json")["key"]
    return k["key_id"], bytes.fromhex(k["secret_hex"])


class Chain:
    """The shipped topology with both producer keys trusted, its topics, and a worker running it."""

    def __init__(self, kafka: ApacheKafka, tmp_path: Path, keys: DevKeys, registry: tuple[str, Any]) -> None:
        self.kafka = kafka
        self.tmp_path = tmp_path
        ring = json.loads(keys.signing_path.read_text())
        rust_id, rust_secret = _rust_key()
        for kid, secret, publisher in ((GO_KEY_ID, HMAC_SECRET, GO_PUBLISHER), (rust_id, rust_secret, RUST_PUBLISHER)):
            ring["keys"].append({"id": kid, "algorithm": "hmac-sha256", "secret_b64": base64.b64encode(secret).decode(),
                                 "namespaces": ["order-events"], "publisher_id": publisher})
        ring_path = tmp_path / "chain-keyring.json"
        ring_path.write_text(json.dumps(ring))
        worker_key = load_signing_keyring(ring_path).worker_key()
        assert worker_key is not None and worker_key.private_key is not None
        self.worker_key_id = worker_key.key_id
        self.worker_public_hex = worker_key.private_key.public_key().public_bytes_raw().hex()
        self.rust_key_id = rust_id

        make_topology(tmp_path, keys, partitions=1)
        path = tmp_path / "topology.yaml"
        doc = yaml.safe_load(path.read_text())
        self.source = doc["sources"][0]["topic"]
        # the order schema in the registry, under the topic's subject; the worker resolves it there
        self.registry_url, store = registry
        text = (ROOT / "topologies/schemas/order_created.proto").read_text(encoding="utf-8")
        store.register(self.source, text, "PROTOBUF", actor="test", label=SCHEMA["version"])
        self.schema_hash = store.get(self.source, "latest").hash
        for stage in doc["stages"]:
            if "verify_signature" in stage:
                stage["verify_signature"]["keyring"] = str(ring_path)
            if "enrich" in stage:
                stage["enrich"]["schema"] = {"registry_type": "prism", "url": self.registry_url, "subject": self.source,
                                             "version": "latest", "message": ORDER_TYPE}
        doc["producers"] += [{"name": "go-orders", "key_ids": [GO_KEY_ID], "namespaces": ["order-events"]},
                             {"name": "rust-orders", "key_ids": [rust_id], "namespaces": ["order-events"]}]
        path.write_text(yaml.safe_dump(doc))
        self.topology: Topology = load_topology(path)
        self.source = self.topology.sources[0].topic
        self.worker = WorkerProcess(TARGET, log_path=tmp_path / "worker.log", env={
            "PRISM_TOPOLOGY": str(path), "PRISM_BOOTSTRAP": kafka.bootstrap, "PRISM_DATA_DIR": str(tmp_path / "data"),
            "PRISM_APP_ID": f"chain-{uuid.uuid4().hex[:8]}", "PRISM_BROKER_URL": kafka.bootstrap,
            "PRISM_REGISTRY_USER": "reader", "PRISM_REGISTRY_PASSWORD": USERS["reader"][0]})

    def registry_request(self) -> dict[str, str]:
        """What the Go interop needs to read the registry (as its read-only user)."""
        return {"registry_url": self.registry_url, "user": "reader", "password": USERS["reader"][0]}

    async def __aenter__(self) -> Chain:
        await ensure_topics(self.kafka.bootstrap, self.topology.topics())
        self.worker.start(timeout=120)
        return self

    async def __aexit__(self, *exc: object) -> None:
        code = self.worker.stop(timeout=60)
        if exc[0] is None:
            assert code == 0, self.worker.log_tail(4000)

    async def check_outputs(self) -> None:
        """Every record on `.v3` and the DLQ, read until quiet: exactly `ORDERS` on `.v3` (one more
        would be a copy), none in the DLQ, and no payload the schema check marked as failed
        (validation: warn forwards a mismatch with the header `prism-schema-validation`)."""
        v3, dlq = self.source + ".v3", self.source + self.topology.dlq.topic_suffix
        records = await read_all(self.kafka.bootstrap, {v3: 1, dlq: 1}, expected_total=ORDERS + 1, timeout=30)
        assert len(records[v3]) == ORDERS
        assert records[dlq] == []
        assert [h for r in records[v3] for h in r.headers if h[0] == "prism-schema-validation"] == []

    def check(self, got: list[dict[str, Any]], sent: list[dict[str, Any]], producer_key_id: str,
              publisher: str) -> None:
        """What the consumer reported for each message, against what the producer sent."""
        assert sorted(json.dumps(m["payload"], sort_keys=True) for m in got) == \
            sorted(json.dumps(p, sort_keys=True) for p in sent), "every order exactly once"
        for m in got:
            where = m["payload"]
            assert m["key_id"] == self.worker_key_id, where  # re-signed by the worker ...
            assert m["scope"] in (SCOPE_BATCH, "batch"), where  # ... in batch scope
            assert m["extensions"]["prism.identity.method"] == "key", (where, m["extensions"])
            assert m["extensions"]["prism.identity.key_id"] == producer_key_id, where
            assert {k: m["schema"][k] for k in SCHEMA} == SCHEMA, (where, m["schema"])
            assert m["classification"] == "internal", where
            assert m["publisher_id"] == publisher, where  # the identity the key is bound to

    def check_decoded(self, got: list[dict[str, Any]], content_type: str) -> None:
        """The consumer (Go's or Rust's) decoded each payload by the schema its envelope references: the
        registry's version of the topic's subject, as an OrderCreated message."""
        for m in got:
            assert m["decoded_by"]["subject"] == self.source, m
            assert m["decoded_by"]["version"] == 1 and m["decoded_by"]["format"] == "protobuf", m
            assert m["decoded_by"]["type"] == ORDER_TYPE, m
            assert m["decoded_by"]["content_type"] == content_type, m
            assert m["schema"]["hash"] == self.schema_hash, m  # the reference the worker stamped


async def test_go_produces_worker_resigns_rust_consumes(kafka: ApacheKafka, tmp_path: Path, dev_keys: DevKeys,  # noqa: F811
                                                        go_interop: Path, interop: Path,  # noqa: F811
                                                        registry_server: Any) -> None:  # noqa: F811
    orders = [{"order_id": f"go-{i}", "customer_id": "c-7", "total": 10.5 + i, "currency": "EUR"}
              for i in range(ORDERS)]
    async with Chain(kafka, tmp_path, dev_keys, registry_server) as chain:
        # the Go producer validates each payload against the registry's schema before publishing
        out = call(go_interop, {"op": "publish", "brokers": [kafka.bootstrap], "topic": chain.source,
                                "namespace": "order-events", "layout": "reviewed", "payloads": orders,
                                "hmac_key_id": GO_KEY_ID, "hmac_hex": HMAC_SECRET.hex(),
                                "classification": "internal", **chain.registry_request()})
        assert "error" not in out, out
        audit = kafka.create_topic(f"chain-audit-{uuid.uuid4().hex[:8]}")
        # the Rust subscriber trusts the worker's public key (and its own HMAC test key, not the Go one)
        # ... and decodes each payload by the schema its envelope references, from the registry
        reg = chain.registry_request()
        lines = _run(interop, "subscribe", kafka.bootstrap, chain.source + ".v3", str(ORDERS), "internal",
                     "svc-rust-billing", audit, chain.worker_key_id, chain.worker_public_hex,
                     env={"PRISM_INTEROP_REGISTRY_URL": reg["registry_url"], "PRISM_INTEROP_REGISTRY_USER": reg["user"],
                          "PRISM_INTEROP_REGISTRY_PASSWORD": reg["password"]})
        await chain.check_outputs()
    got = [ln for ln in lines if "payload" in ln]
    assert [ln for ln in lines if "error" in ln or "fatal" in ln] == []
    assert lines[-1]["stats"] == {"delivered": ORDERS, "withheld": 0, "audited": 0, "failed": 0, "expired": 0,
                                  "refusal_records": 0}
    assert sorted(m["message_id"] for m in got) == sorted(out["message_ids"])  # the producer's ids, kept
    chain.check(got, orders, GO_KEY_ID, GO_PUBLISHER)
    chain.check_decoded(got, "application/json")


async def test_rust_produces_worker_resigns_go_consumes(kafka: ApacheKafka, tmp_path: Path, dev_keys: DevKeys,  # noqa: F811
                                                        go_interop: Path, interop: Path,  # noqa: F811
                                                        registry_server: Any) -> None:  # noqa: F811
    async with Chain(kafka, tmp_path, dev_keys, registry_server) as chain:
        sent = _run(interop, "publish-orders", kafka.bootstrap, chain.source, str(ORDERS), "order-events")
        assert [s["i"] for s in sent] == list(range(ORDERS))
        # the Go subscriber trusts the worker's public key only
        out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": chain.source + ".v3",
                                "namespace": "order-events", "group": f"g-{uuid.uuid4().hex[:8]}", "count": ORDERS,
                                "timeout_s": 90, "ed25519_key_id": chain.worker_key_id,
                                "ed25519_public_hex": chain.worker_public_hex, "clearance": "internal",
                                **chain.registry_request()})
        await chain.check_outputs()
    assert not out.get("errors"), out
    got = out["messages"]
    assert sorted(m["message_id"] for m in got) == sorted(s["message_id"] for s in sent)
    # the payload as the schema reads it (the protobuf JSON mapping of Rust's JSON) equals what Rust sent
    chain.check(got, [s["payload"] for s in sent], chain.rust_key_id, RUST_PUBLISHER)
    chain.check_decoded(got, "application/json")
    assert all(m["headers"]["prism-envelope-layout"] == "reviewed" for m in got)
    assert not any("prism-schema-validation" in m["headers"] for m in got)  # as the Go consumer sees it
    assert out["committed"] == {"0": ORDERS}


async def test_go_publishes_protobuf_by_the_registry_schema_and_go_decodes_it(
        kafka: ApacheKafka, tmp_path: Path, dev_keys: DevKeys, go_interop: Path,  # noqa: F811
        registry_server: Any) -> None:  # noqa: F811
    """A binary payload through the worker: the Go producer encodes each order by the topic's
    schema from the registry (wire format, application/protobuf), validated before it is sent;
    the worker verifies, checks it against the same schema (validation: warn marks nothing) and
    re-signs; the Go consumer resolves the schema the envelope references and decodes the wire
    format into OrderCreated - the fields equal what was sent, the PII field masked by the
    schema's tag."""
    orders = [{"order_id": f"pb-{i}", "customer_id": "c-9", "customer_email": f"c{i}@example.com",
               "items": [{"sku": "A-1", "qty": i + 1}], "total": 20.25 + i, "currency": "EUR"}
              for i in range(ORDERS)]
    async with Chain(kafka, tmp_path, dev_keys, registry_server) as chain:
        out = call(go_interop, {"op": "publish", "brokers": [kafka.bootstrap], "topic": chain.source,
                                "namespace": "order-events", "layout": "reviewed", "payloads": orders,
                                "hmac_key_id": GO_KEY_ID, "hmac_hex": HMAC_SECRET.hex(),
                                "classification": "internal", "content_type": "application/protobuf",
                                **chain.registry_request()})
        assert "error" not in out, out
        got_out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": chain.source + ".v3",
                                    "namespace": "order-events", "group": f"g-{uuid.uuid4().hex[:8]}",
                                    "count": ORDERS, "timeout_s": 90, "ed25519_key_id": chain.worker_key_id,
                                    "ed25519_public_hex": chain.worker_public_hex, "clearance": "internal",
                                    **chain.registry_request()})
        await chain.check_outputs()
    assert not got_out.get("errors"), got_out
    got = got_out["messages"]
    assert sorted(m["message_id"] for m in got) == sorted(out["message_ids"])
    chain.check(got, orders, GO_KEY_ID, GO_PUBLISHER)
    chain.check_decoded(got, "application/protobuf")
    for m in got:
        assert m["decoded_by"]["masked"] == {**m["payload"], "customer_email": "***"}, m
        assert m["headers"]["prism-content-type"] == "application/protobuf", m["headers"]
