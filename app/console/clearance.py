"""Classification clearance on the console's DLQ pages (docs/operations.md, Console, "Who may
read what").

Why: a DLQ record is the very message a pipeline failed on, payload and all. The SDK never hands
a subscriber a message above its clearance (app/sdk/audit.py); without the same rule here, any
console reader could read `restricted` data by looking at the DLQ. So each console user has a
clearance (`clearance:` next to `roles:` in the users file; `DEFAULT_CLEARANCE`, `internal`,
when absent - what a subscription without one may read), and a record labelled above it shows
its metadata (topic, partition, offset, reason, stage, classification) but not the data: not the
value, the key, the headers or the error text (an error message may quote a field).

The classification is the one of the decoded envelope in the record's value, never a header
(`classification_of`: empty reads as `internal`, an unknown word as `restricted`): a header
anyone on the path can rewrite must not lower it. A value that is not an envelope (raw JSON,
CloudEvents, LNMP - input the worker never wrapped) reads as `internal`, or higher when a header
whose name holds `classification` (`data-classification`, the legacy mapping's) says so - a
header can only raise it there, and an unknown word reads as `restricted` - or when the value
itself declares a level the normalize stage reads (a structured CloudEvent's
`dataclassification`, a Redis JSON message's `meta.data_classification`); a value that stage
cannot read and that names a classification anywhere reads as `restricted` (`_declared_in_value`). A copy the DLQ cut to
size (`prism.errors.value.truncated`) reads as `restricted`: what it was cut from cannot be
known (fail closed).

Every page view that withholds something writes one `classified_refused` audit record, in the
SDK's format and through the SDK's writer (`audit_outgoing`), signed with the console's key and
naming the console's principal (the key's owner, so `prism audit --keyring` verifies it), the
console user (`user`) and every withheld record (`messages`). One record per view - a list
page of `MAX_ROWS` records at most two (`REFUSALS_PER_RECORD` a record) - so reloading a page
in a loop adds one ~1 KB record per request the console answers, never one per record.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from app.envelope.codec import Layout, decode
from app.envelope.model import Envelope
from app.errors import PrismError
from app.sdk.audit import (
    DEFAULT_AUDIT_TOPIC,
    DEFAULT_CLEARANCE,
    RANK,
    REFUSAL_RECORD_BYTES,
    REFUSALS_PER_RECORD,
    audit_outgoing,
    classification_of,
    refusal_entry_bytes,
    refusal_record,
    refusals_record,
)
from app.security.http_auth import Principal

#: a DLQ copy cut to size (app/agents/dlq.py VALUE_TRUNCATED)
TRUNCATED_HEADER = "prism.errors.value.truncated"
#: who the console's audit records name when it has no signing key (the records are unsigned)
DEFAULT_AUDIT_PRINCIPAL = "prism-console"
#: the `group` of the console's audit records (a subscription's consumer group in the SDK's)
AUDIT_GROUP = "console"


def clearance_of(principal: Principal | None) -> str:
    """What ``principal`` may read on the console (module docs)."""
    level = principal.clearance if principal is not None else None
    return level if level in RANK else DEFAULT_CLEARANCE


def covers(clearance: str, classification: str) -> bool:
    return RANK[classification] <= RANK[clearance]


@dataclass(frozen=True, slots=True)
class Labelled:
    """A DLQ (or output) record's classification, and its envelope when the value is one."""

    classification: str
    envelope: Envelope | None


def label(rec: Any) -> Labelled:
    """The classification of ``rec`` (a Kafka record) as the module docs say - never raises."""
    value = bytes(rec.value or b"")
    try:
        env = decode(value)
    except PrismError:
        env = None
    except Exception:  # a codec bug must not make a record readable: judged as not decodable
        env = None
    if env is not None:
        try:
            return Labelled(classification_of(env), env)
        except Exception:
            return Labelled("restricted", None)
    headers = list(rec.headers or ())
    if any(k == TRUNCATED_HEADER for k, _ in headers):
        return Labelled("restricted", None)
    level = classification_of(Envelope())  # unlabelled: internal
    for k, v in headers:  # what the producer declared for a value the worker never wrapped: only raises
        if "classification" in str(k).lower():
            named = bytes(v or b"").decode("utf-8", errors="replace").strip().lower()
            found = named if named in RANK else "restricted"
            level = max(level, found, key=RANK.__getitem__)
    return Labelled(max(level, _declared_in_value(value, headers), key=RANK.__getitem__), None)


