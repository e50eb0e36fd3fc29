"""Archive rows -> typed rows, without Spark: both layouts, encryption metadata without key
material, tokens dropped, bad records routed to quarantine with a reason."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa

from app.envelope import Layout, encode, new_envelope
from app.lake.archive import ARCHIVE_SCHEMA
from app.lake.decode import decode_archive_table
from app.lake.schema import QUARANTINE_SCHEMA, TABLE_SCHEMA
from tests.lake.conftest import KEY_CANARY, TOKEN_CANARY, encrypted_looking


def archive_table(blobs: list[bytes], header_errors: list[str | None] | None = None) -> pa.Table:
    n = len(blobs)
    return pa.Table.from_pydict({
        "envelope": blobs, "message_id": [None] * n, "namespace": [None] * n, "topic": [None] * n,
        "published_at_ms": [None] * n, "date": [0] * n, "source_topic": ["t"] * n, "source_partition": [3] * n,
        "source_offset": list(range(100, 100 + n)), "header_error": header_errors or [None] * n,
    }, schema=ARCHIVE_SCHEMA)


def flat_bytes(row: dict) -> bytes:
    out = []
    for v in row.values():
        items = v if isinstance(v, list) else [v]
        for item in items:
            for x in (item if isinstance(item, tuple) else (item,)):
                if isinstance(x, bytes):
                    out.append(x)
                elif x is not None:
                    out.append(str(x).encode())
    return b"\x00".join(out)


def test_both_layouts_decode_to_the_same_row():
    env = new_envelope("orders.created", {"id": 1}, namespace="orders", published_at_ms=1_795_000_000_123,
                       correlation_id="c-1", labels={"region": "eu"}, extensions={"x-tenant": b"t1"},
                       contains_pii=True, data_classification="confidential", priority=7, ttl_seconds=60)
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    sc = env.ensure_schema()
    sc.schema_name, sc.schema_version = "orders.Created", "3"
    out = decode_archive_table(archive_table([encode(env, Layout.REVIEWED), encode(env, Layout.DRAFT)]),
                               archive_file="f.parquet", writer="w", seq=4)
    assert out.rows.schema == TABLE_SCHEMA and out.quarantined.num_rows == 0
    reviewed, draft = out.rows.to_pylist()
    assert reviewed["source_layout"] == "reviewed" and draft["source_layout"] == "draft"
    for row in (reviewed, draft):
        assert row["message_id"] == env.message_id
        assert (row["namespace"], row["topic"], row["published_at_ms"]) == ("orders", "orders.created", 1_795_000_000_123)
        assert row["date"] == dt.datetime.fromtimestamp(1_795_000_000.123, dt.UTC).date()
        assert row["payload"] == b'{"id":1}' and row["content_type"] == "application/json"
        assert (row["priority"], row["ttl_seconds"], row["correlation_id"]) == (7, 60, "c-1")
        assert (row["contains_pii"], row["data_classification"]) == (True, "confidential")
        assert row["labels"] == [("region", "eu")] and row["extensions"] == [("x-tenant", b"t1")]
        assert (row["trace_id"], row["span_id"]) == (obs.trace_id, obs.span_id)
        assert (row["schema_name"], row["schema_version"]) == ("orders.Created", "3")
        assert (row["archive_file"], row["archive_writer"], row["archive_seq"]) == ("f.parquet", "w", 4)
        assert (row["source_topic"], row["source_partition"]) == ("t", 3)
    assert reviewed["source_offset"] == 100 and draft["source_offset"] == 101


def test_encryption_metadata_without_key_material_and_tokens_dropped():
    rng = random.Random(1)
    env = encrypted_looking(new_envelope("orders.paid", b"", namespace="orders"), rng)
    ciphertext = bytes(env.payload.value)
    sec = env.ensure_security()
    sec.auth_token = TOKEN_CANARY
    sec.signature, sec.signature_algorithm, sec.signature_key_id = b"s" * 64, "ed25519", "signer-1"
    # the draft layout carries the encapsulated key in a prism.enc.* extension: it must not leak either
    out = decode_archive_table(archive_table([encode(env, Layout.REVIEWED), encode(env, Layout.DRAFT)]),
                               archive_file="f", writer="w", seq=1)
    assert out.tokens_dropped == 2
    for row in out.rows.to_pylist():
        assert row["encrypted"] is True and row["payload"] == ciphertext
        assert (row["encryption_algorithm"], row["encryption_key_id"]) == ("aes-256-gcm", "orders-dek-1")
        assert (row["encryption_type"], row["encryption_public_key_id"]) == ("ENCRYPTION_TYPE_HYBRID", "orders-kem-2026")
        assert len(row["encryption_iv"]) == 12
        assert (row["signed"], row["signature_algorithm"], row["signature_key_id"]) == (True, "ed25519", "signer-1")
        everything = flat_bytes(row)
        assert TOKEN_CANARY.encode() not in everything
        assert KEY_CANARY not in everything and b"CANARY-KEY" not in everything
        assert not any(k.startswith("prism.enc.") for k, _ in row["extensions"] or [])


def test_bad_records_go_to_quarantine_with_reasons():
    good = new_envelope("orders.created", {"id": 2}, namespace="orders")
    missing_id = new_envelope("orders.created", {"id": 3}, namespace="orders")
    missing_id.header.metadata.message_id = ""
    blobs = [encode(good), b"\x0a\x05\x0a\x03ab", encode(missing_id), b"whatever"]
    out = decode_archive_table(archive_table(blobs, [None, None, None, "malformed_envelope: from the sink"]),
                               archive_file="f", writer="w", seq=1)
    assert [r["message_id"] for r in out.rows.to_pylist()] == [good.message_id]
    assert out.quarantined.schema == QUARANTINE_SCHEMA
    bad = out.quarantined.to_pylist()
    assert [b["source_offset"] for b in bad] == [101, 102, 103]
    assert bad[0]["reason"].startswith(("truncated", "malformed_envelope", "bad_length"))
    assert bad[1]["reason"].startswith("invalid_envelope") and "metadata.message_id" in bad[1]["reason"]
    assert "archive sink could not decode it" in bad[2]["reason"]
    assert [b["envelope"] for b in bad] == blobs[1:]
