"""publish: dual-publish (draft layout -> `<topic>.v2`, reviewed -> `<topic>.v3`) and the
archive tap, re-signed with the worker's key.

Enrichment changed the envelope after the producer signed it, so the producer's
signature cannot hold on what Prism emits; the worker signs each output with its own key
(id recorded in `security.signature_key_id`) so every consumer can verify what it reads.
By default it signs a whole batch with ONE signature (scope `batch`: a Merkle tree whose
leaves are each message's `.v2` and `.v3` digests; each copy carries the signature, the
other copy's digest and its audit path), because an Ed25519 signature was the largest single
cost of a message here (~36 µs). So publishing is two steps: `prepare` per message (headers,
both copies' bytes and digests: everything that can fail for one message) and `finish` per
batch (one signature, final bytes). `outputs.signature_scope: pair` signs each message's two
copies once (scope `pair`), `v2` each copy on its own, for consumers that cannot verify the
newer scopes yet; with those, `prepare` already signs and `finish` only hands the records
over. A single-layout topology always uses v2.
Whatever scope the input was signed with, the publisher, classification, PII flag and
encryption metadata the pipeline established are covered on `.v2`, `.v3` and the archive
(docs/signing.md).
The token is stripped again here (defence in depth: even a topology without an
`authenticate` stage never forwards one). Input headers pass through, except credentials,
CloudEvents/content-type headers that describe the *input* value, not the envelope, and the
legacy headers that state a publisher or a classification (`publisher-id`, `X-Publisher-Id`,
`data-classification`, ...): they are claims, and the envelope already carries them as such
(`prism.claimed.*`), under the worker's signature, next to what was verified.
Also in defence in depth, a message that reaches `prepare` without the identity rule having
run (a chain built by hand, without `app.agents.identity.insert_identity_stage`) is settled
here; the worker's chain always runs it before the policy stage.

The `.v2` sunset (`outputs.migration`, app/sunset.py) is decided here, per message, from the
publisher's clock: from the deprecation date every `.v2` record gets the `prism-deprecation`
header (headers are not signed, so the signatures are the same bytes as without it); after the
cutoff the message is written to `.v3` alone, signed with scope v2 as in any single-layout
topology (there is no sibling copy to pair with). A phase change is logged once, when it happens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.agents.base import Message
from app.agents.identity import IdentityRule, settle
from app.bindings import kafka
from app.envelope import Layout
from app.formats.legacy import KAFKA_HEADERS, NATS_HEADERS
from app.security.jwt_auth import strip_token
from app.security.signing import MAX_TREE_SIZE, SCOPE_BATCH, SCOPE_PAIR, SCOPE_V2, SigningKey
from app.sunset import DEPRECATION_HEADER, Clock, Phase, Sunset, clock_from_env, iso
from app.topology import Topology

log = logging.getLogger("prism.worker")

#: Input headers that state who published or how the data is classified: never forwarded.
_CLAIM_FIELDS = frozenset({"publisher_id", "publisher_team", "data_classification"})
_CLAIM_HEADERS = frozenset(name for table in (KAFKA_HEADERS, NATS_HEADERS) for name, logical in table.items()
                           if logical in _CLAIM_FIELDS)
_DROP_HEADERS = frozenset({"authorization", "proxy-authorization", "prism-auth-token", "x-auth-token", "auth-token",
                           "cookie", "content-type"}) | _CLAIM_HEADERS
LAYOUT_OF = {"v2": Layout.DRAFT, "v3": Layout.REVIEWED}
#: On every output record: the input record it came from (`topic/partition/offset`), like
#: Connect's error context but for successes - provenance for the archive and for audits.
SOURCE_HEADER = "prism-source"


def _forwardable(lowered: str) -> bool:
    return lowered not in _DROP_HEADERS and not lowered.startswith("ce_")


@dataclass(slots=True)
class Emission:
    """One output record and its topic (not frozen, like `KafkaRecord`: two per message)."""

    topic: str
    record: kafka.KafkaRecord
    #: the record's size as aiokafka estimates it, set by `SizeFitter.fit` (app/worker/size_fit.py)
    #: when it checked the record against its topic's limit, so that the send's own up-front
    #: check (`send_batched`) does not estimate it a second time; None: not measured yet. The
    #: record is complete when it is measured (the batch is signed before the fit) and nothing
    #: changes it after.
    size: int | None = field(default=None, compare=False, repr=False)
    #: the record's headers as a Kafka record batch holds them (`prism_native.record_tail`),
    #: written by `SizeFitter.fit` when it measured the record with the compiled module, for the
    #: send to copy instead of reading the header objects again (app/worker/size_fit.py); None:
    #: not written (no module, or not fitted yet).
    tail: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)  # not frozen: one per message, like Emission
class Prepared:
    """A message's outputs before the batch is signed (`Publisher.prepare`): the final
    emissions already (scopes v2 and pair sign per message), or the pending records that
    `Publisher.finish` completes with the batch's signature."""

    topics: tuple[str, ...]
    emissions: list[Emission] | None = None
    pending: kafka.PendingRecords | None = None
    #: which of `topics` is the reviewed copy (the archive tap reuses it); None: there is none
    reviewed_at: int | None = None