def _declared_in_value(value: bytes, headers: list[Any]) -> str:
    """The level a value the worker never wrapped declares in its own bytes - a structured
    CloudEvent's `dataclassification`, a Redis JSON message's `meta.data_classification` - read
    by the normalize stage's own reader (`app.formats.detect.normalize`), so the console labels
    it as the pipeline would have. A value that reader refuses (why it is in the DLQ, often)
    and that names a classification anywhere reads as `restricted`: what it declared cannot be
    read, so it is withheld (fail closed). Otherwise `internal`."""
    from app.formats.detect import normalize

    try:
        wrapped = normalize(value, headers, topic="console", namespace="console", strict=False, now_ms=1)
        return classification_of(wrapped.envelope)
    except Exception:  # a PrismError for malformed input; any other failure is judged the same
        return "restricted" if b"classification" in value.lower() else classification_of(Envelope())


@dataclass(frozen=True, slots=True)
class Withheld:
    """One record a page did not show: what the audit record names."""

    ref: str  # `<topic>/<partition>@<offset>`
    classification: str
    envelope: Envelope | None
    topic: str


class RefusalAudit:
    """Writes the console's `classified_refused` records to the audit topic (module docs),
    through the SDK's Kafka backend (the producer `prism` clients use), connected on first use."""

    def __init__(self, bootstrap: str | None, broker_settings: Any, *, signing_key: Any = None,
                 principal: str = DEFAULT_AUDIT_PRINCIPAL, audit_topic: str = DEFAULT_AUDIT_TOPIC,
                 namespace: str = "prism.console") -> None:
        self.bootstrap = bootstrap
        self.broker_settings = broker_settings
        self.signing_key = signing_key
        self.principal = principal
        self.audit_topic = audit_topic
        self.namespace = namespace
        self._backend: Any = None
        self._lock = asyncio.Lock()
        #: records written (tests and the log)
        self.written = 0

    async def _connected(self) -> Any:
        from app.sdk.backends.kafka import KafkaBackend

        async with self._lock:
            if self._backend is None:
                backend = KafkaBackend(f"kafka://{self.bootstrap}")
                if self.broker_settings is not None:  # the console's own broker credentials
                    backend._settings = self.broker_settings
                    backend._client_kwargs = self.broker_settings.aiokafka_kwargs()
                await backend.connect()
                self._backend = backend
            return self._backend

    async def close(self) -> None:
        if self._backend is not None:
            backend, self._backend = self._backend, None
            await backend.close()

    def records(self, user: str, clearance: str, withheld: list[Withheld], view: str) -> list[dict[str, Any]]:
        """The audit records of one page view: one, or one per `REFUSALS_PER_RECORD` withheld
        records (and ~`REFUSAL_RECORD_BYTES`), in the SDK's refusal format plus `user` and `view`."""
        from app.sdk.audit import refusal_entry

        chunks: list[list[tuple[Envelope, dict[str, str]]]] = [[]]
        size = 0
        for w in withheld:
            env = w.envelope
            if env is None:  # not an envelope: named by its place alone
                env = Envelope()
                env.header.metadata.topic = w.topic
            entry = refusal_entry(env, w.classification, w.ref)
            if chunks[-1] and (len(chunks[-1]) >= REFUSALS_PER_RECORD or size >= REFUSAL_RECORD_BYTES):
                chunks.append([])
                size = 0
            chunks[-1].append((env, entry))
            size += refusal_entry_bytes(entry)
        out = []
        for chunk in chunks:
            if not chunk:
                continue
            env0, entry0 = chunk[0]
            if len(chunk) == 1:
                record = refusal_record(env0, entry0["classification"], clearance=clearance, principal=self.principal,
                                        group=AUDIT_GROUP, backend="kafka", ref=entry0["ref"])
            else:
                record = refusals_record(env0, [e for _, e in chunk], clearance=clearance, principal=self.principal,
                                         group=AUDIT_GROUP, backend="kafka")
            record.update(user=user, view=view[:300])
            out.append(record)
        return out

    async def write(self, user: str, clearance: str, withheld: list[Withheld], view: str) -> None:
        """Publish the records of one page view; a failure raises (the page then says that the
        audit record could not be written, and shows nothing of the records)."""
        if not withheld:
            return
        if not self.bootstrap:
            raise PrismError("no Kafka broker configured for the console's audit records", path="--broker",
                             hint="start the console with --broker HOST:PORT (or PRISM_BROKER_URL)")
        backend = await self._connected()
        outs = [audit_outgoing(r, self.audit_topic, self.namespace, Layout.REVIEWED, self.signing_key,
                               str(r["message_id"] or r["ref"]).encode())
                for r in self.records(user, clearance, withheld, view)]
        await backend.publish(outs)
        self.written += len(outs)
