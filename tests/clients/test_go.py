"""The Go client (clients/go) against Prism's Python implementation, byte for byte.

The Go side is a small program (clients/go/internal/interop) that reads one JSON request and
answers with one JSON response. These tests check what the conformance vectors cannot:
that what Go *produces* - random nonces, KEM encapsulations, signatures over its own
encoding, Kafka records with their headers - is what Python accepts, and the other way
round, over a real Apache Kafka broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.envelope import Layout, decode, encode, new_envelope
from app.errors import DecryptionError, SignatureError
from app.sdk import PrismClient
from app.security.encryption import decrypt_envelope, encrypt_envelope
from app.security.keys import FileKeyring, new_key_record
from app.security.signing import SCOPE_BATCH, SCOPE_PAIR, SCOPE_V2, SigningKey, VerificationKeys, verify
from tests.kafka.cluster import ApacheKafka
from tests.sdk.test_version_reports import registry_server  # noqa: F401 - a fixture
from tests.support import USERS, require

ROOT = Path(__file__).resolve().parents[2]
GO_MODULE = ROOT / "clients" / "go"
HMAC_SECRET = bytes(range(32))
ALGORITHMS = ("aes-256-gcm", "chacha20-poly1305", "ml-kem-1024", "x25519-ml-kem-1024", "rsa-oaep-3072")
KEY_FOR = {"aes-256-gcm": "sym-1", "chacha20-poly1305": "sym-1", "ml-kem-1024": "kem-1",
           "x25519-ml-kem-1024": "hyb-1", "rsa-oaep-3072": "rsa-1"}


def _go() -> str | None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "ensure-go.sh")], capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


@pytest.fixture(scope="session")
def go_interop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interop program, built once per session (Go's build cache makes a rebuild cheap)."""
    go = _go()
    require(go is not None, "Go 1.21+ is not installed (scripts/ensure-go.sh; docs/sdk-go.md)")
    assert go is not None
    out = tmp_path_factory.mktemp("go") / "interop"
    env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run([go, "build", "-buildvcs=false", "-o", str(out), "./internal/interop"], cwd=GO_MODULE, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"go build failed:\n{proc.stderr}"
    return out


def call(binary: Path, request: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    proc = subprocess.run([str(binary)], input=json.dumps(request), capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, f"interop exited {proc.returncode}:\n{proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def keyring(tmp_path_factory: pytest.TempPathFactory) -> tuple[FileKeyring, Path]:
    """One key of every type the Go client handles, saved as the JSON file both sides load."""
    kr = FileKeyring([new_key_record("sym-1", "symmetric-256"), new_key_record("kem-1", "ml-kem-1024"),
                      new_key_record("hyb-1", "x25519-ml-kem-1024"), new_key_record("rsa-1", "rsa-3072")])
    path = tmp_path_factory.mktemp("keys") / "keyring.json"
    path.write_text(json.dumps(kr.to_mapping()))
    return kr, path


def _plain(i: int) -> bytes:
    return json.dumps({"order_id": i, "email": "jane@example.com", "pad": "x" * (i * 97)}).encode()


# --------------------------------------------------------------------------- encryption


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_go_decrypts_what_python_encrypts(go_interop: Path, keyring: tuple[FileKeyring, Path], algorithm: str) -> None:
    kr, path = keyring
    wires, plains = [], []
    for i, layout in enumerate((Layout.DRAFT, Layout.REVIEWED, Layout.REVIEWED)):
        env = new_envelope("orders.created", _plain(i * 5), namespace="order-events")
        encrypt_envelope(env, kr, key_id=KEY_FOR[algorithm], algorithm=algorithm)
        wires.append(encode(env, layout))
        plains.append(_plain(i * 5))
    tampered = bytearray(wires[-1])
    tampered[-1] ^= 1  # the last byte of the ciphertext (the GCM tag)
    out = call(go_interop, {"op": "decrypt", "keyring": str(path), "envelopes": [w.hex() for w in [*wires, tampered]]})
    results = out["results"]
    assert [r.get("plaintext_hex") for r in results[:-1]] == [p.hex() for p in plains]
    assert results[-1]["error"] == "decryption_failed"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("layout", ["draft", "reviewed"])
def test_python_decrypts_what_go_encrypts(go_interop: Path, keyring: tuple[FileKeyring, Path], algorithm: str,
                                          layout: str) -> None:
    kr, path = keyring
    plain = _plain(7)
    out = call(go_interop, {"op": "encrypt", "keyring": str(path), "algorithm": algorithm, "key_id": KEY_FOR[algorithm],
                            "topic": "orders.created", "namespace": "order-events", "layout": layout,
                            "plaintext_hex": plain.hex()})
    env = decode(bytes.fromhex(out["envelope_hex"]))
    assert env.security is not None and env.security.encryption.algorithm == algorithm
    assert decrypt_envelope(env, kr) == plain
    env.header.metadata.topic = "orders.other"  # the AAD binds the ciphertext to its envelope
    with pytest.raises(DecryptionError):
        decrypt_envelope(env, kr)


@pytest.fixture(scope="module")
def moto_kms() -> Iterator[tuple[Any, str, str]]:
    """moto's KMS as a real HTTP server on loopback: boto3 (Python) and the AWS SDK for Go
    both talk to it, so each side unwraps the other's data keys through a KMS API."""
    import socket

    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("kms", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", config=Config(retries={"max_attempts": 1}))
        arn = client.create_key(Description="prism go interop")["KeyMetadata"]["Arn"]
        yield client, arn, endpoint
    finally:
        server.stop()


@pytest.mark.parametrize("algorithm", ["aes-256-gcm", "chacha20-poly1305"])
def test_kms_key_wrap_between_go_and_python(go_interop: Path, keyring: tuple[FileKeyring, Path],
                                            moto_kms: tuple[Any, str, str], algorithm: str) -> None:
    """The key_wrap pattern (a KMS data key per message, wrapped copy in encapsulated_key,
    algorithm_params {"key_wrap":"aws-kms"}) across languages through one KMS: Go decrypts what
    Python's AwsKmsProvider encrypted, Python decrypts what Go's awskms provider encrypted, and
    each refuses the other's envelope under another encryption context or moved to another
    message."""
    from app.security.keys import AwsKmsProvider

    client, arn, endpoint = moto_kms
    _, path = keyring
    extra = {"environment": "test"}
    py = AwsKmsProvider(default_key_id=arn, encryption_context=extra, client=client)
    plain = _plain(11)
    wires = []
    for layout in (Layout.DRAFT, Layout.REVIEWED):
        env = new_envelope("orders.created", plain, namespace="order-events")
        encrypt_envelope(env, py, key_id=arn, algorithm=algorithm)
        assert json.loads(env.security.encryption.algorithm_params) == {"key_wrap": "aws-kms"}
        wires.append(encode(env, layout))
    moved = decode(wires[1])
    moved.header.metadata.message_id = "0190a000-0000-7000-8000-0000000000ff"
    request = {"op": "decrypt", "keyring": str(path), "kms_endpoint": endpoint, "kms_context": extra}
    out = call(go_interop, {**request, "envelopes": [w.hex() for w in [*wires, encode(moved, Layout.REVIEWED)]]})
    assert [r.get("plaintext_hex") for r in out["results"][:2]] == [plain.hex(), plain.hex()], out
    assert out["results"][2]["error"] == "decryption_failed"
    other = call(go_interop, {**request, "kms_context": {"environment": "production"}, "envelopes": [wires[1].hex()]})
    assert other["results"][0]["error"] == "decryption_failed"  # KMS refused the context
    none = call(go_interop, {"op": "decrypt", "keyring": str(path), "envelopes": [wires[1].hex()]})
    assert none["results"][0]["error"] == "key_not_usable"  # no KMS provider: says so, never a silent pass

    for layout in ("draft", "reviewed"):
        made = call(go_interop, {"op": "encrypt", "keyring": str(path), "algorithm": algorithm, "key_id": arn,
                                 "kms_endpoint": endpoint, "kms_context": extra, "topic": "orders.created",
                                 "namespace": "order-events", "layout": layout, "plaintext_hex": plain.hex()})
        env = decode(bytes.fromhex(made["envelope_hex"]))
        meta = env.security.encryption
        assert (meta.algorithm, meta.key_id, json.loads(meta.algorithm_params)) == (algorithm, arn, {"key_wrap": "aws-kms"})
        assert len(meta.encapsulated_key) > 32
        assert decrypt_envelope(env, py) == plain
        prod = AwsKmsProvider(default_key_id=arn, encryption_context={"environment": "production"}, client=client)
        with pytest.raises(DecryptionError):
            decrypt_envelope(decode(bytes.fromhex(made["envelope_hex"])), prod)


# --------------------------------------------------------------------------- signatures


def test_python_verifies_what_go_signs_in_every_scope(go_interop: Path) -> None:
    key = SigningKey.hmac_sha256("go-hmac-1", HMAC_SECRET)
    keys = VerificationKeys.of([key])
    envs = [new_envelope("orders.created", {"order_id": i}, namespace="order-events", data_classification="restricted",
                         contains_pii=True, labels={"tier": "gold"}) for i in range(5)]
    for env in envs:
        env.ensure_security().auth_token = "header.payload.signature"  # not covered: scope v2 cuts it
    out = call(go_interop, {"op": "sign", "hmac_key_id": "go-hmac-1", "hmac_hex": HMAC_SECRET.hex(),
                            "layout": "draft", "envelopes": [encode(e, Layout.REVIEWED).hex() for e in envs]})
    signed: list[tuple[str, int]] = [(h, SCOPE_V2) for h in out["v2"]]
    signed += [(h, SCOPE_PAIR) for pair in out["pair"] for h in pair]
    signed += [(h, SCOPE_BATCH) for pair in out["batch"] for h in pair]
    assert len(signed) == 5 + 10 + 10
    for hexed, scope in signed:
        data = bytes.fromhex(hexed)
        assert verify(data, keys).scope == scope
        tampered = data.replace(b"restricted", b"restrictes")
        with pytest.raises(SignatureError):
            verify(tampered, keys)


# --------------------------------------------------------------------------- Kafka


@pytest.fixture
def topics(kafka: ApacheKafka) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:10]
    yield {"topic": f"go-interop-{suffix}", "audit": f"go-audit-{suffix}", "group": f"g-{suffix}"}


def _consume_audit(kafka: ApacheKafka, topic: str, expected: int, keys: VerificationKeys) -> list[dict[str, Any]]:
    """The audit records on `topic`, each verified with `keys` (waits until `expected` arrived)."""

    async def run() -> list[dict[str, Any]]:
        async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="order-events") as client:
            sub = client.subscribe(topic, group=f"audit-{uuid.uuid4().hex[:8]}", verify_with=keys)
            out: list[dict[str, Any]] = []
            async with sub:
                while len(out) < expected:
                    msg = await sub.receive(timeout=60)
                    assert msg is not None, f"only {len(out)} of {expected} audit records arrived"
                    out.append(msg.payload())
                    await msg.ack()
            return out

    return asyncio.run(run())


def test_go_subscribes_to_what_python_publishes(go_interop: Path, kafka: ApacheKafka, topics: dict[str, str]) -> None:
    key = SigningKey.hmac_sha256("py-hmac-1", HMAC_SECRET)
    payloads = [{"order_id": i} for i in range(4)]

    async def publish() -> list[str]:
        async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="order-events", signing_key=key,
                               publisher_id="svc-orders", auth_token="jwt.for.worker") as client:
            from app.sdk import PrismPublishOptions

            # first, above the Go subscriber's clearance: withheld, never handed out
            await client.publish(topics["topic"], {"order_id": 99}, PrismPublishOptions(data_classification="restricted"))
            return [await client.publish(topics["topic"], p, PrismPublishOptions(data_classification="confidential",
                                                                                 correlation_id=f"c-{p['order_id']}"))
                    for p in payloads]

    ids = asyncio.run(publish())
    out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": topics["topic"],
                            "namespace": "order-events", "group": topics["group"], "count": len(payloads),
                            "timeout_s": 90, "hmac_key_id": "py-hmac-1", "hmac_hex": HMAC_SECRET.hex(),
                            "clearance": "confidential", "principal": "svc-go-billing",
                            "audit_topic": topics["audit"]})
    assert out.get("errors") == [] or out.get("errors") is None, out
    got = out["messages"]
    assert [m["message_id"] for m in got] == ids
    assert [m["payload"] for m in got] == payloads
    assert all(m["scope"] == "v2" and m["key_id"] == "py-hmac-1" for m in got)
    assert all(m["publisher_id"] == "svc-orders" and m["has_token"] for m in got)
    assert all(m["headers"]["prism-message-id"] == m["message_id"] for m in got)
    assert all(m["headers"]["prism-envelope-layout"] == "reviewed" for m in got)
    assert out["stats"]["audited"] == len(payloads)
    assert out["stats"]["withheld"] == 1 and out["committed"] == {"0": len(payloads) + 1}  # the withheld one too
    assert out["stats"]["refusal_records"] == 1
    # the four deliveries and the refused read, signed by Go
    records = _consume_audit(kafka, topics["audit"], len(payloads) + 1, VerificationKeys.of([key]))
    delivered = [r for r in records if r["event"] == "classified_delivery"]
    assert sorted(r["message_id"] for r in delivered) == sorted(ids)
    assert {r["principal"] for r in records} == {"svc-go-billing"}
    assert {r["classification"] for r in delivered} == {"confidential"}
    (refused,) = [r for r in records if r["event"] == "classified_refused"]
    assert refused["classification"] == "restricted" and refused["clearance"] == "confidential"
    assert refused["ref"] == f"{topics['topic']}/0@0" and "messages" not in refused


