"""Binary content mode of the CloudEvents Kafka Protocol Binding 1.0, both directions.

Attributes travel in `ce_<name>` headers (UTF-8 values, names compared case-insensitively),
`datacontenttype` in the `content-type` header, and the record value is the data, byte for
byte. Writing lets the SDK write the headers; reading is done here (see `sdk` for why) and
then checked by the SDK.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cloudevents.core.bindings import kafka as ce_kafka

from ...envelope.model import Envelope
from ...errors import CloudEventError
from .._fields import header_pairs
from .decode import Decoded, attributes_to_envelope
from .encode import to_cloudevent
from .kafka import CE_PREFIX, Record, _other_headers
from .sdk import _validate_with_sdk


class _RawData:
    """SDK `Format` for binary mode that leaves data bytes exactly as they are."""

    def write_data(self, data: Any, datacontenttype: str | None) -> bytes:
        return bytes(data) if data is not None else b""

    def read_data(self, body: bytes, datacontenttype: str | None) -> bytes:
        return body


def to_kafka_binary(env: Envelope) -> Record:
    """Binary content mode: `ce_` headers, `content-type`, value = payload bytes."""
    conv = to_cloudevent(env)
    msg = ce_kafka.to_binary(conv.event, _RawData(), key_mapper=lambda _e: conv.key)
    headers = [(name, value) for name, value in msg.headers.items()]
    return Record(conv.key, msg.value, headers, conv.dropped)


def from_kafka_binary(value: bytes | memoryview, headers: Sequence[tuple[str, bytes | str]], key: bytes | None = None,
                      *, topic: str, namespace: str, now_ms: int | None = None) -> Decoded:
    pairs = header_pairs(headers)
    attrs: dict[str, str] = {}
    for name, raw in pairs:
        if name.startswith(CE_PREFIX):
            attr = name[len(CE_PREFIX):]
        elif name == "content-type":
            attr = "datacontenttype"
        else:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CloudEventError(f"header {name} is not UTF-8", path=f"header {name}",
                                  hint="CloudEvents Kafka headers carry UTF-8 strings") from None
        if attr in attrs and attrs[attr] != text:
            raise CloudEventError(f"header {name} appears twice with different values", path=f"header {name}",
                                  hint="send each attribute once")
        attrs[attr] = text
    if "specversion" not in attrs:
        raise CloudEventError("binary-mode event has no ce_specversion header", path="header ce_specversion",
                              hint="binary mode needs ce_specversion, ce_id, ce_source and ce_type headers")
    data = bytes(value)
    decoded = attributes_to_envelope(attrs, data, topic=topic, namespace=namespace, where="header ce_", key=key,
                                     now_ms=now_ms)
    _validate_with_sdk(attrs, data)
    _other_headers(decoded.envelope, pairs, {"content-type"}, decoded.notes)
    return decoded
