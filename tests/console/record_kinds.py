"""One DLQ record of every kind a worker dead-letters, built with the worker's own DLQ code
(`build_dlq_record`, `fit_dlq_record`): both envelope layouts, LNMP, CloudEvents in binary and
structured mode, JSON, raw bytes, a copy cut to fit the DLQ topic with no whole copy, a
`too_large` copy whose whole value is stored by reference (`dlq.overflow`), and a deeply
nested JSON value. Shared by the console's browser test and its view tests."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from app.agents.base import Message
from app.agents.dlq import DlqRecord, build_dlq_record, fit_dlq_record
from app.envelope import Layout, encode, new_envelope
from app.errors import (
    CloudEventError,
    LnmpError,
    MalformedTokenError,
    PolicyError,
    SignatureError,
    SizeLimitError,
    TokenExpiredError,
)
from app.formats import lnmp
from app.worker.dlq_overflow import OverflowStore

#: The DLQ topic's limit the cut copies are fitted to (small, so a few KiB is "too large").
LIMIT = 8 * 1024
BEARER = "Bearer eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJwdWItMSJ9.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
#: Deeper than any decoder's recursion limit: json.loads raised RecursionError on it.
DEEP = 5000


@dataclass(frozen=True)
class Kind:
    """One kind: its name, the DLQ copy, the `kind` the record page shows, and whether a replay
    puts it back (a copy cut without a whole copy is never replayed: `truncated`)."""

    name: str
    record: DlqRecord
    shows: str
    replayable: bool = True


def _msg(topic: str, offset: int, value: bytes, headers: list[tuple[str, bytes]]) -> Message:
    return Message(topic=topic, partition=0, offset=offset, value=value, key=f"k-{offset}".encode(),
                   headers=headers, timestamp_ms=int(time.time() * 1000))


def _envelope(topic: str, layout: Layout) -> bytes:
    env = new_envelope(topic, {"order_id": f"o-{layout.value}", "total": 3}, namespace="order-events")
    sec = env.ensure_security()
    sec.auth_token, sec.data_classification = BEARER.removeprefix("Bearer "), "internal"
    return encode(env, layout)


def every_kind(topic: str, overflow: OverflowStore) -> list[Kind]:
    """The DLQ copies of source `topic` (partition 0; offsets 0..), in order."""
    ce_binary = [("ce_specversion", b"1.0"), ("ce_type", b"order.created"), ("ce_source", b"/shop"),
                 ("ce_id", b"ce-1"), ("content-type", b"application/json")]
    ce_structured = json.dumps({"specversion": "1.0", "type": "order.created", "source": "/shop", "id": "ce-2",
                                "datacontenttype": "application/json", "data": {"order_id": "o-ce"}}).encode()
    record = b'F12=14532\nF7=1\nF20="Alice"\n'
    lnmp_value = lnmp.encode_container(lnmp.Container(record=record, envelope=lnmp.LnmpEnvelope(
        timestamp=int(time.time() * 1000), source="auth-service", sequence=1)))
    big = json.dumps({"order_id": "o-big", "pad": "x" * (4 * LIMIT)}).encode()
    deep = b"[" * DEEP + b"]" * DEEP
    specs: list[tuple[str, bytes, list[tuple[str, bytes]], BaseException, str, bool, bool]] = [
        ("envelope-reviewed", _envelope(topic, Layout.REVIEWED), [], TokenExpiredError("token expired"),
         "envelope", False, True),
        ("envelope-draft", _envelope(topic, Layout.DRAFT), [], SignatureError("signature does not verify"),
         "envelope", False, True),
        ("lnmp", lnmp_value, [("content-type", b"application/lnmp")], LnmpError("bad LNMP metadata"),
         "lnmp", False, True),
        ("cloudevents-binary", b'{"order_id": "o-ce-bin"}', [*ce_binary, ("Authorization", BEARER.encode())],
         CloudEventError("ce_type not allowed"), "json", False, True),
        ("cloudevents-structured", ce_structured, [("content-type", b"application/cloudevents+json")],
         CloudEventError("ce_source not allowed"), "json", False, True),
        ("json", b'{"order_id": "o-json", "note": "<script>alert(1)</script>"}',
         [("content-type", b"application/json"), ("Authorization", BEARER.encode())],
         PolicyError("confidential data must be encrypted"), "json", False, True),
        ("raw", bytes(range(256)), [], MalformedTokenError("not a JWT"), "bytes", False, True),
        ("truncated", big, [("content-type", b"application/json")], SizeLimitError("too big", path="value"),
         "text", True, False),
        ("too-large-by-ref", big.replace(b"o-big", b"o-ref"), [("content-type", b"application/json")],
         SizeLimitError("too big", path="value"), "text", True, True),
        ("deeply-nested", deep, [("content-type", b"application/json")], PolicyError("nested too deeply"),
         "text", False, True),
    ]
    out = []
    for offset, (name, value, headers, error, shows, cut, replayable) in enumerate(specs):
        rec = build_dlq_record(_msg(topic, offset, value, headers), stage="authenticate", stage_class="Authenticate",
                               error=error, dlq_topic=topic + ".dlq")
        if cut:
            rec = fit_dlq_record(rec, LIMIT, overflow.put if name == "too-large-by-ref" else None)
        out.append(Kind(name, rec, shows, replayable))
    return out


def as_record(rec: DlqRecord, partition: int, offset: int) -> Any:
    """A DLQ copy as the consumer reads it back (for tests without a broker)."""
    from types import SimpleNamespace

    return SimpleNamespace(topic=rec.topic, partition=partition, offset=offset, key=rec.key, value=rec.value,
                           headers=list(rec.headers), timestamp=rec.timestamp_ms)