def test_go_acks_out_of_order_and_nacks(go_interop: Path, kafka: ApacheKafka, topics: dict[str, str]) -> None:
    """Acknowledgements as in the Python SDK's Kafka backend: acking out of order commits only
    the end of the fully acknowledged prefix (nothing while the first message is open), and a
    nack gives the message back (delivered again, then acknowledged)."""

    async def publish() -> list[str]:
        async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="order-events") as client:
            return [await client.publish(topics["topic"], {"order_id": i}) for i in range(5)]

    ids = asyncio.run(publish())
    out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": topics["topic"],
                            "namespace": "order-events", "group": topics["group"], "count": 5, "timeout_s": 90,
                            "nack_first": True, "ack_reverse": True})
    assert out["errors"] is None or out["errors"] == [], out["errors"]
    assert [m["message_id"] for m in out["messages"]] == ids  # the nacked first message came again
    assert out["committed"] == {"0": 5}


def test_go_skips_expired_messages(go_interop: Path, kafka: ApacheKafka, topics: dict[str, str]) -> None:
    """A message past its TTL is acknowledged and skipped, as the Python SDK's subscriber does."""
    import time

    async def publish() -> str:
        async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="order-events") as client:
            old = new_envelope(topics["topic"], {"order_id": 1}, namespace="order-events",
                               published_at_ms=int(time.time() * 1000) - 60_000, ttl_seconds=1)
            await client.publish_envelope(old)
            return await client.publish(topics["topic"], {"order_id": 2})

    fresh = asyncio.run(publish())
    out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": topics["topic"],
                            "namespace": "order-events", "group": topics["group"], "count": 1, "timeout_s": 90})
    assert [m["message_id"] for m in out["messages"]] == [fresh]
    assert out["stats"]["expired"] == 1 and out["committed"] == {"0": 2}


