"""The `prism*` CloudEvents extension attributes: envelope fields CloudEvents has no attribute for.

The CloudEvents spec ("Extension Context Attributes") lets an event carry extra attributes
named with lowercase letters and digits; Prism carries the rest of its envelope that way
(priority, ttl, schema version, encryption metadata, baggage, ...), so an envelope survives a
trip through CloudEvents. This module names those attributes and reads them back onto an
envelope, refusing values that are not of the documented shape. `encode` writes them.

The documented CloudEvents extensions map onto envelope fields in `encode` and `decode`,
next to the core attributes, because the order attributes are written in is the order of
binary-mode headers and structured-mode members: Distributed Tracing (`traceparent`,
`tracestate`), `dataclassification`, and `partitionkey` (the Kafka record key).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from ..._gen.prism.envelope.v1 import envelope_pb2 as pb
from ...envelope.model import Envelope, Payload, set_content_encoding
from ...errors import CloudEventError
from .. import _json
from .._fields import MAX_MS

_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")

# Prism fields without a CloudEvents attribute travel as `prism*` extension attributes.
A_TYPE_URL = "prismtypeurl"
A_PRIORITY = "prismpriority"
A_TTL = "prismttl"
A_CORRELATION = "prismcorrelationid"
A_CAUSALITY = "prismcausalityparent"
A_ENCODING = "prismcontentencoding"
A_TEAM = "prismpublisherteam"
A_PII = "prismcontainspii"
A_ENCRYPTION = "prismencryption"
A_SCHEMA_VERSION = "prismschemaversion"
A_SCHEMA_FORMAT = "prismschemaformat"
A_SCHEMA_HASH = "prismschemahash"
A_COMPAT = "prismcompatibility"
A_DEPRECATED = "prismdeprecatedfields"
A_TRACE_ID = "prismtraceid"
A_SPAN_ID = "prismspanid"
A_TRACE_FLAGS = "prismtraceflags"
A_PARENT_SPAN = "prismparentspanid"
A_BAGGAGE = "prismbaggage"
A_LABELS = "prismlabels"
A_EXTENSIONS = "prismextensions"
A_SDK_VERSION = "prismsdkversion"  # metadata.producer_sdk_version (CloudEvents names: at most 20 characters)
PRISM_ATTRIBUTES = frozenset({
    A_TYPE_URL, A_PRIORITY, A_TTL, A_CORRELATION, A_CAUSALITY, A_ENCODING, A_TEAM, A_PII, A_ENCRYPTION,
    A_SCHEMA_VERSION, A_SCHEMA_FORMAT, A_SCHEMA_HASH, A_COMPAT, A_DEPRECATED, A_TRACE_ID, A_SPAN_ID,
    A_TRACE_FLAGS, A_PARENT_SPAN, A_BAGGAGE, A_LABELS, A_EXTENSIONS, A_SDK_VERSION,
})


def _int_attr(name: str, text: str, lo: int, hi: int, where: str) -> int:
    if not re.fullmatch(r"-?[0-9]{1,19}", text) or not lo <= int(text) <= hi:
        raise CloudEventError(f"{name} {text[:30]!r} is not an integer in {lo}..{hi}", path=where)
    return int(text)


def _json_attr(name: str, text: str, kind: type, where: str) -> Any:
    try:
        value = _json.loads(text)
    except ValueError:
        raise CloudEventError(f"{name} is not JSON", path=where) from None
    if not isinstance(value, kind):
        raise CloudEventError(f"{name} must be a JSON {kind.__name__}", path=where)
    return value


def _apply_prism_attributes(env: Envelope, t: Mapping[str, str], where: str, notes: list[str]) -> None:
    md = env.metadata
    w = where
    if A_TYPE_URL in t:
        env.payload = Payload(env.payload.value, t[A_TYPE_URL])
    if A_PRIORITY in t:
        md.priority = _int_attr(A_PRIORITY, t[A_PRIORITY], 0, 10, w + A_PRIORITY)
    if A_TTL in t:
        md.ttl_seconds = _int_attr(A_TTL, t[A_TTL], 0, MAX_MS, w + A_TTL)
    if A_CORRELATION in t:
        md.correlation_id = t[A_CORRELATION]
    if A_CAUSALITY in t:
        md.causality_parent = t[A_CAUSALITY]
    if A_SDK_VERSION in t:
        md.producer_sdk_version = t[A_SDK_VERSION]
    if A_ENCODING in t:
        set_content_encoding(md, t[A_ENCODING])
    if A_TEAM in t:
        env.ensure_security().publisher_team = t[A_TEAM]
    if A_PII in t:
        if t[A_PII] not in ("true", "false"):
            raise CloudEventError(f"{A_PII} must be true or false", path=w + A_PII)
        env.ensure_security().contains_pii = t[A_PII] == "true"
    if A_ENCRYPTION in t:
        try:
            enc = pb.EncryptionMetadata.FromString(base64.b64decode(t[A_ENCRYPTION], validate=True))
        except Exception:  # binascii.Error or upb's DecodeError
            raise CloudEventError(f"{A_ENCRYPTION} is not base64 of an EncryptionMetadata message",
                                  path=w + A_ENCRYPTION) from None
        env.ensure_security().encryption.CopyFrom(enc)
    for attr, name in ((A_SCHEMA_VERSION, "schema_version"), (A_SCHEMA_FORMAT, "schema_format"),
                       (A_SCHEMA_HASH, "schema_hash"), (A_COMPAT, "compatibility_mode")):
        if attr in t:
            setattr(env.ensure_schema(), name, t[attr])
    if A_DEPRECATED in t:
        fields = _json_attr(A_DEPRECATED, t[A_DEPRECATED], list, w + A_DEPRECATED)
        if not all(isinstance(f, str) for f in fields):
            raise CloudEventError(f"{A_DEPRECATED} must be a JSON list of strings", path=w + A_DEPRECATED)
        env.ensure_schema().deprecated_fields_used.extend(fields)
    for attr, name, pattern in ((A_TRACE_ID, "trace_id", _HEX32), (A_SPAN_ID, "span_id", _HEX16),
                                (A_PARENT_SPAN, "parent_span_id", _HEX16)):
        if attr in t:
            if not pattern.fullmatch(t[attr]):
                raise CloudEventError(f"{attr} is not lowercase hex of the W3C length", path=w + attr)
            setattr(env.ensure_observability(), name, t[attr])
    if A_TRACE_FLAGS in t:
        env.ensure_observability().trace_flags = _int_attr(A_TRACE_FLAGS, t[A_TRACE_FLAGS], -(2**31), 2**31 - 1,
                                                           w + A_TRACE_FLAGS)
    for attr, target in ((A_BAGGAGE, "baggage"), (A_LABELS, "labels")):
        if attr in t:
            m = _json_attr(attr, t[attr], dict, w + attr)
            if not all(isinstance(v, str) for v in m.values()):
                raise CloudEventError(f"{attr} must map strings to strings", path=w + attr)
            getattr(env.ensure_observability(), target).update(m)
    if A_EXTENSIONS in t:
        m = _json_attr(A_EXTENSIONS, t[A_EXTENSIONS], dict, w + A_EXTENSIONS)
        for k, v in m.items():
            try:
                raw = base64.b64decode(v, validate=True) if isinstance(v, str) else None
            except (binascii.Error, ValueError):
                raw = None
            if raw is None:
                raise CloudEventError(f"{A_EXTENSIONS}[{k[:30]!r}] is not a base64 string", path=w + A_EXTENSIONS)
            if k in env.extensions:
                notes.append(f"{A_EXTENSIONS}[{k[:30]!r}] ignored: the event sets that extension directly")
                continue
            env.extensions[k] = raw