class Publisher:
    def __init__(self, topology: Topology, *, worker_key: SigningKey | None, clock: Clock | None = None) -> None:
        self.layouts = [(suffix, LAYOUT_OF[suffix]) for suffix in topology.outputs.layouts]
        self._layouts = tuple(layout for _, layout in self.layouts)
        self.sign_with = worker_key if topology.outputs.sign else None
        both = set(self._layouts) == {Layout.DRAFT, Layout.REVIEWED}
        wanted = topology.outputs.signature_scope
        self.scope = (SCOPE_BATCH if both and wanted == "batch" else SCOPE_PAIR if both and wanted == "pair"
                      else SCOPE_V2)
        self.archive_topic = topology.archive.topic if topology.archive.enabled else None  # None: reads .v3
        #: Which record the archive tap reuses: the (last) reviewed one, as the loop once found it.
        self._reviewed_at = max((i for i, lay in enumerate(self._layouts) if lay is Layout.REVIEWED), default=None)
        self._topics: dict[str, tuple[str, ...]] = {}
        #: the identity rule for messages that reach `prepare` unsettled (module docs); without
        #: the keyring's key bindings, so a key-signed message is treated as unverified there
        self._identity = IdentityRule.of(topology, None)
        #: the `.v2` sunset (None: no `outputs.migration`); its clock decides the phase per message
        mig = topology.outputs.migration
        self.sunset = (Sunset(mig.deprecation_date, mig.cutoff_date, clock or clock_from_env())
                       if mig is not None else None)
        self._draft_at = next((i for i, lay in enumerate(self._layouts) if lay is Layout.DRAFT), None)
        self._v3_topics: dict[str, tuple[str, ...]] = {}
        self._deprecation: dict[str, tuple[str, bytes]] = {}
        self.phase: Phase | None = None
        if self.sunset is not None:
            self._enter(self.sunset.phase(), at_start=True)

    def _enter(self, phase: Phase, *, at_start: bool = False) -> None:
        """Log the sunset phase at start-up and once whenever it changes (never per message)."""
        self.phase = phase
        sun = self.sunset
        assert sun is not None
        dep, cut = iso(sun.deprecation), iso(sun.cutoff)
        fields = {"event": "v2_sunset", "phase": str(phase), "deprecation_date": dep, "cutoff_date": cut}
        when = "at start-up" if at_start else "now"
        if phase is Phase.STOPPED:
            log.warning("the .v2 cutoff %s has passed (outputs.migration): this worker writes .v3 only, %s; .v2 "
                        "consumers must read .v3 (prism migrate status lists who still reads .v2)", cut, when,
                        extra=fields)
        elif phase is Phase.DEPRECATED:
            log.warning(".v2 outputs are deprecated since %s (outputs.migration): every .v2 record carries the %s "
                        "header, and this worker stops writing .v2 at the cutoff %s", dep, DEPRECATION_HEADER, cut,
                        extra=fields)
        else:
            log.info(".v2 outputs are deprecated from %s and stop at %s (outputs.migration)", dep, cut, extra=fields)

    def _current_phase(self) -> Phase | None:
        sun = self.sunset
        if sun is None:
            return None
        phase = sun.phase()
        if phase is not self.phase:
            self._enter(phase)
        return phase

    def migration_status(self) -> dict[str, object] | None:
        """The sunset's state for `/connectors/{name}/status` (None without `outputs.migration`)."""
        return None if self.sunset is None else self.sunset.status()

    def _deprecation_header(self, topic: str) -> tuple[str, bytes]:
        hdr = self._deprecation.get(topic)
        if hdr is None:
            assert self.sunset is not None
            hdr = self._deprecation[topic] = (DEPRECATION_HEADER, self.sunset.header_value(f"{topic}.v3"))
        return hdr

    def _output_topics(self, topic: str) -> tuple[str, ...]:
        """`<topic>.<suffix>` per layout, built once per input topic rather than per message."""
        names = self._topics.get(topic)
        if names is None:
            names = self._topics[topic] = tuple(f"{topic}.{suffix}" for suffix, _ in self.layouts)
        return names

    def emissions(self, msg: Message) -> list[Emission]:
        """One message's emissions on its own (a batch of one): `finish([prepare(msg)])[0]`."""
        return self.finish([self.prepare(msg)])[0]

    def prepare(self, msg: Message) -> Prepared:
        """Everything of publishing `msg` but the batch signature: strip the token, headers,
        both copies encoded and (scope batch) hashed. Raises for this message alone, so the
        caller can send it to the DLQ and keep the rest of the batch."""
        env = msg.env
        strip_token(env)
        if not msg.settled:
            settle(msg, self._identity)
        forwarded = [(k, v) for k, v in kafka.passthrough_headers(msg.headers)
                     if v is not None and _forwardable(k.lower())] if msg.headers else []
        source = (SOURCE_HEADER, f"{msg.topic}/{msg.partition}/{msg.offset}".encode())
        # ours, after `prism-source` (an input's `prism-*` headers were dropped above, so a
        # producer cannot forge them): what a stage added, e.g. enrich's prism-schema-validation
        added = (source, *msg.out_headers) if msg.out_headers else (source,)
        phase = self._current_phase()
        if phase is Phase.STOPPED:  # after the .v2 cutoff: .v3 alone, scope v2 (nothing to pair with)
            topics = self._v3_topics.get(msg.topic) or self._v3_topics.setdefault(msg.topic, (f"{msg.topic}.v3",))
            records = kafka.encode_layouts(env, (Layout.REVIEWED,), key=msg.key, headers=forwarded,
                                           sign_with=self.sign_with, scope=SCOPE_V2)
            records[0].headers.extend(added)
            return Prepared(topics, emissions=self._emissions(topics, records, records[0]), reviewed_at=0)
        topics = self._output_topics(msg.topic)
        deprecated = phase is Phase.DEPRECATED and self._draft_at is not None
        if self.scope == SCOPE_BATCH and self.sign_with is not None:
            pending = kafka.prepare_batch_records(env, self._layouts, self.sign_with, key=msg.key, headers=forwarded)
            for rec in pending.records:
                rec.headers.extend(added)  # the same lists end up in the signed records
            if deprecated:
                pending.records[self._draft_at].headers.append(self._deprecation_header(msg.topic))  # type: ignore[index]
            return Prepared(topics, pending=pending, reviewed_at=self._reviewed_at)
        records = kafka.encode_layouts(env, self._layouts, key=msg.key, headers=forwarded, sign_with=self.sign_with,
                                       scope=self.scope)
        for rec in records:
            rec.headers.extend(added)
        if deprecated:
            records[self._draft_at].headers.append(self._deprecation_header(msg.topic))  # type: ignore[index]
        reviewed = records[self._reviewed_at] if self._reviewed_at is not None else None
        if self.archive_topic is not None and reviewed is None:
            reviewed = kafka.encode(env, Layout.REVIEWED, key=msg.key, sign_with=self.sign_with, scope=self.scope)
            reviewed.headers.extend(added)
        return Prepared(topics, emissions=self._emissions(topics, records, reviewed), reviewed_at=self._reviewed_at)

    def finish(self, prepared: Sequence[Prepared]) -> list[list[Emission]]:
        """The batch's emissions, per prepared message in order. With scope batch, ONE
        signature covers every pending message (`kafka.finish_batch_records`); a failure here
        concerns the whole batch (the key), not one message."""
        pending = [p.pending for p in prepared if p.pending is not None]
        done: list[list[kafka.KafkaRecord]] = []
        if pending and self.sign_with is not None:
            # one tree per MAX_TREE_SIZE messages (a repaired hole can make a batch that long)
            for at in range(0, len(pending), MAX_TREE_SIZE):
                done += kafka.finish_batch_records(pending[at:at + MAX_TREE_SIZE], self.sign_with)
        signed = iter(done)
        out: list[list[Emission]] = []
        for p in prepared:
            if p.emissions is not None:
                out.append(p.emissions)
            else:
                records = next(signed)
                reviewed = records[p.reviewed_at] if p.reviewed_at is not None else None
                out.append(self._emissions(p.topics, records, reviewed))
        return out

    def _emissions(self, topics: tuple[str, ...], records: list[kafka.KafkaRecord],
                   reviewed: kafka.KafkaRecord | None) -> list[Emission]:
        out = [Emission(topic, rec) for topic, rec in zip(topics, records, strict=True)]
        if self.archive_topic is not None:
            assert reviewed is not None
            out.append(Emission(self.archive_topic, reviewed))
        return out