@pytest.mark.parametrize("layout", ["draft", "reviewed"])
def test_python_subscribes_to_what_go_publishes(go_interop: Path, kafka: ApacheKafka, topics: dict[str, str],
                                                keyring: tuple[FileKeyring, Path], layout: str) -> None:
    kr, path = keyring
    payloads = [{"order_id": i, "note": "ü" * i} for i in range(3)]
    out = call(go_interop, {"op": "publish", "brokers": [kafka.bootstrap], "topic": topics["topic"],
                            "namespace": "order-events", "layout": layout, "payloads": payloads,
                            "hmac_key_id": "go-hmac-1", "hmac_hex": HMAC_SECRET.hex(), "token": "jwt.from.go",
                            "publisher_id": "svc-go", "classification": "internal",
                            "keyring": str(path), "key_id": "sym-1"})
    assert "error" not in out, out
    keys = VerificationKeys.of([SigningKey.hmac_sha256("go-hmac-1", HMAC_SECRET)])

    async def consume() -> list[tuple[str, Any, str, str]]:
        async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="order-events") as client:
            got = []
            async with client.subscribe(topics["topic"], group=topics["group"], verify_with=keys,
                                        decrypt_with=kr) as sub:
                while len(got) < len(payloads):
                    msg = await sub.receive(timeout=60)
                    assert msg is not None, f"only {len(got)} of {len(payloads)} messages arrived"
                    got.append((msg.message_id, msg.payload(), msg.security.auth_token, msg.security.publisher_id))
                    await msg.ack()
            return got

    got = asyncio.run(consume())
    assert [g[0] for g in got] == out["message_ids"]
    assert [g[1] for g in got] == payloads
    assert {(g[2], g[3]) for g in got} == {("jwt.from.go", "svc-go")}


def test_go_toolchain_is_found() -> None:
    """`make test-go` and these tests find the same Go (scripts/ensure-go.sh)."""
    go = _go()
    require(go is not None, "Go 1.21+ is not installed")
    assert go is not None and shutil.which(go) is not None


# --------------------------------------------------------------------------- schema registry


def test_go_resolves_masks_and_validates_against_the_registry(go_interop: Path, registry_server: Any) -> None:  # noqa: F811
    """The Go registry client against Prism's registry: an envelope's schema reference (subject
    version, schema id, forged), PII masking the same as Python's, validation before publish."""
    from app.sdk.schemas import MASK
    from tests.sdk.test_consumer_schemas import AVRO, JSON_SCHEMA, TOPIC, _envelope, _register

    url, registry = registry_server
    resolved = _register(url, registry, JSON_SCHEMA, "JSON")
    doc = {"user_id": "u-1", "contact": {"email": "a@example.com", "city": "Lyon"},
           "cards": [{"pan": "4111111111111111", "brand": "visa"}],
           "address": {"street": "1 rue X"}, "prefs": {"home": {"phone": "+33 1", "lang": "fr"}}, "nickname": "ace"}
    by_version = _envelope(doc, resolved)
    by_id = _envelope(doc, resolved)
    by_id.header.schema.schema_url = f"{url}/schemas/ids/{registry.get(TOPIC, 'latest').id}"
    forged_subject = _envelope(doc, resolved)
    forged_subject.header.schema.schema_url = f"{url}/v1/subjects/other.topic/versions/1"
    forged_hash = _envelope(doc, resolved)
    forged_hash.header.schema.schema_hash = "sha256:" + "0" * 64
    avro_resolved = _register(url, registry, AVRO, "AVRO", subject="users.avro")
    avro_doc = {"user_id": "u", "contact": {"email": "e@x", "city": "c"}, "backup": None, "phones": {"home": "1"},
                "visits": 3}
    avro_env = _envelope(avro_doc, avro_resolved, topic="users.avro")
    envs = [by_version, by_id, forged_subject, forged_hash, avro_env]
    out = call(go_interop, {"op": "registry", "registry_url": url, "user": "reader", "password": USERS["reader"][0],
                            "envelopes": [encode(e, Layout.REVIEWED).hex() for e in envs],
                            "topic": TOPIC, "namespace": "users", "payload": {**doc, "contact": {"email": 5}}})
    results = out["results"]
    expected = {"user_id": "u-1", "contact": {"email": MASK, "city": "Lyon"}, "cards": [{"pan": MASK, "brand": "visa"}],
                "address": MASK, "prefs": {"home": {"phone": MASK, "lang": "fr"}}, "nickname": "ace"}
    for r in results[:2]:
        assert (r["subject"], r["version"], r["format"], r["valid"]) == (TOPIC, 1, "json", "ok"), r
        assert r["masked"] == expected
        assert r["pii_paths"] == ["address", "cards.pan", "contact.email", "prefs.*.phone"]  # as Python's pii_paths()
    assert results[2]["error"] == "schema_reference_invalid" and "other.topic" in results[2]["message"]
    assert results[3]["error"] == "schema_reference_invalid" and "hash" in results[3]["message"]
    assert results[4]["masked"] == {**avro_doc, "contact": {"email": MASK, "city": "c"}, "phones": MASK}
    assert results[4]["valid"] == "ok"  # an Avro JSON datum
    assert out["validate"] == "schema_validation_failed" and out["violations"] == ["$.contact.email"]
    assert out["schema_context"]["url"] == ""  # nothing stamped: the payload was refused
    ok = call(go_interop, {"op": "registry", "registry_url": url, "user": "reader", "password": USERS["reader"][0],
                           "envelopes": [], "topic": TOPIC, "namespace": "users", "payload": doc})
    assert ok["validate"] == "ok"
    latest = registry.get(TOPIC, "latest")
    assert ok["schema_context"] == {"url": f"{url}/v1/subjects/{TOPIC}/versions/1", "version": "1", "format": "json",
                                    "hash": latest.hash}


