"""The typed envelope table: one Arrow schema, used by the decoder, both Delta writers and the docs.

Every header field of the reviewed model gets a column; optional fields are NULL when absent
(memo-031: presence is meaningful). Deliberately NOT stored, whatever the input holds:

* `security.auth_token` - dropped (and counted) even if an upstream stage failed to strip it;
* `security.signature` - it covers the original bytes, which the table does not keep;
  `signed`, `signature_algorithm` and `signature_key_id` say what it was;
* `encryption.encapsulated_key` and `encryption.algorithm_params` - wrapped key material and
  KEM parameters. The table keeps `payload` (still ciphertext), the algorithm, key ids, IV and
  AAD; whoever holds the key and needs the KEM ciphertext reads the archived envelope, which
  `archive_file` + `source_*` locate.

Adding a column here (e.g. when the envelope gains a field) is an additive schema change: both
writers add the new nullable column to an existing table (`app.lake.writers`).
"""

from __future__ import annotations

import pyarrow as pa

PARTITION_COLUMNS = ("date", "namespace", "topic")

_STR = pa.string()
_MAP_STR = pa.map_(pa.string(), pa.string())

TABLE_SCHEMA = pa.schema([
    # identity and routing (date/namespace/topic are the partition columns)
    pa.field("message_id", _STR, nullable=False),
    pa.field("namespace", _STR),
    pa.field("topic", _STR),
    pa.field("date", pa.date32()),
    pa.field("published_at_ms", pa.int64()),
    pa.field("published_at", pa.timestamp("us", tz="UTC")),
    pa.field("source_layout", _STR),
    # metadata
    pa.field("content_type", _STR),
    pa.field("content_encoding", _STR),
    pa.field("priority", pa.int32()),
    pa.field("ttl_seconds", pa.int64()),
    pa.field("correlation_id", _STR),
    pa.field("causality_parent", _STR),
    # security: identity, signature and encryption metadata - never keys, never tokens
    pa.field("publisher_id", _STR),
    pa.field("publisher_team", _STR),
    pa.field("signed", pa.bool_()),
    pa.field("signature_algorithm", _STR),
    pa.field("signature_key_id", _STR),
    pa.field("encrypted", pa.bool_()),
    pa.field("encryption_type", _STR),
    pa.field("encryption_algorithm", _STR),
    pa.field("encryption_key_id", _STR),
    pa.field("encryption_public_key_id", _STR),
    pa.field("encryption_iv", pa.binary()),
    pa.field("encryption_aad", pa.binary()),
    pa.field("contains_pii", pa.bool_()),
    pa.field("data_classification", _STR),
    # observability
    pa.field("trace_id", _STR),
    pa.field("span_id", _STR),
    pa.field("parent_span_id", _STR),
    pa.field("trace_flags", pa.int32()),
    pa.field("baggage", _MAP_STR),
    pa.field("labels", _MAP_STR),
    # schema context
    pa.field("schema_url", _STR),
    pa.field("schema_version", _STR),
    pa.field("schema_format", _STR),
    pa.field("schema_hash", _STR),
    pa.field("schema_name", _STR),
    pa.field("compatibility_mode", _STR),
    pa.field("deprecated_fields_used", pa.list_(_STR)),
    # extensions and payload
    pa.field("extensions", pa.map_(pa.string(), pa.binary())),
    pa.field("payload_type_url", _STR),
    pa.field("payload", pa.binary()),
    pa.field("conversion_notes", pa.list_(_STR)),
    # archive provenance
    pa.field("archive_file", _STR),
    pa.field("archive_writer", _STR),
    pa.field("archive_seq", pa.int64()),
    pa.field("source_topic", _STR),
    pa.field("source_partition", pa.int32()),
    pa.field("source_offset", pa.int64()),
])

#: What the compactor writes for every record it could not turn into a table row.
QUARANTINE_SCHEMA = pa.schema([
    pa.field("archive_file", _STR),
    pa.field("source_topic", _STR),
    pa.field("source_partition", pa.int32()),
    pa.field("source_offset", pa.int64()),
    pa.field("message_id", _STR),
    pa.field("reason", _STR),
    pa.field("envelope", pa.binary()),
])

#: Column order for deterministic dedup: of several copies of one message id, the one archived first wins.
PROVENANCE_ORDER = ("archive_writer", "archive_seq", "source_topic", "source_partition", "source_offset")


def spark_schema():  # -> pyspark.sql.types.StructType (pyspark imported lazily: executors only need arrow)
    """The table schema as a Spark `StructType` (for `mapInArrow`)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(TABLE_SCHEMA)
