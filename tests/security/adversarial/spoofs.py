"""One spoofed identity through every input shape that can state a publisher.

Each `Spoof` builds a record from a producer with NO credential (no token, no signature by a
key bound to a publisher, no DLQ attestation) that claims `publisher_id=svc-orders` and, where
the shape can say it, `publisher_team=commerce` - the identity of the demo's genuinely
authenticated order service. `EVERY_SHAPE` lists one per way a shape states a publisher
(app/formats: the envelope's security fields in both layouts, Kafka and NATS headers, Redis
`meta`, CloudEvents `source` in both Kafka modes, LNMP `source` in both encodings). The unit
test (tests/agents/test_identity.py) and the end-to-end attack (test_spoofed_identity.py)
both run all of them, so a new shape added here is proven by both.

`test_every_input_shape_is_covered` fails when `InputShape` gains a shape that carries metadata
and this list has no spoof for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.envelope import Layout, encode, new_envelope
from app.formats import cloudevents as ce
from app.formats.detect import InputShape
from app.formats.lnmp import Container, LnmpEnvelope, encode_container, encode_text

PUBLISHER = "svc-orders"
TEAM = "commerce"
ORDER = {"order_id": "o-spoof", "total": 10.0, "currency": "EUR"}


@dataclass(frozen=True)
class Spoof:
    label: str
    shape: InputShape
    #: topic -> (value, headers)
    build: Callable[[str], tuple[bytes, list[tuple[str, bytes]]]]
    #: the shape can state a team as well as a publisher id
    claims_team: bool = True


def _env(topic: str, *, classification: str | None = "internal"):
    env = new_envelope(topic, dict(ORDER), namespace="order-events")
    sec = env.ensure_security()
    sec.publisher_id, sec.publisher_team = PUBLISHER, TEAM
    if classification:
        sec.data_classification = classification
    return env


def _envelope(layout: Layout) -> Callable[[str], tuple[bytes, list[tuple[str, bytes]]]]:
    return lambda topic: (encode(_env(topic), layout), [])


def _kafka_headers(topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    return json.dumps(ORDER).encode(), [("content-type", b"application/json"), ("publisher-id", PUBLISHER.encode()),
                                        ("publisher-team", TEAM.encode())]


def _nats_headers(topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    return json.dumps(ORDER).encode(), [("Nats-Msg-Id", b"nats-spoof"), ("X-Publisher-Id", PUBLISHER.encode()),
                                        ("X-Publisher-Team", TEAM.encode())]


def _redis_json(topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    return json.dumps({"meta": {"publisher": PUBLISHER, "publisher_team": TEAM}, "payload": ORDER}).encode(), []


def _ce_binary(topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    rec = ce.to_kafka_binary(_env(topic))  # source=svc-orders, prismpublisherteam=commerce
    return rec.value, [(k, v if isinstance(v, bytes) else str(v).encode()) for k, v in rec.headers]


def _ce_structured(topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    rec = ce.to_kafka_structured(_env(topic))
    return rec.value, [(k, v if isinstance(v, bytes) else str(v).encode()) for k, v in rec.headers]


def _lnmp_text(topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    env = LnmpEnvelope(timestamp=int(time.time() * 1000), source=PUBLISHER, sequence=1)
    return bytes(encode_text(b"F12=1\nF7=1\n", env)), []


def _lnmp_binary(topic: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    env = LnmpEnvelope(timestamp=int(time.time() * 1000), source=PUBLISHER, sequence=2)
    return encode_container(Container(record=b"\x01\x02\x00\x00\x00\x07", envelope=env)), []


EVERY_SHAPE: tuple[Spoof, ...] = (
    Spoof("envelope-v3", InputShape.PRISM_REVIEWED, _envelope(Layout.REVIEWED)),
    Spoof("envelope-v2", InputShape.PRISM_DRAFT, _envelope(Layout.DRAFT)),
    Spoof("kafka-headers", InputShape.KAFKA_HEADERS, _kafka_headers),
    Spoof("nats-headers", InputShape.NATS_HEADERS, _nats_headers),
    Spoof("redis-meta", InputShape.REDIS_JSON, _redis_json),
    Spoof("cloudevent-binary", InputShape.CLOUDEVENT_BINARY, _ce_binary),
    Spoof("cloudevent-structured", InputShape.CLOUDEVENT_STRUCTURED, _ce_structured),
    Spoof("lnmp-text", InputShape.LNMP_TEXT, _lnmp_text, claims_team=False),
    Spoof("lnmp-binary", InputShape.LNMP_BINARY, _lnmp_binary, claims_team=False),
)

#: Shapes that carry no metadata at all, so no publisher claim (nothing to spoof with).
NO_METADATA = frozenset({InputShape.RAW})