MONEY_PROTO = '''syntax = "proto3";
package common.v1;
import "prism/annotations.proto";
message Money { string currency = 1; int64 units = 2; string owner = 3 [(prism.pii) = "name"]; }
'''
ADDRESS_PROTO = '''syntax = "proto3";
package common.v1;
import "prism/annotations.proto";
import "common/money.proto";
message Address { string street = 1 [(prism.pii) = "address"]; string city = 2; Money deposit = 3; }
'''
ORDER_PROTO = '''syntax = "proto3";
package shop.v1;
import "common/address.proto";
import "common/money.proto";
message Order { string id = 1; common.v1.Money total = 2; common.v1.Address ship_to = 3; repeated string notes = 4; }
'''


def _context(env: Any, url: str, registry: Any, subject: str, fmt: str) -> Any:
    """Stamp an envelope with the schema context a producer's validator would write."""
    latest = registry.get(subject, "latest")
    sc = env.ensure_schema()
    sc.schema_url, sc.schema_version = f"{url}/v1/subjects/{subject}/versions/{latest.version}", str(latest.version)
    sc.schema_format, sc.schema_hash = fmt, latest.hash
    return env


def test_go_decodes_binary_avro_and_protobuf_with_references_as_python_writes_them(
        go_interop: Path, registry_server: Any) -> None:  # noqa: F811
    """Payloads decoded by the schema their envelope references, through Prism's registry:
    binary Avro written by fastavro (Python's encoder), and a protobuf schema that imports two
    other subjects (Confluent references, one of them transitive) written by Python's protobuf
    runtime. Go decodes each to the value Python wrote, masks the PII fields the imported
    files tag, and refuses a damaged payload with a typed error."""
    import io

    import fastavro
    from google.protobuf import descriptor_pool, message_factory
    from google.protobuf.json_format import MessageToDict

    from app.schema.protoparse import compile_proto
    from app.sdk.schemas import MASK
    from tests.sdk.test_consumer_schemas import AVRO

    url, registry = registry_server
    # -- binary Avro (fastavro's schemaless encoding, what Python producers write)
    registry.register("users.avro.bin", AVRO, "AVRO", actor="test")
    datums = [{"user_id": "u-1", "contact": {"email": "a@example.com", "city": "Lyon"},
               "backup": {"email": "b@example.com", "city": "Nice"}, "phones": {"home": "+33 1"}, "visits": 7},
              {"user_id": "u-2", "contact": {"email": "c@example.com", "city": "Rome"}, "backup": None,
               "phones": {}, "visits": -3}]
    parsed = fastavro.parse_schema(json.loads(AVRO))
    envs = []
    for d in datums:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, d)
        envs.append(_context(new_envelope("users.avro.bin", buf.getvalue(), namespace="users",
                                          content_type="application/avro"), url, registry, "users.avro.bin", "avro"))
    damaged = _context(new_envelope("users.avro.bin", b"\x02u\x80", namespace="users",
                                    content_type="application/avro"), url, registry, "users.avro.bin", "avro")
    # -- protobuf with references: shop.orders imports common.address, which imports common.money
    registry.register("common.money", MONEY_PROTO, "PROTOBUF", actor="test")
    registry.register("common.address", ADDRESS_PROTO, "PROTOBUF", actor="test",
                      references=[{"name": "common/money.proto", "subject": "common.money", "version": 1}])
    registry.register("shop.orders", ORDER_PROTO, "PROTOBUF", actor="test",
                      references=[{"name": "common/address.proto", "subject": "common.address", "version": 1},
                                  {"name": "common/money.proto", "subject": "common.money", "version": 1}])
    compiled = compile_proto(ORDER_PROTO, imports={"common/money.proto": MONEY_PROTO,
                                                   "common/address.proto": ADDRESS_PROTO})
    pool = descriptor_pool.DescriptorPool()
    for fd in compiled.fds.file:
        pool.Add(fd)
    order_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.v1.Order"))
    order = order_cls(id="o-9", notes=["fragile", "gift"])
    order.total.currency, order.total.units, order.total.owner = "EUR", 1250, "Jane Doe"
    order.ship_to.street, order.ship_to.city = "1 rue X", "Lyon"
    order.ship_to.deposit.units, order.ship_to.deposit.owner = 5, "Jane Doe"
    proto_env = _context(new_envelope("shop.orders", order.SerializeToString(), namespace="shop",
                                      content_type="application/protobuf"), url, registry, "shop.orders", "protobuf")
    proto_bad = _context(new_envelope("shop.orders", b"\x1a\xff", namespace="shop",
                                      content_type="application/protobuf"), url, registry, "shop.orders", "protobuf")
    # Python's own resolver (worker, SDK) resolves the references and stamps the registry's hash,
    # and Python's consumer decodes the payload Go decodes below
    import asyncio

    from app.schema.resolve import resolve_schema_config
    from app.sdk.schemas import SchemaResolver

    py = resolve_schema_config({"registry_type": "prism", "url": url, "subject": "shop.orders"})
    assert py.hash == proto_env.header.schema.schema_hash and py.name == "shop.v1.Order"
    decoded = asyncio.run(SchemaResolver(url).for_envelope(proto_env)).decode(order.SerializeToString())
    assert MessageToDict(decoded) == MessageToDict(order)
    # -- Avro with a reference (a named type of another subject), stamped as Python stamped it
    # before it resolved references: the hash of the schema's own text (the registry's hash, what
    # Python stamps now, also covers the references)
    address = {"type": "record", "name": "Address", "namespace": "common",
               "fields": [{"name": "street", "type": "string", "prism.pii": "address"}, {"name": "city", "type": "string"}]}
    order_avro = {"type": "record", "name": "Order", "namespace": "shop",
                  "fields": [{"name": "id", "type": "string"}, {"name": "ship_to", "type": "common.Address"}]}
    registry.register("avro.address", json.dumps(address), "AVRO", actor="test")
    registry.register("shop.avro.orders", json.dumps(order_avro), "AVRO", actor="test",
                      references=[{"name": "common.Address", "subject": "avro.address", "version": 1}])
    named: dict[str, Any] = {}
    fastavro.parse_schema(address, named_schemas=named)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(order_avro, named_schemas=named),
                               {"id": "o-1", "ship_to": {"street": "1 rue X", "city": "Lyon"}})
    ref_env = _context(new_envelope("shop.avro.orders", buf.getvalue(), namespace="shop",
                                    content_type="application/avro"), url, registry, "shop.avro.orders", "avro")
    from app.schema.canonical import schema_hash

    text_hash = schema_hash("AVRO", json.dumps(order_avro))
    assert text_hash != ref_env.header.schema.schema_hash  # the registry's hash covers the reference
    py_avro = resolve_schema_config({"registry_type": "prism", "url": url, "subject": "shop.avro.orders"})
    assert py_avro.hash == ref_env.header.schema.schema_hash and py_avro.alternate_hashes == (text_hash,)
    ref_env.header.schema.schema_hash = text_hash
    out = call(go_interop, {"op": "registry", "registry_url": url, "user": "reader", "password": USERS["reader"][0],
                            "envelopes": [encode(e, Layout.REVIEWED).hex()
                                          for e in [*envs, damaged, proto_env, proto_bad, ref_env]]})
    results = out["results"]
    for d, r in zip(datums, results, strict=False):
        assert (r["format"], r["valid"], r["content_type"]) == ("avro", "ok", "application/avro"), r
        assert r["decoded"] == d
        assert r["masked"]["contact"]["email"] == MASK and r["masked"]["phones"] == MASK
        assert r["masked"]["user_id"] == d["user_id"] and r["masked"]["visits"] == d["visits"]
    assert results[1]["masked"]["backup"] is None
    assert results[2]["valid"] == "schema_validation_failed" and results[2]["decode_error"] == "payload_error"
    got = results[3]
    assert (got["subject"], got["format"], got["valid"]) == ("shop.orders", "protobuf", "ok"), got
    assert got["decoded"] == MessageToDict(order, preserving_proto_field_name=True)
    assert {"total.owner", "ship_to.street", "ship_to.deposit.owner"} <= set(got["pii_paths"])
    masked = got["masked"]
    assert masked["total"]["owner"] == MASK and masked["ship_to"]["street"] == MASK
    assert masked["ship_to"]["deposit"]["owner"] == MASK and masked["ship_to"]["city"] == "Lyon"
    assert masked["notes"] == ["fragile", "gift"] and masked["total"]["currency"] == "EUR"
    assert results[4]["valid"] == "schema_validation_failed" and results[4]["decode_error"] == "payload_error"
    assert results[5]["decoded"] == {"id": "o-1", "ship_to": {"street": "1 rue X", "city": "Lyon"}}, results[5]
    assert results[5]["masked"]["ship_to"] == {"street": MASK, "city": "Lyon"}


