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
audited - later. A refused read - any message withheld from a subscription below its
classification: `internal` data refused to a `public` subscriber as much as `restricted` data
refused to an `internal` one - writes a `classified_refused` record the same way (before the
message is settled), not only a sampled log line.

Refusals cannot be used to flood the audit topic. Whoever can publish to a topic can make every
one of its messages a refusal for some subscriber (label them above its clearance); one signed
record per refused message would turn each tiny hostile message into a ~600-byte record and one
publish round trip on the subscriber's path. So the refusals met while a subscription works
through one fetched batch are held (not settled) and written as **one** record: a single refusal
keeps the one-message form, several become `{"event": "classified_refused", "count": N,
"messages": [[message_id, classification, ref], ...]}` (a fourth item, the namespace, where it
is not the record's) - every refused message is still named, nothing is sampled away. A record
holds at most `REFUSALS_PER_RECORD` messages (and ~48 KiB), so the audit topic receives at most
one record per fetch or per `REFUSALS_PER_RECORD` refusals, whichever comes first, and ~60
bytes per refused message: a flood costs the audit topic less than it cost the attacker to send
(every envelope is larger than that; measured in tests/sdk/test_clearance.py). The held messages are
settled only after their record is written; when the write fails every one of them is nacked.

Who wrote a record. Anyone who can write the audit topic could write a record saying that
`svc-ceo` read a restricted message, so every audit record is signed with the delivering
client's signing key (`PrismClient(signing_key=)`, the existing envelope signature, scope v2:
the whole record is covered), and a subscription with an audited clearance refuses to start
without one. `prism audit --keyring FILE` verifies each record against the signing keyring and
the key's owner: the key must verify the record *and* be bound to the record's principal
(`publisher_id` in the keyring), so one service's key cannot vouch for another's reads. A record
that fails is shown, marked with why, and makes the command exit 1 - never listed like a real one.
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
from ..envelope.validation import SanityPolicy, text_problem
from ..errors import ConfigError, PrismError, TopicNotFoundError

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
#: The longest message id kept as an audit envelope's correlation id (the worker's id limit).
_MAX_ID_LENGTH = SanityPolicy().max_id_length
DEFAULT_AUDIT_TOPIC = "prism.audit"
#: The audit record's own classification: it names principals and message ids, not data.
AUDIT_RECORD_CLASSIFICATION = "internal"
#: Withheld messages are logged the first time and then once per this many.
WITHHELD_LOG_EVERY = 100
AUDIT_EVENT = "classified_delivery"
#: A classified message withheld from a subscription below its clearance.
REFUSAL_EVENT = "classified_refused"
AUDIT_EVENTS = frozenset({AUDIT_EVENT, REFUSAL_EVENT})
#: Refusals one record names at most (module docs: bounded so a flood cannot amplify).
REFUSALS_PER_RECORD = 256
#: ... and about this many bytes of them (the reader refuses records over 64 KiB).
REFUSAL_RECORD_BYTES = 48 * 1024

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
    def of(cls, clearance: str | None, principal: str | None, audit_topic: str | None, topic: str, *,
           signed: bool = False) -> Clearance:
        """Validate `subscribe(clearance=, principal=, audit_topic=)`: every problem at once.
        `signed`: whether the client has a signing key (audit records are signed with it)."""
        level = DEFAULT_CLEARANCE if clearance is None else clearance
        problems: list[str] = []
        if level not in RANK:
            problems.append(f"clearance={clearance!r} is not one of {list(LEVELS)}")
        elif level in AUDITED and not principal:
            problems.append(f"clearance={level!r} receives audited data and needs principal= (who reads it, "
                            "e.g. the service account 'svc-billing'), which every audit record names")
        if level in AUDITED and not signed:
            problems.append(f"clearance={level!r} writes audit records, which are signed with the client's key: "
                            "create the client with PrismClient(..., signing_key=KEY), KEY bound to the principal "
                            "(publisher_id) in the signing keyring `prism audit --keyring` verifies with")
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


def refusal_record(env: Envelope, classification: str, *, clearance: str, principal: str | None, group: str,
                   backend: str, ref: str, now: float | None = None) -> dict[str, Any]:
    """The audit record of a refused read: the message (by id) a subscription below its
    classification did not receive. The same fields as a delivery's, plus the clearance."""
    record = audit_record(env, classification, principal=principal or "", group=group, backend=backend, ref=ref,
                          now=now)
    record.update(event=REFUSAL_EVENT, clearance=clearance)
    if principal is None:
        record["principal"] = None
    return record


def refusal_entry(env: Envelope, classification: str, ref: str) -> dict[str, str]:
    """One refused message inside a record of several (`refusals_record`)."""
    md = env.header.metadata
    return {"message_id": md.message_id, "namespace": md.namespace, "classification": classification, "ref": ref}


def refusal_entry_bytes(entry: dict[str, str]) -> int:
    """At most what `entry` adds to a record's JSON (quotes and separators included)."""
    return sum(len(v) for v in entry.values()) + 12


