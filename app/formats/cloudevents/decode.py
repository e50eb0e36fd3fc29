"""CloudEvent -> envelope: the attribute mapping in the reading direction.

Maps attributes that a content-mode reader (`binary`, `structured`) or an SDK event supplied,
plus the data bytes, onto a new envelope: required attributes checked, `time` as RFC 3339,
`datacontenttype` (a structured event's `data` without one is application/json, as the JSON
event format says), the Distributed Tracing extension (an unparsable `traceparent` is ignored
as W3C requires and kept aside), `dataclassification`, `partitionkey` against the record key,
`prism*` attributes (`extensions`), and every other attribute as a `ce.<name>` extension.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cloudevents.core.base import BaseCloudEvent

from ...bindings.tracecontext import TRACESTATE_EXTENSION, parse_traceparent
from ...envelope.model import Envelope, Payload, set_content_type
from ...envelope.validation import CLASSIFICATIONS
from ...errors import CloudEventError
from .. import _json
from .._fields import ms_from_rfc3339
from .attributes import (
    EXTENSION_PREFIX,
    KEY_EXTENSION,
    RESERVED,
    SOURCE_PREFIX,
    _as_text,
    _attr_text,
    _require,
)
from .extensions import _apply_prism_attributes


@dataclass(slots=True)
class Decoded:
    envelope: Envelope
    notes: list[str]


def attributes_to_envelope(
    attrs: Mapping[str, Any],
    data: bytes,
    *,
    topic: str,
    namespace: str,
    where: str = "",
    key: bytes | None = None,
    json_data: bool = False,
    now_ms: int | None = None,
) -> Decoded:
    """Map validated-shape attributes + raw data bytes onto a new envelope (see module table).

    `json_data` says the data came from a structured event's `data` member with no
    datacontenttype, which the JSON event format defines as application/json.
    """
    _require(attrs, where)
    notes: list[str] = []
    env = Envelope(payload=Payload(data))
    md = env.metadata
    md.message_id = attrs["id"]
    md.topic, md.namespace = topic, namespace
    text: dict[str, str] = {}
    for name, value in attrs.items():
        if value is None:
            continue
        if name == "time":
            if isinstance(value, datetime):
                value = _attr_text(value)
            elif not isinstance(value, str):
                raise CloudEventError("time must be an RFC 3339 string", path=f"{where}time")
        text[name] = _as_text(name, value, f"{where}{name}")
    if text["source"] != SOURCE_PREFIX + namespace:
        env.ensure_security().publisher_id = text["source"]
    if text["type"] != topic:
        env.ensure_schema().schema_name = text["type"]
    if "time" in text:
        md.published_at_ms = ms_from_rfc3339(text["time"], f"{where}time", CloudEventError)
    else:
        md.published_at_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        notes.append("event has no time; metadata.published_at_ms set to now")
    ct = text.get("datacontenttype")
    if ct is not None:
        if not ct:
            raise CloudEventError("datacontenttype must not be empty", path=f"{where}datacontenttype")
        set_content_type(md, ct)
    elif json_data:
        set_content_type(md, "application/json")
    if "dataschema" in text:
        env.ensure_schema().schema_url = text["dataschema"]
    if "traceparent" in text:
        tp = parse_traceparent(text["traceparent"])
        if tp is None:
            # W3C Trace Context: a receiver ignores a traceparent it cannot parse. Keep the text.
            env.extensions[EXTENSION_PREFIX + "traceparent"] = text["traceparent"].encode("utf-8")
            notes.append("traceparent is not valid W3C trace context; kept in extensions['ce.traceparent']")
        else:
            obs = env.ensure_observability()
            obs.trace_id, obs.span_id, obs.trace_flags = tp.trace_id, tp.parent_id, tp.propagated_flags()
    if "tracestate" in text:
        env.extensions[TRACESTATE_EXTENSION] = text["tracestate"].encode("utf-8")
    if "dataclassification" in text:
        cls = text["dataclassification"]
        if cls not in CLASSIFICATIONS:
            raise CloudEventError(f"dataclassification {cls[:30]!r} is unknown", path=f"{where}dataclassification",
                                  hint=f"use one of {sorted(CLASSIFICATIONS)}")
        env.ensure_security().data_classification = cls
    if "partitionkey" in text:
        env.extensions[KEY_EXTENSION] = text["partitionkey"].encode("utf-8")
    if key is not None:
        if "partitionkey" in text and text["partitionkey"].encode("utf-8") != key:
            notes.append("partitionkey attribute differs from the Kafka record key; the record key wins")
        env.extensions[KEY_EXTENSION] = bytes(key)
    _apply_prism_attributes(env, text, where, notes)
    for name, value in text.items():
        if name in RESERVED:
            continue
        env.extensions[EXTENSION_PREFIX + name] = value.encode("utf-8")
    return Decoded(env, notes)


def from_cloudevent(event: BaseCloudEvent, *, topic: str, namespace: str, key: bytes | None = None,
                    now_ms: int | None = None) -> Decoded:
    """An SDK CloudEvent as an envelope. Bytes data is kept as is; str data is UTF-8 encoded;
    dict/list data (already parsed by the SDK) is serialized as compact JSON - say so in notes."""
    data = event.get_data()
    notes: list[str] = []
    if data is None:
        raw = b""
    elif isinstance(data, bytes | bytearray):
        raw = bytes(data)
    elif isinstance(data, str):
        raw = data.encode("utf-8")
    else:
        raw = _json.dumps_compact(data)
        notes.append("event data was a parsed JSON value; the payload is its compact JSON serialization")
    attrs = dict(event.get_attributes())
    decoded = attributes_to_envelope(attrs, raw, topic=topic, namespace=namespace, key=key, now_ms=now_ms,
                                     json_data=not isinstance(data, bytes | bytearray | str | type(None)))
    decoded.notes[:0] = notes
    return decoded