# --------------------------------------------------------------------------- differential


def _mutations(seed: int, count: int) -> list[bytes]:
    """Every input of the conformance suite, and `count` random damages of them (a flipped
    byte, a cut, a byte inserted, a record duplicated): deterministic for one `seed`."""
    import random

    base = []
    for path in sorted((ROOT / "conformance").glob("*/*.json")):
        for v in json.loads(path.read_text(encoding="utf-8")).get("vectors", []):
            if v.get("kind", "") != "lnmp" and path.parent.name != "lnmp":
                base += [bytes.fromhex(v[k]) for k in ("envelope_hex", "input_hex") if k in v]
    rng = random.Random(seed)
    out = list(base)
    for _ in range(count):
        data = bytearray(rng.choice(base))
        if not data:
            continue
        op, i = rng.randrange(4), rng.randrange(len(data))
        if op == 0:
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            del data[i:]
        elif op == 2:
            data.insert(i, rng.randrange(256))
        else:
            data += data[i:i + rng.randrange(1, 40)]
        out.append(bytes(data))
    return out


def test_go_and_python_answer_the_same_for_damaged_inputs(go_interop: Path) -> None:
    """Differential test: decode and verify verdicts (and the decoded model) of the Go client
    equal Python's (`conformance.check`) for every suite input and 600 random damages of them."""
    from conformance.check import answer

    inputs = _mutations(seed=30, count=600)
    out = call(go_interop, {"op": "check", "envelopes": [d.hex() for d in inputs]})
    mismatches = []
    for data, go in zip(inputs, out["results"], strict=True):
        py_dec, py_ver = answer(["decode", data.hex()]), answer(["verify", data.hex()])
        want = {"decode": py_dec["outcome"], "verify": py_ver["outcome"]}
        got = {"decode": go["decode"], "verify": go["verify"]}
        if py_dec["outcome"] == "ok":
            want["model"], got["model"] = py_dec["model"], go.get("model")
            want["payload_error"], got["payload_error"] = py_dec.get("payload_error"), go.get("payload_error")
        if want != got:
            mismatches.append((data.hex()[:120], want, got))
    assert not mismatches, f"{len(mismatches)} of {len(inputs)} inputs differ; first: {mismatches[:3]}"
    # the damages reach every verdict, not only the first check
    assert {r["decode"] for r in out["results"]} >= {"ok", "truncated", "malformed"}
    assert {r["verify"] for r in out["results"]} >= {"valid", "bad_signature", "ambiguous_envelope", "truncated",
                                                      "malformed", "unsupported_signature_scope"}


