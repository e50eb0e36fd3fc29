"""Archive rows -> typed table rows. Pure Python + Arrow, so it runs inside Spark executors
(`mapInArrow`) and in unit tests alike.

`decode` detects the layout (draft or reviewed) and parses only the header; the payload
stays an undecoded slice that is copied into the `payload` column as is (ciphertext stays
ciphertext). Records that cannot become rows (undecodable bytes, missing required fields,
bytes the archive sink already flagged) come back separately with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from app._gen.prism.envelope.v1 import envelope_pb2 as pb
from app.envelope import Layout, decode, detect_layout, required_problems
from app.envelope.layouts import ENC_EXT_PREFIX
from app.envelope.model import get_content_encoding, get_content_type
from app.errors import EnvelopeError
from app.lake.schema import QUARANTINE_SCHEMA, TABLE_SCHEMA

_DAY_MS = 86_400_000
_TAG_FIELD1_VARINT = 0x08  # draft layouts start with envelope_version (field 1, varint)
_TAG_FIELD1_LEN = 0x0A     # reviewed layouts start with metadata (field 1, length-delimited)


@dataclass(slots=True)
class Decoded:
    """Rows for the table, rows for quarantine, and how many auth tokens were dropped."""

    rows: pa.Table
    quarantined: pa.Table
    tokens_dropped: int


def _layout(data: bytes) -> Layout:
    # Fast path for the usual field order; `detect_layout` walks all records otherwise.
    if data[:1] == b"\x08":
        return Layout.DRAFT
    if data[:1] == b"\x0a":
        return Layout.REVIEWED
    return detect_layout(data)


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def _nz(value: Any) -> Any:
    """proto3 plain fields: the zero value means unset."""
    return value or None


def decode_archive_table(table: pa.Table, *, archive_file: str, writer: str, seq: int) -> Decoded:
    """Decode one archive file's rows (see the module docstring)."""
    cols: dict[str, list[Any]] = {f.name: [] for f in TABLE_SCHEMA}
    bad: dict[str, list[Any]] = {f.name: [] for f in QUARANTINE_SCHEMA}
    tokens = 0
    envelopes = table.column("envelope").to_pylist()
    src_topics = table.column("source_topic").to_pylist()
    src_parts = table.column("source_partition").to_pylist()
    src_offsets = table.column("source_offset").to_pylist()
    header_errors = (table.column("header_error").to_pylist() if "header_error" in table.column_names
                     else [None] * len(envelopes))

    def reject(i: int, reason: str, message_id: str | None) -> None:
        bad["archive_file"].append(archive_file)
        bad["source_topic"].append(src_topics[i])
        bad["source_partition"].append(src_parts[i])
        bad["source_offset"].append(src_offsets[i])
        bad["message_id"].append(message_id)
        bad["reason"].append(reason)
        bad["envelope"].append(envelopes[i])

    for i, data in enumerate(envelopes):
        if header_errors[i]:
            reject(i, f"archive sink could not decode it: {header_errors[i]}", None)
            continue
        notes: list[str] = []
        try:
            layout = _layout(data)
            env = decode(data, layout=layout, dropped=notes)
            problems = required_problems(env)
        except EnvelopeError as exc:
            reject(i, f"{exc.code}: {exc}", None)
            continue
        md = env.header.metadata
        if problems:
            reject(i, "invalid_envelope: " + "; ".join(str(p) for p in problems), md.message_id or None)
            continue
        h = env.header
        ms = md.published_at_ms
        cols["message_id"].append(md.message_id)
        cols["namespace"].append(md.namespace)
        cols["topic"].append(md.topic)
        cols["date"].append(ms // _DAY_MS)
        cols["published_at_ms"].append(ms)
        cols["published_at"].append(ms * 1000)
        cols["source_layout"].append(layout.value)
        cols["content_type"].append(get_content_type(md) or None)
        cols["content_encoding"].append(get_content_encoding(md) or None)
        cols["priority"].append(env.priority)
        cols["ttl_seconds"].append(_opt(md, "ttl_seconds"))
        cols["correlation_id"].append(_opt(md, "correlation_id"))
        cols["causality_parent"].append(_opt(md, "causality_parent"))

        sec = h.security if h.HasField("security") else None
        if sec is not None and sec.HasField("auth_token"):
            tokens += 1  # counted, never read: the token is simply not copied anywhere
        enc = sec.encryption if sec is not None and sec.HasField("encryption") else None
        cols["publisher_id"].append(_opt(sec, "publisher_id") if sec is not None else None)
        cols["publisher_team"].append(_opt(sec, "publisher_team") if sec is not None else None)
        cols["signed"].append(sec is not None and sec.HasField("signature"))
        cols["signature_algorithm"].append(_opt(sec, "signature_algorithm") if sec is not None else None)
        cols["signature_key_id"].append(_opt(sec, "signature_key_id") if sec is not None else None)
        cols["encrypted"].append(enc is not None)
        cols["encryption_type"].append(
            pb.EncryptionType.Name(enc.encryption_type) if enc is not None and enc.encryption_type else None)
        cols["encryption_algorithm"].append(_nz(enc.algorithm) if enc is not None else None)
        cols["encryption_key_id"].append(_nz(enc.key_id) if enc is not None else None)
        cols["encryption_public_key_id"].append(_opt(enc, "public_key_id") if enc is not None else None)
        cols["encryption_iv"].append(_opt(enc, "iv") if enc is not None else None)
        cols["encryption_aad"].append(_opt(enc, "aad") if enc is not None else None)
        cols["contains_pii"].append(_opt(sec, "contains_pii") if sec is not None else None)
        cols["data_classification"].append(_opt(sec, "data_classification") if sec is not None else None)

        if h.HasField("observability"):
            obs = h.observability
            cols["trace_id"].append(_nz(obs.trace_id))
            cols["span_id"].append(_nz(obs.span_id))
            cols["parent_span_id"].append(_nz(obs.parent_span_id))
            cols["trace_flags"].append(obs.trace_flags)
            cols["baggage"].append(list(obs.baggage.items()) or None)
            cols["labels"].append(list(obs.labels.items()) or None)
        else:
            for name in ("trace_id", "span_id", "parent_span_id", "trace_flags", "baggage", "labels"):
                cols[name].append(None)

        if h.HasField("schema"):
            sc = h.schema
            cols["schema_url"].append(_nz(sc.schema_url))
            cols["schema_version"].append(_nz(sc.schema_version))
            cols["schema_format"].append(_nz(sc.schema_format))
            cols["schema_hash"].append(_nz(sc.schema_hash))
            cols["schema_name"].append(_nz(sc.schema_name))
            cols["compatibility_mode"].append(_nz(sc.compatibility_mode))
            cols["deprecated_fields_used"].append(list(sc.deprecated_fields_used) or None)
        else:
            for name in ("schema_url", "schema_version", "schema_format", "schema_hash", "schema_name",
                         "compatibility_mode", "deprecated_fields_used"):
                cols[name].append(None)

        # prism.enc.* keys carry draft-layout encryption metadata (incl. encapsulated keys): never copied.
        ext = [(k, v) for k, v in h.extensions.items() if not k.startswith(ENC_EXT_PREFIX)]
        cols["extensions"].append(ext or None)
        payload = env.payload
        cols["payload_type_url"].append((payload.type_url or None) if payload.present else None)
        cols["payload"].append(bytes(payload.value) if payload.present else None)
        cols["conversion_notes"].append(notes or None)

        cols["archive_file"].append(archive_file)
        cols["archive_writer"].append(writer)
        cols["archive_seq"].append(seq)
        cols["source_topic"].append(src_topics[i])
        cols["source_partition"].append(src_parts[i])
        cols["source_offset"].append(src_offsets[i])

    return Decoded(
        rows=pa.Table.from_pydict(cols, schema=TABLE_SCHEMA),
        quarantined=pa.Table.from_pydict(bad, schema=QUARANTINE_SCHEMA),
        tokens_dropped=tokens,
    )
