"""Across languages, through the worker, on Apache Kafka (issue 30): a client of one language
signs, the Python worker verifies and re-signs, a client of another language verifies the
worker's signature and decodes the payload.

* Go -> worker -> Rust: the Go client (clients/go/internal/interop, op `publish`) signs orders
  with an HMAC key; the worker (a real `WorkerProcess` running the shipped orders-created
  topology) verifies that key, establishes the producer's identity by it, stamps the schema
  context and re-signs with its Ed25519 key (batch scope); the Rust subscriber
  (clients/rust/examples/kafka_interop.rs) verifies with the worker's public key alone.
* Rust -> worker -> Go: the same the other way round.

What each test proves: every produced order arrives at the consumer exactly once, under the
worker's signature (its key id, scope batch), with `prism.identity.method: key` naming the
producer's key (a worker that had not verified the producer would say `none`), the schema
context of the topology's enrich stage, and the JSON payload the producer wrote. Nothing goes
to the DLQ and `.v3` holds no copy beyond the one each order should have.

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
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - dev_keys: a fixture

TARGET = "app.worker.pipeline:app_from_env"
ORDERS = 5
GO_KEY_ID = "go-chain-1"
GO_PUBLISHER = "svc-go-orders"
RUST_PUBLISHER = "svc-rust-orders"
SCHEMA = {"name": "prism.examples.orders.OrderCreated", "version": "v2"}


def _rust_key() -> tuple[str, bytes]:
    """The HMAC key kafka_interop signs with (the conformance suite's test key)."""
    k = _conformance("signatures/scope-v2-hmac-sha256.json")["key"]
    return k["key_id"], bytes.fromhex(k["secret_hex"])


class Chain:
    """The shipped topology with both producer keys trusted, its topics, and a worker running it."""

    def __init__(self, kafka: ApacheKafka, tmp_path: Path, keys: DevKeys) -> None:
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
        for stage in doc["stages"]:
            if "verify_signature" in stage:
                stage["verify_signature"]["keyring"] = str(ring_path)
        doc["producers"] += [{"name": "go-orders", "key_ids": [GO_KEY_ID], "namespaces": ["order-events"]},
                             {"name": "rust-orders", "key_ids": [rust_id], "namespaces": ["order-events"]}]
        path.write_text(yaml.safe_dump(doc))
        self.topology: Topology = load_topology(path)
        self.source = self.topology.sources[0].topic
        self.worker = WorkerProcess(TARGET, log_path=tmp_path / "worker.log", env={
            "PRISM_TOPOLOGY": str(path), "PRISM_BOOTSTRAP": kafka.bootstrap, "PRISM_DATA_DIR": str(tmp_path / "data"),
            "PRISM_APP_ID": f"chain-{uuid.uuid4().hex[:8]}", "PRISM_BROKER_URL": kafka.bootstrap})

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


async def test_go_produces_worker_resigns_rust_consumes(kafka: ApacheKafka, tmp_path: Path, dev_keys: DevKeys,  # noqa: F811
                                                        go_interop: Path, interop: Path) -> None:  # noqa: F811
    orders = [{"order_id": f"go-{i}", "customer_id": "c-7", "total": 10.5 + i, "currency": "EUR"}
              for i in range(ORDERS)]
    async with Chain(kafka, tmp_path, dev_keys) as chain:
        out = call(go_interop, {"op": "publish", "brokers": [kafka.bootstrap], "topic": chain.source,
                                "namespace": "order-events", "layout": "reviewed", "payloads": orders,
                                "hmac_key_id": GO_KEY_ID, "hmac_hex": HMAC_SECRET.hex(),
                                "classification": "internal"})
        assert "error" not in out, out
        audit = kafka.create_topic(f"chain-audit-{uuid.uuid4().hex[:8]}")
        # the Rust subscriber trusts the worker's public key (and its own HMAC test key, not the Go one)
        lines = _run(interop, "subscribe", kafka.bootstrap, chain.source + ".v3", str(ORDERS), "internal",
                     "svc-rust-billing", audit, chain.worker_key_id, chain.worker_public_hex)
        await chain.check_outputs()
    got = [ln for ln in lines if "payload" in ln]
    assert [ln for ln in lines if "error" in ln or "fatal" in ln] == []
    assert lines[-1]["stats"] == {"delivered": ORDERS, "withheld": 0, "audited": 0, "failed": 0}
    assert sorted(m["message_id"] for m in got) == sorted(out["message_ids"])  # the producer's ids, kept
    chain.check(got, orders, GO_KEY_ID, GO_PUBLISHER)


async def test_rust_produces_worker_resigns_go_consumes(kafka: ApacheKafka, tmp_path: Path, dev_keys: DevKeys,  # noqa: F811
                                                        go_interop: Path, interop: Path) -> None:  # noqa: F811
    async with Chain(kafka, tmp_path, dev_keys) as chain:
        sent = _run(interop, "publish-orders", kafka.bootstrap, chain.source, str(ORDERS), "order-events")
        assert [s["i"] for s in sent] == list(range(ORDERS))
        # the Go subscriber trusts the worker's public key only
        out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": chain.source + ".v3",
                                "namespace": "order-events", "group": f"g-{uuid.uuid4().hex[:8]}", "count": ORDERS,
                                "timeout_s": 90, "ed25519_key_id": chain.worker_key_id,
                                "ed25519_public_hex": chain.worker_public_hex, "clearance": "internal"})
        await chain.check_outputs()
    assert not out.get("errors"), out
    got = out["messages"]
    assert sorted(m["message_id"] for m in got) == sorted(s["message_id"] for s in sent)
    chain.check(got, [s["payload"] for s in sent], chain.rust_key_id, RUST_PUBLISHER)
    assert all(m["headers"]["prism-envelope-layout"] == "reviewed" for m in got)
    assert not any("prism-schema-validation" in m["headers"] for m in got)  # as the Go consumer sees it
    assert out["committed"] == {"0": ORDERS}