def _odd_map_entries() -> list[bytes]:
    """Envelopes whose map entries (extensions, trace labels and baggage) hold more than a key
    and a value: a third field, a key or value of another wire type, an odd entry before and
    after a plain one of the same key - in both layouts, signed and not."""
    from app.envelope.wire import encode_varint

    def rec(field: int, wire: int, value: bytes) -> bytes:
        tag = encode_varint(field << 3 | wire)
        return tag + (encode_varint(len(value)) + value if wire == 2 else value)

    def entry(*parts: bytes) -> bytes:
        return b"".join(parts)

    k, v = rec(1, 2, b"tier"), rec(2, 2, b"gold")
    odd_entries = [entry(k, rec(10, 2, b"x")), entry(k, v, rec(3, 0, b"\x01")), entry(rec(1, 0, b"\x05"), v),
                   entry(k, rec(2, 0, b"\x07")), entry(k, v, v), entry(k)]
    out = []
    for layout, ext_field in ((Layout.REVIEWED, 97), (Layout.DRAFT, 99)):
        env = new_envelope("orders.created", {"order_id": 1}, namespace="order-events")
        env.ensure_observability().trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        base = encode(env, layout)
        for odd in odd_entries:
            plain = entry(rec(1, 2, b"tier"), rec(2, 2, b"silver"))
            for labels in ([odd], [plain, odd], [odd, plain]):
                obs = b"".join(rec(6, 2, e) for e in labels) + rec(5, 2, odd)
                # observability is field 3 in both layouts; a second record merges into the first
                out.append(base + rec(3, 2, obs))
                out.append(base + b"".join(rec(ext_field, 2, e) for e in labels))
    return out


def test_go_reads_odd_map_entries_as_python_does(go_interop: Path) -> None:
    """upb (under Python) keeps a map entry that holds anything but a key and a value among the
    enclosing message's unknown fields instead of the map; Go's protobuf runtime would store it.
    The Go client reads such envelopes as Python does: the same model (no extension, label or
    baggage entry Python does not see), the same bytes when converted to either layout, and the
    same refusal (`ambiguous_map_entry`) where an odd `extensions` entry would cross layouts -
    reading a draft header is such a crossing."""
    from app.envelope import convert
    from conformance.check import answer

    inputs = _odd_map_entries()
    out = call(go_interop, {"op": "check", "layout": "convert", "envelopes": [d.hex() for d in inputs]})
    mismatches = []
    for data, go in zip(inputs, out["results"], strict=True):
        py = answer(["decode", data.hex()])
        want: dict[str, Any] = {"decode": py["outcome"], "model": py.get("model")}
        for name, lay in (("to_draft", Layout.DRAFT), ("to_reviewed", Layout.REVIEWED)):
            try:
                want[name] = convert(data, lay)[0].hex()
            except Exception as exc:  # a PrismError: compare the kind
                want[name] = getattr(exc, "code", repr(exc))
        got = {"decode": go["decode"], "model": go.get("model"), "to_draft": go["to_draft"],
               "to_reviewed": go["to_reviewed"]}
        if want != got:
            mismatches.append((data.hex(), want, got))
    assert not mismatches, f"{len(mismatches)} of {len(inputs)} differ; first: {mismatches[:2]}"
    assert {r["decode"] for r in out["results"]} == {"ok", "ambiguous_map_entry"}
    assert {r["to_draft"] for r in out["results"]} >= {"ambiguous_map_entry"}
    assert any(len(r["to_draft"]) > 40 for r in out["results"])  # odd labels/baggage still convert


def test_go_validates_avro_and_json_datums_as_python_does(go_interop: Path) -> None:
    """Publish-side validation, Go against Python's validator (fastavro, jsonschema): the same
    verdict, and the same first failing path, for valid and broken datums."""
    from app.schema.payload_check import validator_for
    from app.schema.resolve import build_resolved
    from tests.sdk.test_consumer_schemas import AVRO, JSON_SCHEMA

    contact = {"email": "e@x", "city": "c"}
    avro_datums = [
        {"user_id": "u", "contact": contact, "backup": None, "phones": {"home": "1"}, "visits": 3},
        {"user_id": "u", "contact": contact, "phones": {}, "visits": 3},                       # default for backup
        {"user_id": "u", "contact": contact, "backup": contact, "phones": {}, "visits": 3},    # union: the record
        {"user_id": "u", "contact": contact, "backup": None, "phones": {}, "visits": 3, "extra": 1},
        {"user_id": "u", "contact": {"email": 5, "city": "c"}, "phones": {}, "visits": 3},
        {"user_id": "u", "contact": contact, "phones": {"home": 1}, "visits": 3},
        {"user_id": "u", "contact": contact, "phones": {}, "visits": 3.5},
        {"user_id": "u", "contact": contact, "phones": {}, "visits": 2**31},
        {"user_id": "u", "contact": contact, "phones": {}},
        {"user_id": "u", "contact": contact, "backup": {"email": "x"}, "phones": {}, "visits": 1},
        [1, 2], "text", None,
    ]
    json_datums = [
        {"user_id": "u", "contact": contact}, {"contact": {"email": 5}}, {"cards": [{"pan": 1}]}, [], 3,
    ]
    for fmt, text, datums in (("avro", AVRO, avro_datums), ("json", JSON_SCHEMA, json_datums)):
        validate = validator_for(build_resolved(text, fmt.upper(), url="x", version="1"))
        payloads = [json.dumps(d) for d in datums] + ["{not json"]
        out = call(go_interop, {"op": "validate", "schema_text": text, "algorithm": fmt, "envelopes": payloads,
                                "content_type": "application/json"})
        for payload, go in zip(payloads, out["results"], strict=True):
            violations = validate(payload.encode(), "application/json")
            want = ("ok", None) if not violations else ("schema_validation_failed", violations[0].path)
            assert (go["outcome"], go.get("path")) == want, (fmt, payload, go, [str(v) for v in violations])