def refusals_record(first: Envelope, entries: list[dict[str, str]], *, clearance: str, principal: str | None,
                    group: str, backend: str, now: float | None = None) -> dict[str, Any]:
    """The one audit record of several refused reads of one subscription (module docs): the
    fields of a single refusal (those of `first`; `classification` the highest refused), plus
    `count` and every refused message in `messages`."""
    top = max((e["classification"] for e in entries), key=lambda c: RANK.get(c, len(LEVELS)))
    record = refusal_record(first, top, clearance=clearance, principal=principal, group=group, backend=backend,
                            ref=entries[0]["ref"], now=now)
    ns = record["namespace"]
    record["count"] = len(entries)
    record["messages"] = [[e["message_id"], e["classification"], e["ref"]]
                          + ([e["namespace"]] if e["namespace"] != ns else []) for e in entries]
    return record


def refused_reads(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The refused reads one record stands for, each in the one-message form (a delivery
    record: none). A record of several (`messages`) gives one per message, each with the
    record's principal, group, clearance, topic and time; malformed entries are skipped."""
    if record.get("event") != REFUSAL_EVENT:
        return []
    messages = record.get("messages")
    if not isinstance(messages, list):
        return [record]
    base = {k: v for k, v in record.items() if k not in ("messages", "count")}
    out = []
    for m in messages:
        if isinstance(m, list) and len(m) in (3, 4) and all(isinstance(x, str) for x in m):
            out.append({**base, "message_id": m[0], "classification": m[1], "ref": m[2],
                        "namespace": m[3] if len(m) == 4 else str(record.get("namespace", ""))})
    return out


def audit_envelope(record: dict[str, Any], audit_topic: str, namespace: str) -> Envelope:
    """The envelope an audit record travels in (JSON payload, classified `internal`), its
    correlation id the message's id. An id the worker's metadata checks would refuse (only a
    producer outside Prism writes one: over 128 characters, a control character) is left out
    of the correlation id - the record itself still names it - so that the audit record is
    written whatever the audited message carries. The Go and Rust clients do the same."""
    message_id = str(record["message_id"])
    correlation = message_id if text_problem(message_id, _MAX_ID_LENGTH) is None else None
    return new_envelope(audit_topic, record, namespace=namespace, data_classification=AUDIT_RECORD_CLASSIFICATION,
                        correlation_id=correlation)


def audit_outgoing(record: dict[str, Any], audit_topic: str, namespace: str, layout: Any, signing_key: Any,
                   key: bytes | None) -> Any:
    """The one way an audit record is written: `record` in its envelope (`audit_envelope`),
    signed with `signing_key` (an `app.security.signing.SigningKey`; None: unsigned, which
    `prism audit --keyring` shows as unverified) when the backend publishes it. The SDK's
    subscriptions and the console's DLQ pages (app/console/clearance.py) both publish this."""
    from .backends.base import Outgoing

    return Outgoing(audit_topic, audit_envelope(record, audit_topic, namespace), layout, signing_key, key)


# --------------------------------------------------------------------------- reading (prism audit)


def parse_since(value: str, *, now: datetime | None = None) -> datetime:
    """`--since` of `prism audit` and `prism dlq list`: a duration back from now (`30s`, `30m`,
    `12h`, `7d`, `2w`) or an ISO 8601 time (no zone: UTC). One parser for both commands, so the
    two accept the same words. A duration reaching before year 1 is refused as a `ConfigError`
    rather than overflowing `timedelta` into a traceback."""
    now = now or datetime.now(UTC)
    hint = "e.g. --since 24h, --since 7d or --since 2026-01-31T00:00:00Z"
    m = re.fullmatch(r"\s*(\d{1,18})\s*([smhdw])\s*", value)
    if m:
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
        try:
            return now - timedelta(seconds=int(m.group(1)) * unit)
        except OverflowError:
            raise ConfigError(f"--since {value.strip()!r} reaches back before year 1", path="--since",
                              hint=hint) from None
    try:
        ts = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--since {value!r} is neither a duration nor an ISO 8601 time", path="--since",
                          hint=hint) from None
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
        if isinstance(rec.get("messages"), list):  # several refusals: matches when one of them does
            return any(self._matches_one(r) for r in refused_reads(rec))
        return self._matches_one(rec)

    def _matches_one(self, rec: dict[str, Any]) -> bool:
        if self.namespace is not None and rec.get("namespace") != self.namespace:
            return False
        if self.classification is not None and rec.get("classification") != self.classification:
            return False
        if self.since is None:
            return True
        when = rec.get("time_ms", 0)  # whoever can write the audit topic chooses it: a number or no match
        return isinstance(when, int | float) and not isinstance(when, bool) and when >= self.since.timestamp() * 1000


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit record as `prism audit` shows it: the record, and whether it can be trusted -
    `problem` empty when its signature verified with a key bound to its principal."""

    record: dict[str, Any]
    signed_by: str = ""
    problem: str = ""

    @property
    def verified(self) -> bool:
        return not self.problem


def check_entry(raw: Any, env: Envelope, record: dict[str, Any], keyring: Any) -> AuditEntry:
    """Verify one audit record's signature with `keyring` (an `app.security.signing.SigningKeyring`)
    and that the key belongs to the principal the record names (module docs)."""
    from ..security.signing import verify

    sec = env.security
    if sec is None or not sec.signature:
        return AuditEntry(record, problem="unsigned: anyone who can write the audit topic could have written it")
    kid = sec.signature_key_id or "(unnamed key)"
    if raw.envelope is not None and not raw.value:
        return AuditEntry(record, kid, "stored decoded, without the bytes its signature covers")
    try:
        verify(raw.value, keyring.keys_for(env.namespace))
    except PrismError as exc:
        return AuditEntry(record, kid, f"signature does not verify: [{exc.code}] {exc.message}")
    owner = keyring.publishers.get(kid)
    principal = record.get("principal")
    if owner is None:
        return AuditEntry(record, kid, f"signed by key {kid!r}, which the keyring binds to no principal "
                                       "(publisher_id): it cannot vouch for who read")
    if principal is not None and owner.publisher_id != principal:
        return AuditEntry(record, kid, f"signed by key {kid!r} of {owner.publisher_id!r}, but the record names "
                                       f"principal {str(principal)[:80]!r}")
    return AuditEntry(record, kid)


def _audit_payload(raw: Any) -> tuple[Envelope, dict[str, Any]] | None:
    """The envelope and record of one message of the audit topic, or None when it is not one."""
    from ..untrusted_json import loads_untrusted

    try:
        env = raw.envelope if raw.envelope is not None else decode(raw.value)
        rec = loads_untrusted(env.payload_bytes(), what="audit record", max_depth=4, max_bytes=64 * 1024)
    except (PrismError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("event") not in AUDIT_EVENTS:
        return None
    return env, rec


def records_from(raws: Iterable[Any]) -> tuple[list[dict[str, Any]], int]:
    """(audit records, messages that were not audit records) from a backend's `sample()`,
    unverified (tests and tools that check the records themselves; `prism audit` verifies)."""
    out: list[dict[str, Any]] = []
    skipped = 0
    for raw in raws:
        found = _audit_payload(raw)
        if found is None:
            skipped += 1
            continue
        out.append(found[1])
    return out, skipped


def entries_from(raws: Iterable[Any], keyring: Any) -> tuple[list[AuditEntry], int]:
    """(audit records with their verification, messages that were not audit records)."""
    out: list[AuditEntry] = []
    skipped = 0
    for raw in raws:
        found = _audit_payload(raw)
        if found is None:
            skipped += 1
            continue
        env, rec = found
        out.append(check_entry(raw, env, rec, keyring))
    return out, skipped


async def _sample(url: str, audit_topic: str, limit: int, *, must_exist: bool = False) -> list[Any]:
    """The one place the audit source is opened. With `must_exist` (`prism audit`), a topic that
    was never written is an `AuditTopicMissingError`, not an empty audit: `--audit-topic typo`
    reported "0 audited deliveries" and exit 0."""
    from .backends import backend_for_url
    from .backends.base import redact_url
    from .backends.postgres import PostgresBackend

    backend = backend_for_url(url)
    if isinstance(backend, PostgresBackend):
        backend.create = False  # reading never creates a schema or a table
    await backend.connect()
    try:
        raws = list(await backend.sample(audit_topic, limit))
        if not raws and must_exist and not await backend.topic_exists(audit_topic):
            raise TopicNotFoundError(
                f"the audit topic {audit_topic!r} does not exist at {redact_url(url)}", path="--audit-topic",
                hint=f"check the name (subscribers write to {DEFAULT_AUDIT_TOPIC!r} unless their subscribe() "
                     "audit_topic says otherwise) and --url; it appears with the first audited delivery")
        return raws
    finally:
        await backend.close()


async def read_audit(url: str, *, audit_topic: str = DEFAULT_AUDIT_TOPIC, where: AuditFilter | None = None,
                     limit: int = 100_000) -> tuple[list[dict[str, Any]], int]:
    """The audit records at `url` matching `where`, oldest first, read without consuming
    anything (no consumer group), and the number of other messages on the topic. Unverified:
    `read_audit_entries` checks who wrote each."""
    raws = await _sample(url, audit_topic, limit)
    records, skipped = records_from(raws)
    f = where or AuditFilter()
    return [r for r in records if f.matches(r)], skipped


async def read_audit_entries(url: str, keyring: Any, *, audit_topic: str = DEFAULT_AUDIT_TOPIC,
                             where: AuditFilter | None = None, limit: int = 100_000) -> tuple[list[AuditEntry], int]:
    """`read_audit`, each record verified with `keyring` (`prism audit`)."""
    raws = await _sample(url, audit_topic, limit, must_exist=True)
    entries, skipped = entries_from(raws, keyring)
    f = where or AuditFilter()
    return [e for e in entries if f.matches(e.record)], skipped
