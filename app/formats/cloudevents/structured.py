"""Structured content mode of the CloudEvents Kafka Protocol Binding 1.0, both directions.

The `content-type` header is `application/cloudevents+json` and the record value is the whole
event in the CloudEvents JSON event format; other `application/cloudevents...` formats (batch,
for example) are refused. Data goes in `data` when that keeps the payload bytes exact (JSON
payloads verbatim, UTF-8 `text/*` as a JSON string) and in `data_base64` otherwise; reading
cuts JSON data out of the value as written rather than re-encoding it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat

from ...envelope.model import Envelope
from ...errors import CloudEventError
from .. import _json
from .._fields import header_pairs
from ..legacy import is_json_content_type
from .decode import Decoded, attributes_to_envelope
from .encode import envelope_attributes
from .kafka import STRUCTURED_JSON, STRUCTURED_PREFIX, Record, _other_headers
from .sdk import _sdk_event, _validate_with_sdk


def _data_member(env: Envelope, ct: str) -> tuple[str, str] | None:
    """("data"|"data_base64", JSON text) for a structured event, or None for no data.

    JSON payloads are embedded verbatim only when that is exact (the bytes are JSON with no
    surrounding whitespace, not compressed/encrypted/typed): reading the event back yields the
    very same bytes. `text/*` payloads that are UTF-8 become a JSON string; everything else is
    base64 (`data_base64`).
    """
    raw = bytes(env.payload.value)
    if not raw:
        return None
    plain = not env.is_encrypted and env.content_encoding in ("", "none") and not env.payload.type_url
    if plain and ct and is_json_content_type(ct) and _json.is_exact_json(raw):
        return "data", raw.decode("utf-8")
    if plain and ct.lower().startswith("text/"):
        try:
            return "data", json.dumps(raw.decode("utf-8"), ensure_ascii=False)
        except UnicodeDecodeError:
            pass
    return "data_base64", json.dumps(base64.b64encode(raw).decode("ascii"))


def to_kafka_structured(env: Envelope) -> Record:
    """Structured content mode: `content-type: application/cloudevents+json`, value = the event."""
    attrs, key, dropped = envelope_attributes(env)
    event = _sdk_event(attrs, None)
    msg = ce_kafka.to_structured(event, JSONFormat(), key_mapper=lambda _e: key)
    value = msg.value
    member = _data_member(env, attrs.get("datacontenttype", ""))
    if member is not None:
        # Splice the data member in after the SDK wrote the attributes: the SDK would re-encode
        # JSON data (changing its bytes); this keeps the payload exactly as in the envelope.
        name, text = member
        value = value[:-1].rstrip() + f', "{name}": {text}}}'.encode()
    headers = [(name, v) for name, v in msg.headers.items()]
    return Record(key, value, headers, dropped)


def from_kafka_structured(value: bytes | memoryview, headers: Sequence[tuple[str, bytes | str]] = (),
                          key: bytes | None = None, *, topic: str, namespace: str,
                          now_ms: int | None = None) -> Decoded:
    pairs = header_pairs(headers)
    for name, raw in pairs:
        if name == "content-type":
            ct = raw.decode("latin-1").strip().lower()
            if ct.startswith(STRUCTURED_PREFIX) and not ct.split(";")[0].strip() == STRUCTURED_JSON:
                raise CloudEventError(f"structured event format {ct[:60]!r} is not supported", path="header content-type",
                                      hint=f"send {STRUCTURED_JSON} (the JSON event format)")
    try:
        text = bytes(value).decode("utf-8")
        members = _json.scan_object(text)
    except UnicodeDecodeError as exc:
        raise CloudEventError(f"structured event is not UTF-8 (byte {exc.start})", path="value") from None
    except ValueError as exc:
        raise CloudEventError(f"structured event is not one JSON object: {exc}", path="value",
                              hint="the value must be a JSON-format CloudEvent") from None
    if "data" in members and "data_base64" in members:
        raise CloudEventError("event has both data and data_base64", path="value",
                              hint="the JSON event format allows only one of them")
    attrs = {k: m.value for k, m in members.items() if k not in ("data", "data_base64")}
    for k, v in attrs.items():
        if isinstance(v, dict | list | float):
            raise CloudEventError(f"attribute {k!r} has a JSON {type(v).__name__} value", path=f"value.{k}",
                                  hint="attribute values are strings, integers or booleans")
    ct = attrs.get("datacontenttype")
    json_data = False
    if "data_base64" in members:
        b64 = members["data_base64"].value
        try:
            if not isinstance(b64, str):
                raise ValueError
            data = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise CloudEventError("data_base64 is not a base64 string", path="value.data_base64") from None
    elif "data" in members:
        m = members["data"]
        if isinstance(ct, str) and not is_json_content_type(ct) and isinstance(m.value, str):
            try:
                data = m.value.encode("utf-8")
            except UnicodeEncodeError:
                raise CloudEventError("text data holds a lone UTF-16 surrogate escape", path="value.data",
                                      hint="send binary data as data_base64") from None
        else:
            data = text[m.start : m.end].encode("utf-8")
            json_data = ct is None
    else:
        data = b""
    decoded = attributes_to_envelope(attrs, data, topic=topic, namespace=namespace, where="value.", key=key,
                                     json_data=json_data, now_ms=now_ms)
    _validate_with_sdk(attrs, data)
    _other_headers(decoded.envelope, pairs, {"content-type"}, decoded.notes)
    return decoded