def test_go_compiles_validates_and_masks_protobuf_schemas(go_interop: Path) -> None:
    """Protobuf schemas in the Go client (compiled by protocompile against prism/annotations.proto):
    the same PII paths, the same masked message (binary and JSON mapping) and the same verdicts
    as the Python SDK."""
    from google.protobuf.json_format import MessageToJson

    from app.schema.payload_check import validator_for
    from app.schema.resolve import build_resolved
    from app.sdk.schemas import PayloadSchema
    from tests.sdk.test_consumer_schemas import PROTO, _proto_class

    schema = PayloadSchema.from_text(PROTO, "PROTOBUF")
    validate = validator_for(build_resolved(PROTO, "PROTOBUF", url="x", version="1"))
    cls = _proto_class()
    sent = cls(user_id="u-3", birth_year=1990, avatar=b"\x89PNG", visits=4)
    sent.contact.email, sent.contact.city = "d@example.com", "Rome"
    sent.previous.add(email="old@example.com", city="Pisa")
    sent.by_role["admin"].email = "root@example.com"
    binaries = [sent.SerializeToString(deterministic=True), b"\x0a\xff", b"\x28\x80"]
    out = call(go_interop, {"op": "validate", "schema_text": PROTO, "algorithm": "protobuf",
                            "content_type": "application/protobuf", "envelopes": [b.hex() for b in binaries]})
    results = out["results"]
    assert results[0]["pii_paths"] == schema.pii_paths()
    for payload, go in zip(binaries, results, strict=True):
        violations = validate(payload, "application/protobuf")
        assert go["outcome"] == ("ok" if not violations else "schema_validation_failed"), (payload, go)
    masked = cls.FromString(bytes.fromhex(results[0]["masked_hex"]))
    assert masked == schema.mask_pii(cls.FromString(binaries[0]))
    as_json = [MessageToJson(sent), '{"contact": {"email": 5}}', '{"nope": 1}']
    out = call(go_interop, {"op": "validate", "schema_text": PROTO, "algorithm": "protobuf",
                            "content_type": "application/json", "envelopes": as_json})
    for payload, go in zip(as_json, out["results"], strict=True):
        violations = validate(payload.encode(), "application/json")
        assert go["outcome"] == ("ok" if not violations else "schema_validation_failed"), (payload, go)
    assert out["results"][0]["masked"] == schema.mask_pii(json.loads(as_json[0]))


