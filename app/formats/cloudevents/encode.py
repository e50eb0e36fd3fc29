"""Envelope -> CloudEvent: the attribute mapping in the writing direction.

Builds the CloudEvents attributes of an envelope (the table in the package docstring and
docs/formats.md): core attributes, `datacontenttype`, `dataschema`, the Distributed Tracing
extension (`traceparent`, `tracestate`), `dataclassification`, `partitionkey`, `ce.<name>`
extensions as attributes, and `prism*` attributes for the rest. Attribute order is kept
stable: it is the header order in binary mode and the member order in structured mode.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from cloudevents.core.v1.event import CloudEvent

from ...bindings.tracecontext import TRACESTATE_EXTENSION, traceparent_of, tracestate_of
from ...envelope.model import Envelope, get_content_type
from ...errors import CloudEventError
from .. import _json
from .._fields import datetime_from_ms
from .attributes import (
    _NAME,
    EXTENSION_PREFIX,
    KEY_EXTENSION,
    RESERVED,
    SOURCE_PREFIX,
    SPECVERSION,
)
from .extensions import (
    A_BAGGAGE,
    A_CAUSALITY,
    A_COMPAT,
    A_CORRELATION,
    A_DEPRECATED,
    A_ENCODING,
    A_ENCRYPTION,
    A_EXTENSIONS,
    A_LABELS,
    A_PARENT_SPAN,
    A_PII,
    A_PRIORITY,
    A_SCHEMA_FORMAT,
    A_SCHEMA_HASH,
    A_SCHEMA_VERSION,
    A_SDK_VERSION,
    A_SPAN_ID,
    A_TEAM,
    A_TRACE_FLAGS,
    A_TRACE_ID,
    A_TTL,
    A_TYPE_URL,
)
from .sdk import _sdk_event


@dataclass(slots=True)
class Converted:
    """An envelope as a CloudEvent (SDK object; data is the payload bytes)."""

    event: CloudEvent
    #: The Kafka record key (`partitionkey`), bytes, or None.
    key: bytes | None
    #: Envelope content that a CloudEvent cannot carry, one line each.
    dropped: list[str] = field(default_factory=list)


def envelope_attributes(env: Envelope) -> tuple[dict[str, Any], bytes | None, list[str]]:
    """(attributes, key, dropped) for an envelope; attribute values are strings except `time`."""
    md = env.metadata
    dropped: list[str] = []
    a: dict[str, Any] = {"specversion": SPECVERSION, "id": md.message_id}
    sec = env.security
    a["source"] = sec.publisher_id if sec is not None and sec.publisher_id else SOURCE_PREFIX + md.namespace
    sch = env.schema
    a["type"] = sch.schema_name if sch is not None and sch.schema_name else md.topic
    if not 1 <= md.published_at_ms <= 253402300799999:
        raise CloudEventError(f"published_at_ms {md.published_at_ms} has no RFC 3339 form", path="metadata.published_at_ms",
                              hint="CloudEvents time covers years 1970..9999")
    a["time"] = datetime_from_ms(md.published_at_ms)
    ct = get_content_type(md)
    if ct:
        a["datacontenttype"] = ct
    if sch is not None and sch.schema_url:
        a["dataschema"] = sch.schema_url
    if env.payload.type_url:
        a[A_TYPE_URL] = env.payload.type_url
    if md.HasField("priority"):
        a[A_PRIORITY] = str(md.priority)
    if md.HasField("ttl_seconds"):
        a[A_TTL] = str(md.ttl_seconds)
    if md.correlation_id:
        a[A_CORRELATION] = md.correlation_id
    if md.causality_parent:
        a[A_CAUSALITY] = md.causality_parent
    if md.producer_sdk_version:
        a[A_SDK_VERSION] = md.producer_sdk_version
    if md.HasField("content_encoding"):
        a[A_ENCODING] = env.content_encoding
    if sec is not None:
        if sec.publisher_team:
            a[A_TEAM] = sec.publisher_team
        if sec.HasField("contains_pii"):
            a[A_PII] = "true" if sec.contains_pii else "false"
        if sec.data_classification:
            a["dataclassification"] = sec.data_classification
        if sec.HasField("encryption"):
            a[A_ENCRYPTION] = base64.b64encode(sec.encryption.SerializeToString()).decode("ascii")
        if sec.HasField("auth_token"):
            dropped.append("security.auth_token: tokens never leave Prism")
        if sec.HasField("signature"):
            dropped.append("security.signature: covers the envelope bytes only; re-sign after conversion")
    if sch is not None:
        for attr, name in ((A_SCHEMA_VERSION, "schema_version"), (A_SCHEMA_FORMAT, "schema_format"),
                           (A_SCHEMA_HASH, "schema_hash"), (A_COMPAT, "compatibility_mode")):
            if getattr(sch, name):
                a[attr] = getattr(sch, name)
        if sch.deprecated_fields_used:
            a[A_DEPRECATED] = json.dumps(list(sch.deprecated_fields_used), ensure_ascii=False)
    obs = env.observability
    if obs is not None:
        tp = traceparent_of(env)
        if tp is not None and obs.trace_flags == (obs.trace_flags & 0xFF):
            a["traceparent"] = tp
        else:
            if obs.trace_id:
                a[A_TRACE_ID] = obs.trace_id
            if obs.span_id:
                a[A_SPAN_ID] = obs.span_id
            if obs.trace_flags:
                a[A_TRACE_FLAGS] = str(obs.trace_flags)
        if obs.parent_span_id:
            a[A_PARENT_SPAN] = obs.parent_span_id
        if obs.baggage:
            a[A_BAGGAGE] = _json.dumps_compact(dict(obs.baggage)).decode("utf-8")
        if obs.labels:
            a[A_LABELS] = _json.dumps_compact(dict(obs.labels)).decode("utf-8")
    key: bytes | None = None
    rest: dict[str, str] = {}
    for k in sorted(env.extensions):
        v = env.extensions[k]
        if k == TRACESTATE_EXTENSION and tracestate_of(env) is not None:
            a["tracestate"] = v.decode("ascii")
            continue
        if k == KEY_EXTENSION:
            key = bytes(v)
            try:
                a["partitionkey"] = v.decode("utf-8")
                continue
            except UnicodeDecodeError:
                pass  # the record key still carries it; an SDK event keeps it in prismextensions
        name = k[len(EXTENSION_PREFIX):] if k.startswith(EXTENSION_PREFIX) else ""
        if name and _NAME.fullmatch(name) and name not in RESERVED:
            try:
                a[name] = v.decode("utf-8")
                continue
            except UnicodeDecodeError:
                pass
        rest[k] = base64.b64encode(v).decode("ascii")
    if rest:
        a[A_EXTENSIONS] = json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return a, key, dropped


def to_cloudevent(env: Envelope) -> Converted:
    """The envelope as an SDK CloudEvent whose data is the payload bytes, as they are in the
    envelope (compressed or encrypted payloads stay so; `prismcontentencoding` and
    `prismencryption` say how to read them)."""
    attrs, key, dropped = envelope_attributes(env)
    data = bytes(env.payload.value)
    return Converted(_sdk_event(attrs, data if data else None), key, dropped)
