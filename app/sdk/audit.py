"""Classification enforced where data is consumed (RFC-031 "Security Considerations", data
classification): a subscriber's clearance, the records of classified deliveries, and the
reader behind `prism audit`.

Why at the consumer: the worker can encrypt and label, but only the subscriber knows who is
about to read. A subscription declares a clearance (`public` < `internal` < `confidential` <
`restricted`); a message classified above it is never handed to the application - it is
acknowledged (so it does not come back forever), counted in `Subscription.stats` and logged
(the first time, then every `WITHHELD_LOG_EVERY`th). The classification is read from the
decoded envelope - the signed bytes when the subscription verifies signatures - never from a
transport header, which anyone on the path can rewrite.

Every delivery of `confidential` or `restricted` data first writes an audit record to the
audit topic (`prism.audit` by default) on the subscription's own backend, keyed by the
delivered message's id: principal, group, message id, namespace, topic, classification, time,
backend position. Never the payload, never a token. The record is written *before* the message
is handed out, so there is no delivery without its record; when the write fails the message is
given back to the backend (nack) and `DeliveryAuditError` is raised, so it is delivered - and
audited - later.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..envelope.codec import decode
from ..envelope.model import Envelope, new_envelope
from ..errors import ConfigError, PrismError

#: Lowest first (app/envelope/validation.py CLASSIFICATIONS).
LEVELS = ("public", "internal", "confidential", "restricted")
RANK = {name: i for i, name in enumerate(LEVELS)}
#: Deliveries of these classifications are audited.
AUDITED = frozenset({"confidential", "restricted"})
#: What a subscription may read when it declares nothing: everything but classified data, which
#: needs an explicit clearance and a principal to audit.
DEFAULT_CLEARANCE = "internal"
#: An envelope without a classification is judged as this: not public, so a `public` subscriber
#: (a dashboard, an external feed) never receives data nobody labelled.
UNCLASSIFIED_AS = "internal"
DEFAULT_AUDIT_TOPIC = "prism.audit"
#: The audit record's own classification: it names principals and message ids, not data.
AUDIT_RECORD_CLASSIFICATION = "internal"
#: Withheld messages are logged the first time and then once per this many.
WITHHELD_LOG_EVERY = 100
AUDIT_EVENT = "classified_delivery"

_PRINCIPAL = re.compile(r"^[!-~]{1,256}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def classification_of(env: Envelope) -> str:
    """The classification a subscriber is judged against: the envelope's own field. An empty
    one reads as `UNCLASSIFIED_AS`, an unknown word as `restricted` (fail closed)."""
    header = env.header
    value = header.security.data_classification if header.HasField("security") else ""
    if not value:
        return UNCLASSIFIED_AS
    return value if value in RANK else "restricted"


@dataclass(frozen=True, slots=True)
class Clearance:
    """What one subscription may receive, and who it is for the audit trail."""

    level: str = DEFAULT_CLEARANCE
    principal: str | None = None
    audit_topic: str = DEFAULT_AUDIT_TOPIC

    @classmethod
    def of(cls, clearance: str | None, principal: str | None, audit_topic: str | None, topic: str) -> Clearance:
        """Validate `subscribe(clearance=, principal=, audit_topic=)`: every problem at once."""
        level = DEFAULT_CLEARANCE if clearance is None else clearance
        problems: list[str] = []
        if level not in RANK:
            problems.append(f"clearance={clearance!r} is not one of {list(LEVELS)}")
        elif level in AUDITED and not principal:
            problems.append(f"clearance={level!r} receives audited data and needs principal= (who reads it, "
                            "e.g. the service account 'svc-billing'), which every audit record names")
        if principal is not None and not _PRINCIPAL.match(principal):
            problems.append(f"principal={principal[:64]!r} must be 1-256 printable characters without spaces")
        at = DEFAULT_AUDIT_TOPIC if audit_topic is None else audit_topic
        if not _TOPIC.match(at):
            problems.append(f"audit_topic={at[:64]!r} is not a topic name (letters, digits, '.', '_', '-')")
        elif at == topic:
            problems.append(f"audit_topic={at!r} is the subscribed topic itself; audit records go to their own topic")
        if problems:
            raise ConfigError("invalid subscription clearance: " + "; ".join(problems), path="subscribe(clearance=)",
                              hint="e.g. subscribe(topic, group=..., clearance='confidential', principal='svc-billing')"
                                   " - docs/sdk.md, \"Classification and audit\"")
        return cls(level, principal, at)

    def allows(self, classification: str) -> bool:
        return RANK[classification] <= RANK[self.level]


def audit_record(env: Envelope, classification: str, *, principal: str, group: str, backend: str, ref: str,
                 now: float | None = None) -> dict[str, Any]:
    """The audit record of one delivery: who, what (by id), where, when. Never payload or tokens."""
    ts = time.time() if now is None else now
    md = env.header.metadata
    return {
        "event": AUDIT_EVENT,
        "principal": principal,
        "group": group,
        "message_id": md.message_id,
        "namespace": md.namespace,
        "topic": md.topic,
        "classification": classification,
        "time": datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "time_ms": int(ts * 1000),
        "backend": backend,
        "ref": ref,
    }


def audit_envelope(record: dict[str, Any], audit_topic: str, namespace: str) -> Envelope:
    """The envelope an audit record travels in (JSON payload, classified `internal`)."""
    return new_envelope(audit_topic, record, namespace=namespace, data_classification=AUDIT_RECORD_CLASSIFICATION,
                        correlation_id=str(record["message_id"]))


# --------------------------------------------------------------------------- reading (prism audit)


def parse_since(value: str, *, now: datetime | None = None) -> datetime:
    """`--since`: a duration back from now (`30m`, `12h`, `7d`) or an ISO 8601 time."""
    now = now or datetime.now(UTC)
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", value)
    if m:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
        return now - timedelta(seconds=int(m.group(1)) * unit)
    try:
        ts = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--since {value!r} is neither a duration nor an ISO 8601 time", path="--since",
                          hint="e.g. --since 24h, --since 7d or --since 2026-01-31T00:00:00Z") from None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class AuditFilter:
    topic: str | None = None
    principal: str | None = None
    namespace: str | None = None
    classification: str | None = None
    since: datetime | None = None

    def matches(self, rec: dict[str, Any]) -> bool:
        if self.topic is not None and rec.get("topic") != self.topic:
            return False
        if self.principal is not None and rec.get("principal") != self.principal:
            return False
        if self.namespace is not None and rec.get("namespace") != self.namespace:
            return False
        if self.classification is not None and rec.get("classification") != self.classification:
            return False
        return not (self.since is not None and int(rec.get("time_ms", 0)) < self.since.timestamp() * 1000)


def records_from(raws: Iterable[Any]) -> tuple[list[dict[str, Any]], int]:
    """(audit records, messages that were not audit records) from a backend's `sample()`."""
    out: list[dict[str, Any]] = []
    skipped = 0
    for raw in raws:
        try:
            env = raw.envelope if raw.envelope is not None else decode(raw.value)
            rec = env.payload_json()  # the bounded decoder: a hostile record is skipped, never a RecursionError
        except (PrismError, ValueError):
            skipped += 1
            continue
        if not isinstance(rec, dict) or rec.get("event") != AUDIT_EVENT:
            skipped += 1
            continue
        out.append(rec)
    return out, skipped


async def read_audit(url: str, *, audit_topic: str = DEFAULT_AUDIT_TOPIC, where: AuditFilter | None = None,
                     limit: int = 100_000) -> tuple[list[dict[str, Any]], int]:
    """The audit records at `url` matching `where`, oldest first, read without consuming
    anything (no consumer group), and the number of other messages on the topic."""
    from .backends import backend_for_url
    from .backends.postgres import PostgresBackend

    backend = backend_for_url(url)
    if isinstance(backend, PostgresBackend):
        backend.create = False  # reading never creates a schema or a table
    await backend.connect()
    try:
        raws = await backend.sample(audit_topic, limit)
    finally:
        await backend.close()
    records, skipped = records_from(raws)
    f = where or AuditFilter()
    return [r for r in records if f.matches(r)], skipped