def test_the_quick_start_builds_in_a_new_module(go_interop: Path, tmp_path: Path) -> None:
    """docs/sdk-go.md's quick start, copied into a fresh Go module that requires the client by
    its module path (replaced by this checkout, as the page says), builds: the module is
    consumable the way Go projects consume modules."""
    import re

    go = _go()
    assert go is not None  # go_interop required it
    page = (ROOT / "docs" / "sdk-go.md").read_text(encoding="utf-8")
    program = next(b for b in re.findall(r"```go\n(.*?)```", page, re.S) if b.startswith("package main"))
    (tmp_path / "cmd").mkdir()
    (tmp_path / "cmd" / "main.go").write_text(program, encoding="utf-8")
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}"}
    module = "github.com/prism-envelope/prism/clients/go"
    for args in (["mod", "init", "example.com/shop"],
                 ["mod", "edit", f"-require={module}@v0.0.0", f"-replace={module}={GO_MODULE}"],
                 ["mod", "tidy"], ["vet", "./..."], ["build", "-o", str(tmp_path / "shop"), "./cmd"]):
        proc = subprocess.run([go, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                              check=False)
        assert proc.returncode == 0, f"go {' '.join(args)}:\n{proc.stderr}"
    assert (tmp_path / "shop").stat().st_size > 0


def _module_proxy(root: Path, module: str, version: str) -> Path:
    """A file-based Go module proxy (GOPROXY protocol: `<module>/@v/list`, `.info`, `.mod`,
    `.zip`) serving this checkout's clients/go as `module@version`, packed by the module zip
    rules: the tracked files of the module root, without nested modules (a directory with its
    own go.mod, like examples/offline) - what a proxy serves once the repository is tagged."""
    import subprocess as sp
    import zipfile

    tracked = sp.run(["git", "ls-files", "-z", "clients/go"], cwd=ROOT, capture_output=True, check=True).stdout
    files = [Path(f).relative_to("clients/go") for f in tracked.decode().split("\0") if f]
    nested = {f.parent for f in files if f.name == "go.mod" and f.parent != Path(".")}
    files = [f for f in files if not any(n == f.parent or n in f.parents for n in nested)]
    at = root / module / "@v"
    at.mkdir(parents=True)
    (at / "list").write_text(version + "\n")
    (at / f"{version}.info").write_text(json.dumps({"Version": version, "Time": "2026-11-29T00:00:00Z"}))
    (at / f"{version}.mod").write_bytes((GO_MODULE / "go.mod").read_bytes())
    with zipfile.ZipFile(at / f"{version}.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            z.write(GO_MODULE / f, f"{module}@{version}/{f.as_posix()}")
    return root


def test_go_get_fetches_the_module_by_its_path_from_a_module_proxy(go_interop: Path, tmp_path: Path) -> None:
    """`go get <module path>@<version>` - how Go projects install a dependency - works for the
    client as a proxy would serve it once the repository is tagged: a fresh module fetches it
    through GOPROXY (a file proxy of this checkout, then the local module cache for its own
    dependencies: no network), checks it, and builds docs/sdk-go.md's quick start against it."""
    import re

    go = _go()
    assert go is not None  # go_interop required it
    module, version = "github.com/prism-envelope/prism/clients/go", "v0.1.0"
    proxy = _module_proxy(tmp_path / "proxy", module, version)
    cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    app = tmp_path / "shop"
    (app / "cmd").mkdir(parents=True)
    page = (ROOT / "docs" / "sdk-go.md").read_text(encoding="utf-8")
    program = next(b for b in re.findall(r"```go\n(.*?)```", page, re.S) if b.startswith("package main"))
    (app / "cmd" / "main.go").write_text(program, encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}", "GOFLAGS": "-buildvcs=false",
           "GOPROXY": f"file://{proxy},file://{cache}/cache/download", "GOSUMDB": "off",
           "GOMODCACHE": str(tmp_path / "modcache"), "GOWORK": "off"}
    for args in (["mod", "init", "example.com/shop"], ["get", f"{module}@{version}"], ["mod", "tidy"],
                 ["mod", "verify"], ["build", "-o", str(app / "shop"), "./cmd"]):
        proc = subprocess.run([go, *args], cwd=app, env=env, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, f"go {' '.join(args)}:\n{proc.stderr}"
    assert f"{module} {version}" in (app / "go.mod").read_text()
    assert (app / "shop").stat().st_size > 0
    subprocess.run([go, "clean", "-modcache"], env=env, capture_output=True, check=False)  # read-only files


def test_go_maps_lnmp_as_python_does(go_interop: Path) -> None:
    """LNMP (strict mode), Go against Python's app/formats/lnmp_envelope.py: the same verdict,
    the same envelope and the same canonical re-encoding for every LNMP vector and 400 random
    damages of them."""
    from tests.clients import lnmp_differential as lnmp

    base = lnmp.vectors()
    inputs = base + lnmp.damaged(base, 400, seed=30)
    out = call(go_interop, {"op": "lnmp", "envelopes": [d.hex() for d in inputs]})
    mismatches = lnmp.mismatches(inputs, out["results"])
    assert not mismatches, f"{len(mismatches)} of {len(inputs)} differ; first: {mismatches[:2]}"
    assert {r["outcome"] for r in out["results"]} == {"ok", "bad_lnmp"}


def test_go_settles_no_refusal_before_its_audit_record_is_written(go_interop: Path, kafka: ApacheKafka,
                                                                   topics: dict[str, str]) -> None:
    """The broker refuses the refusal record (the audit topic's max.message.bytes is below its
    size): the Go subscription returns delivery_audit_failed, commits none of the refused
    messages and rewinds to them; once the operator raises the limit they are fetched, refused
    and audited again - every one named in a record, nothing settled unaudited."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from app.sdk import PrismPublishOptions
    from app.sdk.audit import read_audit, refused_reads

    async def prepare() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topics["audit"], 1, 1, topic_configs={"max.message.bytes": "200"})])
        finally:
            await admin.close()
        async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="order-events",
                               signing_key=SigningKey.hmac_sha256("go-reader-1", HMAC_SECRET)) as client:
            return [await client.publish(topics["topic"], {"card": "4111-SECRET", "i": i},
                                         PrismPublishOptions(data_classification="restricted")) for i in range(5)]

    refused_ids = asyncio.run(prepare())
    out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": topics["topic"],
                            "namespace": "order-events", "group": topics["group"], "count": 1, "timeout_s": 90,
                            "hmac_key_id": "go-reader-1", "hmac_hex": HMAC_SECRET.hex(), "clearance": "internal",
                            "principal": "svc-go-reader", "audit_topic": topics["audit"], "fix_audit_topic": True})
    assert [e["error"] for e in out["errors"]] == ["delivery_audit_failed"], out["errors"]
    assert "were not committed" in out["errors"][0]["message"]
    assert [m["payload"] for m in out["messages"] or []] == [{"after_fix": True}], out
    assert 5 < out["stats"]["withheld"] <= 10  # the rewound ones were refused a second time
    assert out["committed"] == {"0": 6} and out["stats"]["refusal_records"] >= 1
    records, _ = asyncio.run(read_audit(f"kafka://{kafka.bootstrap}", audit_topic=topics["audit"]))
    assert sorted(r["message_id"] for rec in records for r in refused_reads(rec)) == sorted(refused_ids)


def test_prism_audit_verifies_the_refused_reads_go_records(go_interop: Path, kafka: ApacheKafka,
                                                           topics: dict[str, str], tmp_path: Path) -> None:
    """A flood of messages labelled above a Go subscriber's clearance: each refused read is named
    in a signed `classified_refused` record in the Python SDK's format (app/sdk/audit.py), shared
    by the refusals of a fetch and at most 256 a record, and `prism audit --keyring` verifies every
    record against the key bound to the subscriber's principal. Then the one message it may read
    arrives, and every refused one is committed."""
    import base64

    import yaml
    from typer.testing import CliRunner

    from app.cli.main import build_app
    from app.sdk import PrismPublishOptions
    from app.sdk.audit import REFUSALS_PER_RECORD, read_audit

    flood = 300

    async def publish() -> tuple[list[str], str]:
        # signed with the key the Go subscriber verifies with (the interop program's one key)
        async with PrismClient(f"kafka://{kafka.bootstrap}", namespace="order-events",
                               signing_key=SigningKey.hmac_sha256("go-reader-1", HMAC_SECRET)) as client:
            refused = [await client.publish(topics["topic"], {"card": "4111-SECRET", "i": i},
                                            PrismPublishOptions(data_classification="restricted" if i % 2 else
                                                                "confidential")) for i in range(flood)]
            return refused, await client.publish(topics["topic"], {"ok": True},
                                                 PrismPublishOptions(data_classification="internal"))

    refused_ids, readable = asyncio.run(publish())
    out = call(go_interop, {"op": "consume", "brokers": [kafka.bootstrap], "topic": topics["topic"],
                            "namespace": "order-events", "group": topics["group"], "count": 1, "timeout_s": 90,
                            "hmac_key_id": "go-reader-1", "hmac_hex": HMAC_SECRET.hex(), "clearance": "internal",
                            "principal": "svc-go-reader", "audit_topic": topics["audit"]})
    assert not out.get("errors"), out
    assert [m["message_id"] for m in out["messages"]] == [readable]
    assert out["stats"]["withheld"] == flood and out["committed"] == {"0": flood + 1}
    n_records = out["stats"]["refusal_records"]
    assert 2 <= n_records <= flood // 10, n_records  # shared records, not one per message

    keyring = tmp_path / "signing-keyring.yaml"
    keyring.write_text(yaml.safe_dump({"keys": [{"id": "go-reader-1", "algorithm": "hmac-sha256",
                                                 "secret_b64": base64.b64encode(HMAC_SECRET).decode(),
                                                 "publisher_id": "svc-go-reader"}]}))
    result = CliRunner().invoke(build_app(), ["audit", "--url", f"kafka://{kafka.bootstrap}", "--audit-topic",
                                              topics["audit"], "--keyring", str(keyring), "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.strip()]
    assert sorted(r["message_id"] for r in lines) == sorted(refused_ids)  # each refused read, once
    assert all(r["verified"] and r["signed_by"] == "go-reader-1" for r in lines)
    assert {r["principal"] for r in lines} == {"svc-go-reader"} and {r["clearance"] for r in lines} == {"internal"}
    assert {r["classification"] for r in lines} == {"confidential", "restricted"}
    assert all(r["ref"].startswith(f"{topics['topic']}/0@") and r["group"] == topics["group"] for r in lines)
    assert "4111-SECRET" not in result.output
    records, _ = asyncio.run(read_audit(f"kafka://{kafka.bootstrap}", audit_topic=topics["audit"]))
    assert len(records) == n_records and all(r.get("count", 1) <= REFUSALS_PER_RECORD for r in records)
    # a record signed by a key bound to another principal is refused by the same command
    keyring.write_text(yaml.safe_dump({"keys": [{"id": "go-reader-1", "algorithm": "hmac-sha256",
                                                 "secret_b64": base64.b64encode(HMAC_SECRET).decode(),
                                                 "publisher_id": "svc-someone-else"}]}))
    forged = CliRunner().invoke(build_app(), ["audit", "--url", f"kafka://{kafka.bootstrap}", "--audit-topic",
                                              topics["audit"], "--keyring", str(keyring)])
    assert forged.exit_code == 1 and "FAILED" in forged.output
