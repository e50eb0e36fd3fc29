"""Fixtures for the lakehouse tests: ONE SparkSession for the whole test session (a start costs
seconds), envelope generators for both layouts, and a moto S3 server on a free loopback port."""

from __future__ import annotations

import logging
import os
import random
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from app.envelope import Envelope, Layout, encode, new_envelope
from app.lake.archive import ArchiveRecord

#: Canary strings planted in inputs; no table data file may ever contain them.
TOKEN_CANARY = "eyJhbGciOiJIUzI1NiJ9.CANARY-TOKEN-7f3a9c1e5b.sig"
KEY_CANARY = b"-----BEGIN PRIVATE KEY----- CANARY-KEY-2d8e4b6a91 -----END PRIVATE KEY-----"


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test session (local[2], quiet settings of app.lake.spark)."""
    from app.lake.spark import get_spark

    session = get_spark("local[2]", app_name="prism-lake-tests")
    yield session
    session.stop()


@dataclass
class Traffic:
    """Archive records plus what a correct table must hold."""

    records: list[ArchiveRecord] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)           # distinct valid message ids
    corrupt_offsets: set[tuple[str, int, int]] = field(default_factory=set)


def encrypted_looking(env: Envelope, rng: random.Random, *, key_id: str = "orders-dek-1") -> Envelope:
    """Make an envelope look like an AEAD-encrypted one: random payload, encryption metadata,
    a KEM ciphertext (encapsulated key) and params carrying the key canary."""
    sec = env.ensure_security()
    enc = sec.encryption
    enc.key_id = key_id
    enc.algorithm = "aes-256-gcm"
    enc.encryption_type = 4  # ENCRYPTION_TYPE_HYBRID
    enc.public_key_id = "orders-kem-2026"
    enc.iv = rng.randbytes(12)
    enc.encapsulated_key = KEY_CANARY
    enc.algorithm_params = '{"kdf":"hkdf-sha256","wrapped":"' + KEY_CANARY.decode() + '"}'
    env.payload = type(env.payload)(rng.randbytes(48), "")
    return env


def make_traffic(n: int, *, seed: int = 7, topics: tuple[str, ...] = ("orders.created", "orders.paid"),
                 partitions: int = 2, source_topic: str = "prism.archive", dup_every: int = 10,
                 corrupt_at: tuple[int, ...] = (), day_ms: int = 1_795_000_000_000) -> Traffic:
    """`n` distinct envelopes three minutes apart (both layouts, a third encrypted-looking, a fifth with a planted
    auth token, a few signed-looking), each `dup_every`-th one delivered twice (a redelivery at
    a later offset), and corrupt bytes at the given positions. Offsets are contiguous per partition."""
    rng = random.Random(seed)
    t = Traffic()
    next_offset = [0] * partitions
    pending_dups: list[tuple[int, bytes]] = []

    def emit(part: int, data: bytes) -> ArchiveRecord:
        rec = ArchiveRecord(data, source_topic, part, next_offset[part])
        next_offset[part] += 1
        t.records.append(rec)
        return rec

    for i in range(n):
        if i in corrupt_at:
            rec = emit(i % partitions, b"\x0a\xff\xff\xff\xff\x0fnot an envelope")
            t.corrupt_offsets.add((rec.source_topic, rec.partition, rec.offset))
        topic = topics[i % len(topics)]
        env = new_envelope(topic, {"order_id": i, "amount": rng.randint(1, 10_000)}, namespace="orders",
                           published_at_ms=day_ms + i * 180_000, labels={"region": rng.choice(["eu", "us"])},
                           extensions={"x-tenant": f"t{i % 3}".encode()}, contains_pii=(i % 4 == 0),
                           data_classification=rng.choice(["internal", "confidential"]))
        if i % 3 == 0:
            encrypted_looking(env, rng)
        sec = env.ensure_security()
        sec.publisher_id = f"svc-{i % 4}"
        if i % 5 == 0:
            sec.auth_token = TOKEN_CANARY
        if i % 7 == 0:
            sec.signature = rng.randbytes(64)
            sec.signature_algorithm = "ed25519"
            sec.signature_key_id = "signer-1"
        obs = env.ensure_observability()
        obs.trace_id, obs.span_id = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"
        data = encode(env, Layout.DRAFT if i % 2 else Layout.REVIEWED)
        t.ids.add(env.message_id)
        part = i % partitions
        emit(part, data)
        if dup_every and i % dup_every == 0:
            pending_dups.append((part, data))
        if len(pending_dups) > 3:  # redeliver a little later, as a consumer restart would
            p, d = pending_dups.pop(0)
            emit(p, d)
    for p, d in pending_dups:
        emit(p, d)
    return t


@pytest.fixture
def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def s3_url(free_port: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty bucket on a moto S3 server; yields an `s3://` URL pyarrow understands."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port, verbose=False)
    server.start()
    try:
        bucket = f"prism-archive-{uuid.uuid4().hex[:8]}"  # moto keeps its state per process, not per server
        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{free_port}").create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/archive?endpoint_override=127.0.0.1:{free_port}&scheme=http&region=us-east-1"
    finally:
        server.stop()


def scan_for(path: str, needles: list[bytes]) -> list[tuple[str, bytes]]:
    """Every (file, needle) found under `path`: raw bytes of every file, and for Parquet files
    also every decompressed value (a compressed page would hide a plain-text canary)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    hits = []
    for dirpath, _, names in os.walk(path):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                blobs = [f.read()]
            if name.endswith(".parquet") or ".parquet" in name:
                try:
                    table = pq.read_table(full)
                except (OSError, pa.ArrowException):
                    table = None
                if table is not None:
                    sink = pa.BufferOutputStream()
                    with pa.ipc.new_stream(sink, table.schema) as w:
                        w.write_table(table)
                    blobs.append(sink.getvalue().to_pybytes())
            hits += [(full, n) for n in needles if any(n in b for b in blobs)]
    return hits
