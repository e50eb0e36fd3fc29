"""The pipeline worker: one topology -> one Faust app whose agents run the stage chain.

Data flow per source topic (one agent each):

    source topic --BatchSource--> Chain(normalize ... enrich) --> Publisher --> .v2 / .v3 / archive
                                         \\--> any failure -------------------> <topic>.dlq

Why batches: Faust's per-event machinery costs more per message than several of Prism's
stages. The source topic is read beneath it (`app/worker/batch_source.py`): the conductor
appends fetched records to a list, one task takes up to `batch_size` of them, runs the
synchronous chain over each (the publisher prepares each message's copies), signs the batch's
outputs with one signature (`Publisher.finish`, scope batch: docs/signing.md) and writes all
outputs of the batch together; only then are the
messages acknowledged, so a crash never loses a message (at-least-once) and the dedup stage
turns redeliveries into "duplicate". Faust keeps the group, rebalances, tables, commits.

Faust routes table writes by the *current event*. Inside a batch there is no event, so the
batch sets a stand-in holding the message (`CurrentMessage`) before each message's writes.

Every record's size is checked before it is sent, against its topic's limit
(`app/worker/limits.py`): an input too large for any output is dead-lettered as `too_large`
before the chain runs, a message whose outputs would not fit is dead-lettered as `too_large`
instead of written, and a DLQ copy is cut down to what its topic accepts
(`app.agents.dlq.fit_dlq_record`). Writes that fail are retried with capped, jittered
exponential backoff; a write refused for good (size, authorization, invalid topic) is not
retried, and a message whose outputs still cannot be written goes to the DLQ (Kafka Connect's
DLQ does not cover the final writes; this one does). If even the DLQ cannot be written, the
worker says so (an ERROR line, `/readyz` 503 with the reason), stops fetching and keeps
retrying: blocking is the only behaviour that neither drops nor duplicates beyond
at-least-once, and it is never silent. On shutdown a batch whose writes have not finished
within `WRITE_DRAIN_S` (or are being retried) is abandoned unacknowledged and read again on
restart, so SIGTERM ends the worker in every state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import socket
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import faust
from faust.streams import _current_event  # see the module docstring: per-message table routing

from app.agents.authenticate import Authenticate
from app.agents.base import Message, Stage
from app.agents.chain import Chain, Outcome
from app.agents.dedup import Dedup
from app.agents.dlq import VALUE_REF, DlqRecord, fit_dlq_record
from app.agents.enrich import Enrich, SchemaInfo
from app.agents.identity import IdentityRule, insert_identity_stage, stated_publisher
from app.agents.normalize import Normalize
from app.agents.policy import Policy
from app.agents.publish import Emission, Prepared, Publisher
from app.agents.validate import Validate
from app.agents.verify_signature import VerifySignature
from app.broker.admin import BrokerSettings, RetentionCheck, check_retention, read_max_message_bytes
from app.errors import ConfigError, PrismError, SinkError, SizeLimitError
from app.observability.logging import install_redaction
from app.schema.pii import PiiValueFinder
from app.security.attestation import AttestationVerifier, Attester, trusted_keys
from app.security.producers import ProducerBindings, check_key_ids_known, keyring_scopes
from app.security.signing import ED25519, SigningKey, SigningKeyring, load_signing_keyring
from app.security.worker_encryption import WorkerEncryption, build_worker_encryption
from app.sinks.runner import register_sinks
from app.tables.counters import FaustTopicCounters
from app.tables.dedup import DedupWindow, FaustDedupWindow
from app.tables.sequence import FaustSequenceTracker
from app.topology import EnrichStage, Topology
from app.worker.batch_send import BatchTooLargeError, OutRecord, RefusedUpFront, is_size_refusal, send_batched
from app.worker.batch_source import BatchSource, CurrentMessage, ack_all, release_all
from app.worker.continuity import HoleFetcher, OffsetTracker
from app.worker.dlq_overflow import build_overflow
from app.worker.faust_app import make_app
from app.worker.group_topology import client_id_for, topology_digest
from app.worker.kafka_health import WriteWatch, leader_problems
from app.worker.limits import WriteLimits, check_room, max_request_from_env, measured_overhead, record_size
from app.worker.transactions import EXACTLY_ONCE, PartitionProducers, TransactionFailed, check_guarantee

if TYPE_CHECKING:
    from app.worker.observe import Observer

log = logging.getLogger("prism.worker")
LNMP_SEQUENCE_EXT = "lnmp.sequence"
#: messages run through the chain between two turns of the event loop
YIELD_EVERY = 100
#: Once shutdown began, how long a batch's writes may still take before the batch is abandoned
#: unacknowledged (read again on restart). Well inside the documented drain (docs/operations.md).
WRITE_DRAIN_S = 20.0
#: Below this many bytes (value + key + headers + slack) a record fits any sane limit without
#: the exact (slower) size computation.
_SLACK = 4096
#: How often the written topics' `max.message.bytes` are read again (and after every size refusal).
LIMITS_REFRESH_S = 60.0
#: exactly_once: attempts of one batch's transaction when the broker refuses a batch for its size
#: (each retry has fresh limits, a fresh producer epoch and one record per producer batch).
SIZE_RETRIES = 3


class _Abandoned(Exception):
    """The worker is stopping and this batch's writes did not finish: leave it unacknowledged."""


class _SizeRefused(Exception):
    """exactly_once: the broker refused one of the transaction's batches for its size."""


_is_size_error = is_size_refusal


def _is_permanent(err: BaseException) -> bool:
    """A write error that retrying cannot fix: the record's size, the topic's name or the
    worker's permission to write it."""
    from aiokafka.errors import InvalidTopicError, TopicAuthorizationFailedError

    return _is_size_error(err) or isinstance(err, InvalidTopicError | TopicAuthorizationFailedError)


@dataclass
class RunStats:
    """What the worker did, per outcome; the demo's summary and the tests read it."""

    read: int = 0
    emitted: int = 0
    written: Counter[str] = field(default_factory=Counter)  # per output topic
    publish_retries: int = 0
    sequence: Counter[str] = field(default_factory=Counter)
    #: source records the consumer skipped and the agent fetched itself (app/worker/continuity.py)
    holes_repaired: int = 0
    #: messages dead-lettered as `too_large` (input over the input limit or outputs over theirs)
    too_large: int = 0
    #: DLQ copies cut down to their topic's size limit
    dlq_truncated: int = 0
    #: batches abandoned unacknowledged at shutdown (read again on restart)
    abandoned_batches: int = 0
    #: writes sent again one record per batch after the broker refused a batch for its size
    batches_split: int = 0
    #: exactly_once transactions aborted for a size refusal and run again (split, fresh limits)
    size_retried_transactions: int = 0


def resolve_schema(settings: EnrichStage | None, base_dir: Path, *, validate: bool = False) -> SchemaInfo | None:
    """Resolve the namespace's schema once, at start-up (no per-message registry calls).
    `validate`: some namespace's validation mode is warn or strict, so the payload validator
    is compiled now (once per schema id) and a schema no validator exists for fails here."""

    if settings is None:
        return None
    ref = settings.schema_
    if ref is None:
        return SchemaInfo(pii_fields=tuple(settings.pii_fields)) if settings.pii_fields else None
    from app.schema.resolve import SchemaResolutionError, resolve_schema_config  # heavy: only when configured

    cfg: dict[str, Any] = {"registry_type": ref.registry_type, "version": ref.version}
    if ref.url:
        cfg["url"] = ref.url
    if ref.path:
        cfg["path"] = str(base_dir / ref.path) if ref.registry_type == "file" else ref.path
    if ref.subject:
        cfg["subject"] = ref.subject
    if ref.message:
        cfg["message"] = ref.message
    if ref.repository:  # git: a local path is relative to the topology file, like `file` paths
        as_given = ref.repository.startswith("file://") or Path(ref.repository).is_absolute()
        cfg["repository"] = ref.repository if as_given else str((base_dir / ref.repository).resolve())
    if ref.ref:
        cfg["ref"] = ref.ref
    try:
        r = resolve_schema_config(cfg)
    except (SchemaResolutionError, OSError, ValueError) as exc:
        raise ConfigError(f"cannot resolve the namespace schema: {exc}", path="stages.enrich.schema",
                          hint="check the registry URL/subject or the schema file path") from exc
    ctx = r.schema_context()
    checker = None
    if ref.validate_payloads:
        from app.schema.payload_check import build_checker

        try:
            checker = build_checker(r)
        except Exception as exc:
            raise ConfigError(f"cannot build the payload validator: {exc}", path="stages.enrich.schema",
                              hint="validate_payloads needs a protobuf, JSON Schema or Avro schema") from exc
    validator = None
    if validate:
        from app.schema.payload_check import validator_for

        try:
            validator = validator_for(r)
        except Exception as exc:
            raise ConfigError(f"cannot build the payload validator: {exc}", path="validation",
                              hint="validation needs a protobuf, JSON Schema or Avro schema") from exc
    return SchemaInfo(url=ctx["schema_url"], version=ctx["schema_version"], format=ctx["schema_format"],
                      hash=ctx["schema_hash"], name=ctx["schema_name"], compatibility=ctx["compatibility_mode"],
                      pii_fields=tuple(r.pii_fields) + tuple(settings.pii_fields), resolved=r, checker=checker,
                      validator=validator)


def pii_finder(schema: SchemaInfo | None) -> PiiValueFinder | None:
    """What finds the schema's PII field values in a failed message (app/schema/pii.py)."""
    if schema is None or not schema.pii_fields:
        return None
    r = schema.resolved
    return PiiValueFinder(schema.pii_fields, schema_format=r.format.value if r is not None else "",
                          schema_text=r.schema_text if r is not None else "", message_name=r.name if r is not None else "",
                          imports=r.imports if r is not None else None)


def build_stages(topology: Topology, *, keyring: SigningKeyring | None, schema: SchemaInfo | None,
                 dedup_window: Callable[[float], DedupWindow],
                 attestations: AttestationVerifier | None = None,
                 encryption: WorkerEncryption | None = None) -> list[Stage]:
    """The topology's stage chain, in order. `dedup_window(window_s)` supplies the dedup state:
    a RocksDB-backed Faust table in the worker, a plain dict-backed window in broker-free
    benchmarks and tests - the one thing that differs between them."""
    t = topology
    if encryption is None and t.encryption is not None:  # callers without a PipelineApp (bench, tests)
        encryption = build_worker_encryption(t)
    producers = ProducerBindings.from_topology(t)
    if producers is not None and keyring is not None:
        check_key_ids_known(producers, keyring.verify_all.keys, keyring_scopes(keyring), t)
    stages: list[Stage] = []
    for spec in t.stages:
        s = spec.settings
        if spec.name == "normalize":
            stages.append(Normalize(s, namespaces={x.topic: x.namespace or t.namespace for x in t.sources},
                                    formats={x.topic: x.format for x in t.sources},
                                    accepted_topics=t.accepted_topics(),
                                    lnmp={x.topic: x.lnmp for x in t.sources if x.lnmp is not None}))
        elif spec.name == "validate":
            stages.append(Validate(s))
        elif spec.name == "authenticate":
            stages.append(Authenticate(s, jwks_path=str(t.resolve(s.jwks)), producers=producers,
                                       attestations=attestations))
        elif spec.name == "verify_signature":
            if keyring is None:
                raise ConfigError("verify_signature needs a keyring", path="stages.verify_signature.keyring",
                                  hint="set verify_signature.keyring (or outputs.keyring)")
            stages.append(VerifySignature(s, keyring=keyring, producers=producers))
        elif spec.name == "policy":
            stages.append(Policy(s, encryption))
        elif spec.name == "dedup":
            stages.append(Dedup(dedup_window(float(s.window_s))))
        elif spec.name == "enrich":
            default, per_namespace = t.validation_modes()
            stages.append(Enrich(trace=s.trace, schema=schema, validation=default, namespace_validation=per_namespace))
    # always: publisher fields state only a verified identity (app/agents/identity.py)
    return insert_identity_stage(stages, IdentityRule.of(t, keyring))


def attestation_setup(topology: Topology, keyring: SigningKeyring | None, worker_key: SigningKey | None,
                      ) -> tuple[Attester | None, AttestationVerifier | None]:
    """The DLQ attester (the worker's Ed25519 key) and the verifier of replayed attestations.
    Both None when attestations are off or the worker has no Ed25519 key: then a replayed
    authenticated record fails authentication, as it would without this feature."""
    cfg = topology.dlq.attestation
    if not cfg.enabled or topology.stage("authenticate") is None or keyring is None:
        return None, None
    key = worker_key or keyring.worker_key()
    attester = Attester(key) if key is not None and key.algorithm == ED25519 else None
    if attester is None and not cfg.trusted_keys:
        log.warning("DLQ attestations are off: the worker has no Ed25519 worker key, so authenticated messages "
                    "that reach the DLQ cannot be replayed with their identity (set worker_key in the keyring)")
        return None, None
    keys = trusted_keys(keyring, cfg.trusted_keys, default=attester.key.key_id if attester else None)
    return attester, AttestationVerifier(keys, max_age_s=cfg.max_age_s)


def _keyring_for(topology: Topology) -> SigningKeyring | None:
    path = topology.outputs.keyring
    vs = topology.stage("verify_signature")
    if path is None and vs is not None:
        path = vs.keyring
    return load_signing_keyring(topology.resolve(path)) if path else None


class PipelineApp:
    """Builds the Faust app for a topology. Construct, then run with `run_worker(p.app)` or
    `InProcessWorker(p.app)`."""

    def __init__(self, topology: Topology, *, bootstrap: str, data_dir: str | Path, app_id: str | None = None,
                 embedded: bool = False, web_port: int | None = None, batch_size: int = 500,
                 batch_within_s: float = 0.02, broker_settings: BrokerSettings | None = None,
                 on_batch: Callable[[RunStats], None] | None = None, archive_location: str | Path | None = None,
                 observe: Observer | None = None, archive_writer_id: str | None = None,
                 archive_shard: tuple[int, int] | None = None, processing_guarantee: str | None = None,
                 **faust_overrides: Any) -> None:
        self.topology = topology
        #: at_least_once (default) or exactly_once (app/worker/transactions.py); the argument wins
        #: over the topology's `processing_guarantee`
        self.guarantee = check_guarantee(processing_guarantee or topology.processing_guarantee)
        self.batch_size = batch_size
        self.batch_within_s = batch_within_s
        self.on_batch = on_batch
        self.stats = RunStats()
        parts = {s.partitions for s in topology.sources}
        if observe is not None and observe.management.ssl_context is not None:
            faust_overrides.setdefault("web_ssl_context", observe.management.ssl_context)  # HTTPS management API
        group = app_id or f"prism-{topology.name}"
        # the group client id carries the topology's digest: `prism run` refuses to join a group
        # whose live members run another topology (app/worker/group_topology.py)
        faust_overrides.setdefault("broker_client_id", client_id_for(group, topology_digest(topology)))
        self.app: faust.App = make_app(group, bootstrap, data_dir,
                                       web_port=web_port, partitions=max(parts), embedded=embedded,
                                       settings=broker_settings, processing_guarantee=self.guarantee,
                                       **faust_overrides)
        #: exactly_once: the transactional producers of the owned source partitions
        self.transactions: PartitionProducers | None = None
        if self.guarantee == EXACTLY_ONCE:
            from app.worker.transactions import install_read_committed

            install_read_committed(self.app)
            self.transactions = PartitionProducers(
                str(self.app.conf.id), bootstrap, sources=[s.topic for s in topology.sources],
                settings=broker_settings, max_request_size=int(self.app.conf.producer_max_request_size),
                max_batch_size=int(self.app.conf.producer_max_batch_size),
                transaction_timeout_ms=topology.transaction_timeout_ms)
            self.transactions.wrap_rebalance(self.app)
            self.app.on_before_shutdown.connect(self._close_transactions)
        # Every table write queues a changelog record; Faust stalls the stream whenever more
        # than 100 are pending (and logs "producer buffer full"). A batch writes one dedup
        # entry per message, so let a few batches' worth queue up.
        self.app.producer.buffer.max_messages = max(10_000, batch_size * 8)
        self.keyring = _keyring_for(topology)
        worker_key = None
        if topology.outputs.sign:
            if self.keyring is None:
                raise ConfigError("outputs.sign is true but no keyring is configured", path="outputs.keyring",
                                  hint="set outputs.keyring (or verify_signature.keyring), or outputs.sign: false")
            kid = topology.outputs.signing_key_id or self.keyring.worker_key_id
            if kid is None or kid not in self.keyring.signing:
                raise ConfigError(f"worker signing key {kid!r} is not in the keyring with private material",
                                  path="outputs.signing_key_id", hint="name a key with a secret/private key")
            worker_key = self.keyring.signing[kid]
        self.publisher = Publisher(topology, worker_key=worker_key)
        self.attester, self.attestations = attestation_setup(topology, self.keyring, worker_key)
        #: the topology's `encryption:` keys, checked now (before any broker is touched)
        self.encryption = build_worker_encryption(topology)
        default_mode, ns_modes = topology.validation_modes()
        self.schema = resolve_schema(topology.stage("enrich"), topology.base_dir,
                                     validate=default_mode != "off" or any(m != "off" for m in ns_modes.values()))
        self.pii_finder = pii_finder(self.schema)
        # Offset continuity (app/worker/continuity.py): a record the consumer skipped is
        # fetched and processed before anything after it is acknowledged.
        self.offsets = OffsetTracker()
        self.hole_fetcher = HoleFetcher(
            bootstrap, group_id=self.app.conf.id,
            auto_offset_reset=str(self.app.conf.consumer_auto_offset_reset),
            consumer_kwargs=broker_settings.aiokafka_kwargs() if broker_settings else None)
        self.app.on_partitions_revoked.connect(self._forget_partitions)
        self.app.on_partitions_assigned.connect(self._forget_partitions)
        self.app.on_before_shutdown.connect(self._stop_hole_fetcher)
        self.counters = FaustTopicCounters(self.app, "topic-counters", partitions=max(parts))
        self.sequences = FaustSequenceTracker(self.app, "sequences", partitions=max(parts))
        # Redaction is a property of the log handlers, not of callers (observability docs):
        # now for handlers that exist, and again once Faust has set up its own.
        install_redaction()
        self.app.task(_redact_after_startup)
        # Source topics hold producers' tokens: warn when the broker keeps them longer than the
        # topology allows (memo-031 Recommendation 5). Off the start-up path: never delays work.
        self.retention_checks: list[RetentionCheck] | None = None

        async def _check_retention() -> None:
            await self.check_source_retention(bootstrap, broker_settings)

        self.app.task(_check_retention)
        # Size limits (app/worker/limits.py): the configured producer limit now, the topics'
        # max.message.bytes once the broker answered; the first batch's writes wait for that.
        #: each source's output topics (its inputs' size limit follows from theirs)
        self.source_outputs: dict[str, tuple[str, ...]] = {
            s.topic: (*self.publisher._output_topics(s.topic),
                      *((self.publisher.archive_topic,) if self.publisher.archive_topic is not None else ()))
            for s in topology.sources}
        outputs = [t for outs in self.source_outputs.values() for t in outs]
        self.write_topics = tuple(dict.fromkeys(outputs + [s.topic + topology.dlq.topic_suffix
                                                           for s in topology.sources]))
        validate = topology.stage("validate")
        id_length = int(getattr(validate, "max_id_length", 128) or 128)
        self.limits = WriteLimits(int(self.app.conf.producer_max_request_size),
                                  output_topics=tuple(dict.fromkeys(outputs)),
                                  overhead=max(measured_overhead(self.publisher, s.topic, id_length=id_length)
                                               for s in topology.sources))
        self._limits_read = asyncio.Event()
        #: where a truncated DLQ copy's whole value is kept (`dlq.overflow`; checked now, before any broker)
        self.overflow = build_overflow(topology)
        #: why the worker cannot write its DLQ (None: it can); /readyz reports it
        self.blocked: str | None = None
        #: write attempts in flight and the last failure: /readyz while the cluster is in trouble
        self.write_watch = WriteWatch()
        self._abandoning = False

        async def _read_limits() -> None:
            await self.read_write_limits(bootstrap, broker_settings)
            while True:  # a limit learned from a refusal lasts until the broker's next answer
                await asyncio.sleep(LIMITS_REFRESH_S)
                with contextlib.suppress(Exception):
                    await self.refresh_write_limits()

        self._limits_source = (bootstrap, broker_settings)
        self.app.task(_read_limits)
        self.chains: dict[str, Chain] = {}
        self.sources: list[BatchSource] = []
        self.dedups: dict[int, Dedup] = {}  # id(chain) -> its dedup stage
        # id(chain) -> resolved once that chain's latest batch has handed its outputs to the producer
        self._handed_over: dict[int, asyncio.Future[None]] = {}
        # Connect-style sinks (`sinks:` in the topology): separate agents reading the outputs.
        self.sinks = register_sinks(self.app, topology, bootstrap=bootstrap, overflow=self.overflow,
                                    limit_for=lambda t: self.limits.limit_for(t)) if topology.sinks else []
        self.archive: Any = None
        if archive_location is not None and topology.archive.enabled:
            from app.worker.archive_service import ArchiveService  # pulls in pyarrow: only when archiving

            # a unique writer id per worker process (app/worker/archive_service.py), and with a
            # shard only that share of the archive topics' partitions
            self.archive = self.app.add_dependency(ArchiveService(
                bootstrap, topology.archive_source_topics(), str(archive_location), writer_id=archive_writer_id,
                partitions=topology.topics(), shard=archive_shard, roll_interval_s=topology.archive.roll_interval_s,
                consumer_kwargs=broker_settings.aiokafka_kwargs() if broker_settings else None))
        for source in topology.sources:
            chain = Chain(self._stages(source.topic, source.partitions),
                          dlq_topic_for=lambda t: t + topology.dlq.topic_suffix,
                          expired_to_dlq=bool(topology.stage("policy") and topology.stage("policy").expired == "dlq"),
                          attester=self.attester, pii=self.pii_finder)
            self.chains[source.topic] = chain
            for stage in chain.stages:
                if isinstance(stage, Dedup):
                    self.dedups[id(chain)] = stage
            topic = self.app.topic(source.topic, key_type=bytes, value_type=bytes, partitions=source.partitions,
                                   key_serializer="raw", value_serializer="raw")
            # Beneath Faust's per-event path (app/worker/batch_source.py): whole fetched batches.
            batches = BatchSource(self.app, topic, functools.partial(self._start_batch, chain),
                                  batch_size=batch_size, within=batch_within_s,
                                  split_partitions=self.transactions is not None)
            self.sources.append(batches)
            self.app.task(self._feeder(batches))
        # Observability (app/worker/observe.py): metrics, health, stage spans, management API.
        self.observe = observe
        if observe is not None:
            observe.attach(self)

    async def check_source_retention(self, bootstrap: str, settings: BrokerSettings | None) -> list[RetentionCheck]:
        """Compare the source topics' `retention.ms` with the topology's `sources[].retention`
        and log the result as structured records (`event: source_retention`)."""
        checks = await check_retention(bootstrap, self.topology.source_retention_limits(), settings=settings)
        for c in checks:
            fields = {"event": "source_retention", "topic": c.topic, "status": c.status,
                      "retention_ms": c.actual_ms, "limit_ms": c.limit_ms}
            if c.status == "too_long":
                kept = "forever" if c.actual_ms is not None and c.actual_ms < 0 else f"{c.actual_ms} ms"
                log.warning("source topic %s keeps records, and the producer tokens in them, for %s: longer than "
                            "the %d ms its topology allows (sources[].retention); fix: set the topic's retention.ms "
                            "to %d (kafka-configs --alter --add-config retention.ms=%d) or raise "
                            "sources[].retention", c.topic, kept, c.limit_ms, c.limit_ms, c.limit_ms, extra=fields)
            elif c.status in ("unknown", "unchecked"):
                log.info("could not check the retention of source topic %s (%s); the topology allows %d ms",
                         c.topic, c.detail, c.limit_ms, extra=fields)
            else:
                log.debug("source topic %s retention %d ms is within %d ms", c.topic, c.actual_ms, c.limit_ms,
                          extra=fields)
        self.retention_checks = checks
        return checks

    async def refresh_write_limits(self) -> WriteLimits:
        """Read the topics' `max.message.bytes` again (every `LIMITS_REFRESH_S`, and after the
        broker refused a write for its size): a limit changed at run time is followed both ways,
        and one refusal never lowers a limit for good. Logged only when a limit changed."""
        bootstrap, settings = self._limits_source
        values, why = await read_max_message_bytes(bootstrap, list(self.write_topics), settings=settings)
        before = {t: self.limits.limit_for(t) for t in self.write_topics}
        self.limits = WriteLimits(self.limits.max_request_size, output_topics=self.limits.output_topics,
                                  envelope_limit=self.limits.envelope_limit,
                                  overhead=self.limits.overhead).with_broker(values, why)
        if before != {t: self.limits.limit_for(t) for t in self.write_topics}:
            log.warning("%s (re-read from the broker)", self.limits.describe(self.write_topics),
                        extra={"event": "write_limits"})
        return self.limits

    def check_write_room(self, *, timeout: float = 20.0) -> WriteLimits:
        """Start-up: read the written topics' limits now and refuse to start, with one
        `error [no_room] ... fix:` line, when they leave an input no usable room
        (`app/worker/limits.py`, `check_room`). Run after the topics exist, before the worker."""
        from app.broker.preflight import run_isolated

        bootstrap, settings = self._limits_source
        values, why = run_isolated(read_max_message_bytes(bootstrap, list(self.write_topics), settings=settings),
                                   timeout=timeout)
        limits = self.limits.with_broker(values, why)
        check_room(limits, self.source_outputs)
        return limits

    async def _after_size_refusal(self) -> None:
        """The broker refused a write for its size: its limits may have changed; read them again
        (a failure to read keeps the known ones - the retry splits the batch either way)."""
        try:
            await self.refresh_write_limits()
        except Exception as exc:
            log.warning("could not re-read the topics' size limits after a size refusal: %r", exc)

    async def read_write_limits(self, bootstrap: str, settings: BrokerSettings | None) -> WriteLimits:
        """Read the written topics' `max.message.bytes` and log every limit in one line (a
        WARNING when a topic's limit is unknown and the configured producer limit stands in)."""
        try:
            values, why = await read_max_message_bytes(bootstrap, list(self.write_topics), settings=settings)
            self.limits = self.limits.with_broker(values, why)
        finally:
            self._limits_read.set()
        line = self.limits.describe(self.write_topics)
        try:
            check_room(self.limits, self.source_outputs)
        except PrismError as exc:  # the limits changed since start-up: stop rather than dead-letter everything
            log.error("error [%s] %s", exc.code, exc)
            await self.app.crash(exc)
            raise
        fields = {"event": "write_limits", "max_request_size": self.limits.max_request_size,
                  "input_limit": self.limits.input_limit,
                  "topics": {t: self.limits.limit_for(t) for t in self.write_topics}}
        # WARNING either way: the worker runs at `-l warn` by default, and an operator must see
        # the limits it enforces (issue: "the worker says at start-up what the limits are").
        log.warning("%s", line, extra=fields)
        return self.limits

    # -- construction ----------------------------------------------------------------------
    def _stages(self, topic: str, partitions: int) -> list[Stage]:
        return build_stages(self.topology, keyring=self.keyring, schema=self.schema, attestations=self.attestations,
                            encryption=self.encryption,
                            dedup_window=lambda window_s: FaustDedupWindow(
                                self.app, f"dedup-{topic}", window=window_s, partitions=partitions))

    # -- the batches -----------------------------------------------------------------------
    def _feeder(self, source: BatchSource) -> Callable[[], Awaitable[None]]:
        async def feed() -> None:
            try:
                await source.run()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a bug, not bad input (that goes to the DLQ): restart clean
                log.exception("processing %s failed; the worker stops and its unacknowledged messages are "
                              "read again on restart", source.topic.get_topic_name())
                await self.app.crash(exc)
                raise
        return feed

    async def _process_batch(self, chain: Chain, batch: list[Any]) -> None:
        """Run one batch start to finish (no overlap with another batch)."""
        await (await self._start_batch(chain, batch, None))

    async def _start_batch(self, chain: Chain, batch: list[Any], previous: Awaitable[None] | None,
                           ) -> Coroutine[Any, Any, None]:
        """Run one fetched batch (Faust `Message`s of one source topic) through the chain and
        return the coroutine that finishes it: writes every output, then - after `previous`,
        the batch before it, has finished - records the dedup ids, counts and acknowledges each
        message. `BatchSource` runs that coroutine as a task while the next batch goes through
        the chain, so the broker's round trip no longer leaves the worker idle."""
        producer = self.app.producer
        prepared: list[tuple[Message, Prepared | DlqRecord]] = []
        outcomes: Counter[tuple[str, int, str]] = Counter()
        stand_in_of: dict[tuple[str, int], CurrentMessage] = {}
        obs = self.observe
        observed: list[tuple[Message, Any]] | None = None if obs is None else []
        if obs is not None:
            obs.batch_started()
        dedup = self.dedups.get(id(chain))
        token = dedup.begin_batch() if dedup is not None else None
        offsets, repaired = self.offsets, list[Message]()
        active: CurrentMessage | None = None
        for i, m in enumerate(batch):
            if i and not i % YIELD_EVERY:
                # Let the loop breathe within a long batch: the previous batch's produce
                # requests go out, heartbeats and fetches run.
                await asyncio.sleep(0)
            # Faust's (non-windowed) tables route a write by the current event's topic and
            # partition only: one stand-in per partition of the batch, set when it changes.
            current = stand_in_of.get((m.topic, m.partition))
            if current is None:
                current = stand_in_of[(m.topic, m.partition)] = CurrentMessage(m)
            if current is not active:
                _current_event.set(weakref.ref(current))
                active = current
            if not offsets.advance(m.topic, m.partition, m.offset):
                # Records the consumer skipped come first, in order, routed like this one.
                try:
                    missing = await self._missing_before(m.topic, m.partition, m.offset)
                except _Abandoned:  # stopping while the broker does not answer: read again on restart
                    _current_event.set(None)
                    self._abandon(batch, dedup, token)
                    if obs is not None:
                        obs.batch_abandoned()
                    return _nothing()
                for j, msg in enumerate(missing):
                    if j and not j % YIELD_EVERY:
                        await asyncio.sleep(0)  # a hole can hold thousands of records
                    repaired.append(msg)
                    outcomes[(msg.topic, msg.partition, self._run_one(chain, msg, prepared, observed))] += 1
            msg = Message(topic=m.topic, partition=m.partition, offset=m.offset, value=m.value or b"", key=m.key,
                          headers=[(k, v) for k, v in (m.headers or []) if v is not None],
                          timestamp_ms=int(m.timestamp * 1000) if m.timestamp else None)
            outcomes[(m.topic, m.partition, self._run_one(chain, msg, prepared, observed))] += 1
        _current_event.set(None)
        # Phase 2: the batch's outputs signed at once (scope batch: one signature), in order.
        pending = self._sign_prepared(chain, prepared, outcomes, observed)
        if not self._limits_read.is_set():
            await self._limits_read.wait()  # the first batch only: the topics' limits are being read
        self._fit(chain, pending, outcomes, observed)
        if self.transactions is not None:
            return self._finish_in_transaction(chain, batch, repaired, pending, previous, outcomes, stand_in_of,
                                               observed, dedup, token)
        after = self._handed_over.get(id(chain))
        handed_over = self._handed_over[id(chain)] = asyncio.get_running_loop().create_future()

        async def finish() -> None:
            # Outputs go to the producer in batch order: after the previous batch's.
            try:
                try:
                    written = await self._write_all(chain, producer, pending, after=after, handed_over=handed_over)
                finally:
                    if not handed_over.done():
                        handed_over.set_result(None)
                if previous is not None:
                    await previous
                if self._abandoning:
                    raise _Abandoned  # an earlier batch was abandoned: acknowledging this one could skip it
            except _Abandoned:
                self._abandon(batch, dedup, token)
                if obs is not None:
                    obs.batch_abandoned()
                return
            if dedup is not None:
                # Each id goes to its message's partition explicitly (no current event needed).
                dedup.record_emitted_all(written)
                # The ids' changelog records, handed to the producer together (retried until it
                # takes them); Faust flushes the producer before committing, so they are durable
                # before the batch's offsets are.
                try:
                    await self._retrying(dedup.flush, "writing the dedup changelog", watch=self.write_watch)
                except _Abandoned:  # outputs written, ids not durable: unacknowledged, read again
                    self._abandon(batch, dedup, token)
                    if obs is not None:
                        obs.batch_abandoned()
                    return
                dedup.end_batch(token)
            self._count_batch(chain, batch, outcomes, stand_in_of, observed)
            # Acknowledged only now that their outputs are written, so commits never pass an
            # unwritten message; repaired records like the batch's own.
            consumer = self.app.consumer
            if repaired:
                ack_all(consumer, [_faust_message(rec) for rec in repaired])
            ack_all(consumer, batch)
            self._batch_accounted(len(batch) + len(repaired))

        return finish()

    def _count_batch(self, chain: Chain, batch: list[Any], outcomes: Counter[tuple[str, int, str]],
                     stand_in_of: dict[tuple[str, int], CurrentMessage],
                     observed: list[tuple[Message, Any]] | None) -> None:
        # One counter write per (topic, partition, outcome) per batch, not per message: every
        # table write is also a changelog record.
        for (topic, partition, outcome), n in outcomes.items():
            _current_event.set(weakref.ref(stand_in_of[(topic, partition)]))
            self.counters.incr(topic, outcome, n, partition=partition)
        _current_event.set(None)
        # Counted only now, when every message of the batch has its outcome written: a
        # reader that sees `read == n` can rely on all n being accounted for.
        if self.observe is not None and observed is not None:
            self.observe.batch_done(chain, batch[0].topic, observed)

    def _batch_accounted(self, n: int) -> None:
        self.stats.read += n
        if self.on_batch is not None:
            self.on_batch(self.stats)

    async def _finish_in_transaction(self, chain: Chain, batch: list[Any], repaired: list[Message],
                                     pending: list[tuple[Message, list[Emission] | DlqRecord]],
                                     previous: Awaitable[None] | None, outcomes: Counter[tuple[str, int, str]],
                                     stand_in_of: dict[tuple[str, int], CurrentMessage],
                                     observed: list[tuple[Message, Any]] | None, dedup: Dedup | None,
                                     token: int | None) -> None:
        """exactly_once (app/worker/transactions.py): the batch - one source partition's records -
        in one transaction of that partition's producer: outputs, DLQ records, the dedup ids'
        changelog records and the next input offset commit together or not at all. Only then do
        the ids enter the local dedup store and the messages stop being tracked (Faust never
        commits them itself). A partition's transactions run one after the other, in batch order;
        different partitions' run side by side (`BatchSource(split_partitions=True)`).

        A transaction that fails (fenced, timed out, refused) was aborted: the worker stops with
        one error line and the batch is read again from the committed offset by the restarted
        worker (or the partition's new owner)."""
        try:
            if previous is not None:
                await previous
            if self._abandoning or self._stopping():
                raise _Abandoned  # stopping: leave it to the next owner rather than start a transaction
        except _Abandoned:
            self._abandon(batch, dedup, token)
            if self.observe is not None:
                self.observe.batch_abandoned()
            return
        from aiokafka.structs import TopicPartition

        assert self.transactions is not None
        txn = self.transactions
        topic, partition = batch[0].topic, batch[0].partition
        next_offset = max(m.offset for m in [*batch, *repaired]) + 1
        window = getattr(dedup, "window", None) if dedup is not None else None
        staged: list[Any] = []
        staged_for: list[str] = []
        sent: list[Any] = []
        for attempt in range(1, SIZE_RETRIES + 1):
            producer = await txn.producer_for(topic, partition)

            async def body(producer: Any = producer, split: bool = attempt > 1) -> dict[Any, int]:
                written = await self._write_in_transaction(chain, producer, pending, split=split)
                if window is not None and hasattr(window, "stage_many"):
                    ids = [m.env.message_id for m in written]
                    if ids != staged_for:  # staged once per outcome: staging takes due tombstones off a queue
                        staged[:] = window.stage_many(((m.env.message_id, m.partition) for m in written),
                                                      time.time())
                        staged_for[:] = ids
                    sent[:] = await window.send_staged(producer, staged)
                return {TopicPartition(topic, partition): next_offset}

            try:
                await txn.run(producer, body, str(self.app.conf.id))
                break
            except TransactionFailed as exc:
                await txn.close([(topic, partition)])  # its next producer starts a fresh epoch: sequences from 0
                if isinstance(exc.__cause__, _SizeRefused) and attempt < SIZE_RETRIES and not self._stopping():
                    # The broker refused a batch for its size (a limit lowered at run time, or
                    # below what it reports): nothing of the transaction is visible. Read the
                    # limits again, fit the batch to them, and run it again one record per batch.
                    self.stats.size_retried_transactions += 1
                    log.warning("exactly_once: the broker refused a write of %s[%d]'s batch for its size (%s); the "
                                "transaction was aborted and runs again with the limits read anew, one record per "
                                "producer batch", topic, partition, exc.__cause__)
                    await self._after_size_refusal()
                    self._fit(chain, pending, outcomes, observed)
                    continue
                self._abandoning = True  # no later batch may commit past this one
                log.error("exactly_once: the transaction of a batch of %d message(s) from %s[%d] was aborted (%s); "
                          "the worker stops and the batch is read again from the last committed offset - nothing of "
                          "it is visible to read_committed consumers", len(batch) + len(repaired), topic, partition,
                          exc)
                raise
        if window is not None and staged:
            window.apply_staged(staged, sent)
        if dedup is not None:
            dedup.end_batch(token)
        self._count_batch(chain, batch, outcomes, stand_in_of, observed)
        release_all(self.app.consumer, batch)
        self._batch_accounted(len(batch) + len(repaired))

    async def _write_in_transaction(self, chain: Chain, producer: Any,
                                    pending: list[tuple[Message, list[Emission] | DlqRecord]], *,
                                    split: bool = False) -> list[Message]:
        """Send the batch's records into the open transaction; returns the messages whose outputs
        were sent. An output refused before it was queued (`_is_permanent`: its size, the topic)
        is replaced by its DLQ copy in the same transaction, as `_write_all` does. A batch the
        broker refused for its size raises `_SizeRefused` (the caller aborts and runs the batch
        again, split); any other failure makes the transaction uncommittable, so it raises."""
        direct = _StartedProducer(producer)
        emitted: list[Message] = []
        todo = pending
        for _ in range(2):  # the batch, then the DLQ copies of outputs refused up front
            results = await self._send_all(direct, [item for _, item in todo], split=split)
            refused = next((e for e in results if e is not None and not isinstance(e, RefusedUpFront)
                            and (isinstance(e, BatchTooLargeError) or _is_size_error(e))), None)
            if refused is not None:
                # delivered batches of this producer now have a sequence gap: nothing more can commit
                raise _SizeRefused(str(refused))
            retry: list[tuple[Message, list[Emission] | DlqRecord]] = []
            for (m, item), err in zip(todo, results, strict=True):
                if err is None:
                    self._count_written(item)
                    if isinstance(item, list):
                        emitted.append(m)
                elif isinstance(item, list) and _is_permanent(err):
                    if _is_size_error(err):
                        self.stats.too_large += 1
                    log.warning("outputs of %s/%s@%s refused (%s): dead-lettered in the same transaction",
                                m.topic, m.partition, m.offset, err)
                    res = chain.dlq_for_publish_failure(m, SinkError(f"writing outputs failed: {err}",
                                                                     hint="check the output topic"), late=True)
                    assert res.dlq is not None
                    retry.append((m, self._fit_dlq(res.dlq)))
                else:
                    raise SinkError(f"writing {m.topic}/{m.partition}@{m.offset} in the transaction failed: {err!r}")
            if not retry:
                return emitted
            todo = retry
        raise SinkError("DLQ copies refused in the transaction")

    async def _close_transactions(self, sender: Any, **kwargs: Any) -> None:
        """At shutdown, once the batches in flight are done (at most `WRITE_DRAIN_S`), stop the
        transactional producers; a transaction still open is aborted by the broker or fenced by
        the partition's next owner."""
        if self.transactions is None:
            return
        deadline = time.monotonic() + WRITE_DRAIN_S
        while self.app.consumer._unacked_messages and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.transactions.close_all()

    def _run_one(self, chain: Chain, msg: Message, pending: list[tuple[Message, Prepared | DlqRecord]],
                 observed: list[tuple[Message, Any]] | None) -> str:
        """Run the chain (and prepare the outputs: everything but the batch's signature) for
        one message; returns its outcome. A message whose encoding fails goes to the DLQ here,
        alone, as before; one larger than the input limit, without running the chain."""
        size = len(msg.value) + len(msg.key or b"")
        if msg.headers:
            size += sum(len(k) + len(v) for k, v in msg.headers)
        limit = self.limits.input_limit_for(self.source_outputs.get(msg.topic, self.limits.output_topics))
        if size > limit:
            self.stats.too_large += 1
            result = chain.dlq_for_publish_failure(msg, SizeLimitError(
                f"message is {size} bytes (key, value and headers), over the {limit}-byte input limit: its "
                f"outputs could not be written (limits: {self.limits.output_limit} bytes per output record)",
                hint="have the producer split the message, or raise max.message.bytes of the output topics "
                     "and the worker's producer_max_request_size"), stage="normalize")
        else:
            result = chain.run(msg)
        if result.outcome is Outcome.EMITTED:
            try:
                t0 = time.perf_counter_ns()
                prepared = self.publisher.prepare(msg)
                ns = time.perf_counter_ns() - t0
                chain.stats.stage_ns["publish"] += ns
                chain.stats.stage_calls["publish"] += 1
                if chain.latency_samples is not None:  # this message's own share (app/agents/chain.py)
                    chain.latency_samples.stages.append(("publish", ns))
                pending.append((msg, prepared))
            except Exception as exc:  # encoding/signing failed: DLQ, never crash
                result = chain.dlq_for_publish_failure(msg, exc)
            else:
                self._track_sequence(msg)
        if result.outcome is Outcome.DLQ:
            assert result.dlq is not None
            pending.append((msg, result.dlq))
        if observed is not None:
            observed.append((msg, result))
        return str(result.outcome)

    def _sign_prepared(self, chain: Chain, prepared: list[tuple[Message, Prepared | DlqRecord]],
                       outcomes: Counter[tuple[str, int, str]], observed: list[tuple[Message, Any]] | None,
                       ) -> list[tuple[Message, list[Emission] | DlqRecord]]:
        """The batch's prepared outputs made final by `Publisher.finish` (one signature for
        the batch with scope batch), each item in its place, so the output order is the input
        order. Timed as "publish" (its per-message share: `prepare` counted the calls).

        `finish` can only fail for the whole batch (the worker key itself), never for one
        message: then every message it was to sign goes to the DLQ, as a failed encoding would."""
        items = [item for _, item in prepared if isinstance(item, Prepared)]
        t0 = time.perf_counter_ns()
        try:
            done = iter(self.publisher.finish(items))
            failure: Exception | None = None
        except Exception as exc:  # signing failed: DLQ, never crash
            done, failure = iter(()), exc
        chain.stats.stage_ns["publish"] += time.perf_counter_ns() - t0
        out: list[tuple[Message, list[Emission] | DlqRecord]] = []
        for msg, item in prepared:
            if not isinstance(item, Prepared):
                out.append((msg, item))
            elif failure is None:
                out.append((msg, next(done)))
            else:
                result = chain.dlq_for_publish_failure(msg, failure)
                assert result.dlq is not None
                out.append((msg, result.dlq))
                outcomes[(msg.topic, msg.partition, str(Outcome.EMITTED))] -= 1
                outcomes[(msg.topic, msg.partition, str(Outcome.DLQ))] += 1
                if observed is not None:
                    observed[:] = [(m, result if m is msg else r) for m, r in observed]
        return out

    async def _missing_before(self, topic: str, partition: int, offset: int) -> list[Message]:
        """The source records between the last one processed on this partition and `offset`
        that the consumer never handed over (usually none). Retries until the broker answers:
        acknowledging past an unread record could lose it."""
        tracker = self.offsets
        if not tracker.known(topic, partition):
            start = await self._retrying(lambda: self.hole_fetcher.expected_start(topic, partition),
                                         f"reading the start offset of {topic}[{partition}]")
            if start is not None:
                tracker.start_at(topic, partition, start)
        hole = tracker.observe(topic, partition, offset)
        if hole is None:
            return []
        records = await self._retrying(lambda: self.hole_fetcher.fetch(hole), f"reading {hole}")
        if records:
            self.stats.holes_repaired += len(records)
            log.warning("the consumer skipped %d record(s) at %s; fetched and processed them before acknowledging "
                        "anything after them", len(records), hole)
        return [_message_from_record(r) for r in records]

    async def _retrying(self, call: Callable[[], Awaitable[Any]], what: str, *,
                        watch: WriteWatch | None = None) -> Any:
        """`call()` until it succeeds: blocking beats acknowledging blindly. Stop-aware: once the
        worker stops, the attempt in flight gets at most `WRITE_DRAIN_S` and no retry follows -
        `_Abandoned` is raised (the caller leaves its batch unacknowledged, read again on restart)
        after a line naming what was abandoned. Before, a broker gone at SIGTERM kept this loop,
        and the worker, alive until it was killed.

        `watch`: a write's attempts are reported there, so `/readyz` says "writes failing: ..."
        while this retries - a retry loop the readiness probe cannot see is a silent stall (the
        outputs' writes were watched, the dedup changelog flush was not)."""
        attempt = 1
        while True:
            try:
                token = watch.begin() if watch is not None else None
                try:
                    result = await self._stop_aware(call(), drain_s=WRITE_DRAIN_S)
                except _Abandoned:
                    if watch is not None:
                        watch.discard(token)
                    raise
                except Exception as exc:  # broker unreachable: block rather than acknowledge blindly
                    if watch is not None:
                        watch.end(token, exc)
                    attempt += 1
                    log.warning("%s failed (attempt %d: %r); retrying", what, attempt - 1, exc)
                    await self._pause_sleep(_backoff(attempt, self.topology.dlq.backoff_initial_ms,
                                                     self.topology.dlq.backoff_max_ms))
                else:
                    if watch is not None:
                        watch.end(token, None)
                    return result
            except _Abandoned:
                log.warning("shutdown: abandoned %s after %d attempt(s): the worker is stopping and the broker did not "
                            "answer; the batch is not acknowledged and is read again on restart", what, attempt,
                            extra={"event": "shutdown_abandoned"})
                raise

    async def _forget_partitions(self, sender: Any, partitions: Any = None, **kwargs: Any) -> None:
        # Revoked or (re)assigned: Faust seeks to the committed offset, expectations start afresh.
        self.offsets.forget(partitions or kwargs.get("revoked") or kwargs.get("assigned") or ())

    async def _stop_hole_fetcher(self, sender: Any, **kwargs: Any) -> None:
        await self.hole_fetcher.stop()

    def _track_sequence(self, msg: Message) -> None:
        raw = msg.env.extensions.get(LNMP_SEQUENCE_EXT)
        if raw is None or len(raw) != 8:
            return
        source = stated_publisher(msg.env) or msg.env.namespace  # an LNMP source is a claim, still its sequence
        verdict = self.sequences.observe(source, int.from_bytes(raw, "big"))
        self.stats.sequence[str(verdict.status)] += 1

    def _fit(self, chain: Chain, pending: list[tuple[Message, list[Emission] | DlqRecord]],
             outcomes: Counter[tuple[str, int, str]], observed: list[tuple[Message, Any]] | None) -> None:
        """Check every record of the batch against its topic's limit before anything is sent
        (`app/worker/limits.py`): a message with an output that would not fit goes to the DLQ as
        `too_large` instead, and every DLQ copy is cut down to what its topic accepts. In place.

        Records far below the limit (bytes + slack) skip the exact size computation."""
        limits = self.limits
        for i, (msg, item) in enumerate(pending):
            if isinstance(item, DlqRecord):
                pending[i] = (msg, self._fit_dlq(item))
                continue
            over: tuple[str, int, int] | None = None
            for e in item:
                rec = e.record
                limit = limits.limit_for(e.topic)
                rough = len(rec.value) + len(rec.key or b"") + _SLACK
                if rec.headers:
                    rough += sum(len(k) + len(v) for k, v in rec.headers)
                if rough <= limit:
                    continue
                size = record_size(rec.key, rec.value, rec.headers)
                if size > limit:
                    over = (e.topic, size, limit)
                    break
            if over is None:
                continue
            topic, size, limit = over
            self.stats.too_large += 1
            result = chain.dlq_for_publish_failure(msg, SizeLimitError(
                f"the output record for {topic} would be {size} bytes, over the topic's {limit}-byte limit "
                f"({limits.describe([topic])})",
                hint="have the producer send smaller messages, or raise the topic's max.message.bytes and the "
                     "worker's producer_max_request_size"))
            assert result.dlq is not None
            pending[i] = (msg, self._fit_dlq(result.dlq))
            outcomes[(msg.topic, msg.partition, str(Outcome.EMITTED))] -= 1
            outcomes[(msg.topic, msg.partition, str(Outcome.DLQ))] += 1
            if observed is not None:
                observed[:] = [(m, result if m is msg else r) for m, r in observed]

    def _fit_dlq(self, rec: DlqRecord) -> DlqRecord:
        fitted = fit_dlq_record(rec, self.limits.limit_for(rec.topic),
                                None if self.overflow is None else self.overflow.put)
        if fitted is not rec:
            self.stats.dlq_truncated += 1
            ref = next((v.decode() for k, v in fitted.headers if k == VALUE_REF), None)
            log.warning("the DLQ copy of %s/%s@%s (%s) is %d bytes, over the %d-byte limit of %s: written with its "
                        "value truncated to %d bytes (prism.errors.value.sha256 and .length describe the original%s)",
                        _header(rec, "topic"), _header(rec, "partition"), _header(rec, "offset"), rec.reason,
                        record_size(rec.key, rec.value, rec.headers), self.limits.limit_for(rec.topic), rec.topic,
                        len(fitted.value), f"; the whole value is at {ref}" if ref else "")
        return fitted

    def _abandon(self, batch: list[Any], dedup: Dedup | None, token: int | None) -> None:
        """Leave a batch unacknowledged at shutdown: it is read again on restart (at-least-once).
        Untracked so Faust's stop does not wait for it; every later batch is abandoned too, so
        no commit can pass it (Faust commits past a single unacknowledged offset)."""
        self._abandoning = True
        self.stats.abandoned_batches += 1
        unacked = self.app.consumer._unacked_messages
        for m in batch:
            unacked.discard(m)
        if dedup is not None:
            dedup.end_batch(token)
        log.warning("shutdown: abandoned a batch of %d message(s) whose writes had not finished; they are not "
                    "acknowledged and are read again on restart", len(batch))

    def _stopping(self) -> bool:
        return bool(self.app.should_stop)

    async def _stop_aware(self, aw: Awaitable[Any], *, drain_s: float) -> Any:
        """Await `aw`; once the worker is stopping, for at most `drain_s` more seconds, then
        raise `_Abandoned` (its writes are left to the producer; the batch is read again)."""
        task = asyncio.ensure_future(aw)
        while True:
            if self._stopping():
                done, _ = await asyncio.wait({task}, timeout=drain_s)
                if not done:
                    task.cancel()
                    raise _Abandoned
                return task.result()
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()

    async def _pause_sleep(self, seconds: float) -> None:
        """Sleep for a retry's backoff; raise `_Abandoned` as soon as the worker stops."""
        deadline = time.monotonic() + seconds
        while True:
            if self._stopping():
                raise _Abandoned
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.1))

    async def _set_blocked(self, reason: str | None) -> None:
        """Stop fetching and report not ready while the DLQ cannot be written (`reason`), or
        fetch again (None). Never silent: an ERROR line when it starts, a WARNING when it ends."""
        if (reason is None) == (self.blocked is None):
            self.blocked = reason if reason is not None else None
            return
        self.blocked = reason
        if reason is not None:
            log.error("the worker cannot write its DLQ: %s. It stops fetching and reports not ready (/readyz) "
                      "until the write succeeds; it keeps retrying. Fix the DLQ topic (size limit, ACL, "
                      "existence) or the broker", reason)
        else:
            log.warning("the DLQ is writable again; the worker fetches again")
        if self.observe is not None:
            self.observe.set_blocked(reason)
        paused_by_operator = self.observe is not None and self.topology.name in self.observe.paused
        if reason is None and paused_by_operator:
            return
        try:
            await self._set_fetching(paused=reason is not None)
        except Exception as exc:  # the consumer is stopping or not started: nothing to pause
            log.warning("could not %s fetching: %r", "pause" if reason else "resume", exc)

    async def _set_fetching(self, *, paused: bool) -> None:
        """aiokafka's own pause/resume of the source partitions, in the consumer thread (why not
        Faust's: app/worker/management.py, `set_fetching`)."""
        from aiokafka.structs import TopicPartition

        consumer = self.app.consumer
        sources = {s.topic for s in self.topology.sources}
        tps = [TopicPartition(tp.topic, tp.partition) for tp in consumer.assignment() if tp.topic in sources]

        async def apply() -> None:
            client = consumer._thread._ensure_consumer()
            if paused:
                client.pause(*tps)
            else:
                client.resume(*tps)

        await consumer._thread.call_thread(apply)

    async def _write_all(self, chain: Chain, producer: Any, pending: list[tuple[Message, list[Emission] | DlqRecord]],
                         *, after: asyncio.Future[None] | None = None,
                         handed_over: asyncio.Future[None] | None = None) -> list[Message]:
        """Write everything; returns the messages whose outputs (not DLQ copies) were written.

        `after`: the previous batch's hand-over; this batch's first attempt waits for it, so
        the records of consecutive batches reach each output partition in batch order (retries
        of a failed write may land after later batches' records, as Kafka producer retries can).
        `handed_over` is resolved once this batch's first attempt has handed everything over.

        Outputs refused for good (`_is_permanent`: size, authorization, topic) go to the DLQ at
        once, others after `dlq.max_attempts`. A DLQ copy the broker refuses for its size is cut
        down further (the broker's limit is lower than the configured one); a DLQ write that
        keeps failing blocks the worker loudly (`_set_blocked`). Raises `_Abandoned` when the
        worker stops while retrying, or its first attempt outlasts `WRITE_DRAIN_S`."""
        dlq_cfg = self.topology.dlq
        todo = pending
        attempt = 1
        split = False  # after a batch refused for its size: one record per producer batch
        emitted: list[Message] = []
        if after is not None:
            await self._stop_aware(after, drain_s=WRITE_DRAIN_S)
        while todo:
            watch = self.write_watch.begin()
            try:
                results = await self._stop_aware(self._send_all(producer, [item for _, item in todo], handed_over,
                                                                 split=split), drain_s=WRITE_DRAIN_S)
            except BaseException:
                self.write_watch.discard(watch)
                raise
            self.write_watch.end(watch, next((r for r in results if r is not None), None))
            handed_over = None
            failed = [(m, item, r) for (m, item), r in zip(todo, results, strict=True) if r is not None]
            for (m, item), r in zip(todo, results, strict=True):
                if r is None:
                    self._count_written(item)
                    if isinstance(item, list):
                        emitted.append(m)
            if not failed:
                if self.blocked is not None:
                    await self._set_blocked(None)
                return emitted
            if any(isinstance(err, BatchTooLargeError) or _is_size_error(err) for _, _, err in failed):
                await self._after_size_refusal()
            if any(isinstance(err, BatchTooLargeError) for _, _, err in failed) and not split:
                # A batch refused for its size is no verdict on its records (batch_send.py): from
                # now on one record per batch; when nothing else failed, without counting an
                # attempt against any of them.
                split = True
                self.stats.batches_split += 1
                log.warning("the broker refused a record batch for its size (%s); the failed item(s) are sent again, "
                            "one record per batch", next(e for _, _, e in failed if isinstance(e, BatchTooLargeError)))
                if all(isinstance(err, BatchTooLargeError) for _, _, err in failed):
                    todo = [(m, item) for m, item, _ in failed]
                    continue
            attempt += 1
            self.stats.publish_retries += len(failed)
            nxt: list[tuple[Message, list[Emission] | DlqRecord]] = []
            dlq_failures: list[str] = []
            for m, item, err in failed:
                m.attempts = attempt
                if isinstance(item, list) and (attempt > dlq_cfg.max_attempts or _is_permanent(err)):
                    log.warning("giving up on outputs of %s/%s@%s after %d attempt(s)%s: %s", m.topic, m.partition,
                                m.offset, attempt - 1, " (refused for good)" if _is_permanent(err) else "", err)
                    if _is_size_error(err):
                        self.stats.too_large += 1
                        cause: PrismError = SizeLimitError(f"the broker refused an output record: {err}",
                                                           hint="raise the topic's max.message.bytes or have the "
                                                                "producer send smaller messages")
                    else:
                        cause = SinkError(f"writing outputs failed: {err}", hint="check the broker / sink is reachable")
                    res = chain.dlq_for_publish_failure(m, cause, late=True)
                    assert res.dlq is not None
                    nxt.append((m, self._fit_dlq(res.dlq)))
                elif isinstance(item, DlqRecord):
                    if _is_size_error(err):
                        # Refused alone: the broker's limit is below this record, even after the
                        # re-read above (its message.max.bytes, or compression overhead). Fit it
                        # under its own size; the next re-read of the limits undoes this.
                        size = record_size(item.key, item.value, item.headers)
                        self.limits = self.limits.lowered(item.topic, size - 1)
                        log.warning("the broker refused a %d-byte DLQ record for %s (%s); until the limits are read "
                                    "again its limit is taken as %d bytes", size, item.topic, err,
                                    self.limits.limit_for(item.topic))
                        nxt.append((m, self._fit_dlq(item)))
                    else:
                        nxt.append((m, item))
                        if attempt > dlq_cfg.max_attempts or _is_permanent(err):
                            dlq_failures.append(f"{item.topic}: {err!r} ({attempt - 1} attempts)")
                else:
                    nxt.append((m, item))
            if dlq_failures and self.blocked is None:
                await self._set_blocked("; ".join(dlq_failures[:3]))
            await self._pause_sleep(_backoff(attempt, dlq_cfg.backoff_initial_ms, dlq_cfg.backoff_max_ms))
            todo = nxt
        return emitted

    async def _send_all(self, producer: Any, items: list[list[Emission] | DlqRecord],
                        handed_over: asyncio.Future[None] | None = None, *,
                        split: bool = False) -> list[BaseException | None]:
        """Send every item's records, in order, then await all their deliveries together;
        returns per item None (all its records written) or the error that failed it.

        One producer call per topic-partition and batch (`app/worker/batch_send.py`), through
        the aiokafka producer beneath Faust's: the same accumulator, so Faust's flush before
        each offset commit still covers these records. An item whose record is refused sends
        none of its later records, as before."""
        records: list[list[OutRecord]] = []
        for item in items:
            if isinstance(item, DlqRecord):
                records.append([(item.topic, item.key, item.value, _ts_ms(item.timestamp_ms), item.headers)])
            else:
                records.append([(e.topic, e.record.key, e.record.value, _ts_ms(e.record.timestamp_ms),
                                 e.record.headers) for e in item])
        return await send_batched(producer._ensure_producer(), records, handed_over=handed_over,
                                  limit_for=self.limits.limit_for, split=split)

    def _count_written(self, item: list[Emission] | DlqRecord) -> None:
        if isinstance(item, DlqRecord):
            self.stats.written[item.topic] += 1
        else:
            self.stats.emitted += 1
            for e in item:
                self.stats.written[e.topic] += 1

    # -- reporting -----------------------------------------------------------------------------
    def kafka_problem(self) -> str | None:
        """Why writes do not go through right now (None: they do), with the cause the producer's
        metadata names - a partition without a leader, a leader it cannot reach
        (app/worker/kafka_health.py)."""

        def explain() -> list[str]:
            producer = getattr(self.app.producer, "_producer", None)
            if producer is None:
                return []
            client = producer.client
            # the partitions with undelivered batches: the ones a stalled write waits for
            queued = getattr(getattr(producer, "_message_accumulator", None), "_batches", None) or {}
            parts = [(tp.topic, tp.partition) for tp, batches in list(queued.items()) if batches]
            return leader_problems(client, parts or [
                (t, p) for t in self.write_topics for p in (client.cluster.partitions_for_topic(t) or ())])

        return self.write_watch.problem(explain)

    def source_problems(self) -> list[str]:
        """Assigned source partitions whose leader the consumer has no metadata for or cannot reach."""
        try:
            client = self.app.consumer._thread._consumer._client
            assigned = [(tp.topic, tp.partition) for tp in self.app.consumer.assignment()]
        except Exception:  # not started yet
            return []
        sources = {s.topic for s in self.topology.sources}
        return leader_problems(client, [(t, p) for t, p in assigned if t in sources])

    def summary(self) -> dict[str, Any]:
        outcomes: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        stage_us: dict[str, float] = {}
        for chain in self.chains.values():
            outcomes.update(chain.stats.outcomes)
            reasons.update(chain.stats.dlq_reasons)
            stage_us.update(chain.stats.stage_us_per_message())
        return {"read": self.stats.read, "emitted": self.stats.emitted, "expired": outcomes[Outcome.EXPIRED],
                "duplicate": outcomes[Outcome.DUPLICATE], "dlq": outcomes[Outcome.DLQ],
                "dlq_reasons": dict(reasons), "written": dict(self.stats.written),
                "publish_retries": self.stats.publish_retries, "stage_us_per_message": stage_us,
                "sequence": dict(self.stats.sequence)}


async def _redact_after_startup() -> None:
    install_redaction()


def _message_from_record(r: Any) -> Message:
    """A `Message` from an aiokafka `ConsumerRecord` (the records the continuity check fetched)."""
    return Message(topic=r.topic, partition=r.partition, offset=r.offset, value=r.value or b"", key=r.key,
                   headers=[(k, v) for k, v in (r.headers or ()) if v is not None],
                   timestamp_ms=r.timestamp if r.timestamp and r.timestamp > 0 else None)


def _header(rec: DlqRecord, name: str) -> str:
    """A `prism.errors.<name>` context header of a DLQ record, for log lines."""
    return next((v.decode(errors="replace") for k, v in rec.headers if k == "prism.errors." + name), "?")


class _StartedProducer:
    """An aiokafka producer where `_send_all` expects Faust's (`_ensure_producer()`)."""

    __slots__ = ("producer",)

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def _ensure_producer(self) -> Any:
        return self.producer


def _faust_message(msg: Message) -> Any:
    from faust.types import Message as FaustMessage

    return FaustMessage(msg.topic, msg.partition, msg.offset, (msg.timestamp_ms or 0) / 1000, 0, msg.headers,
                        msg.key, msg.value, None)


def _ts_ms(ms: int | None) -> int | None:
    """The record timestamp exactly as Faust's `send(timestamp=ms / 1000)` computed it (seconds
    and back), so batching did not change a byte of what is written."""
    return int(ms / 1000 * 1000.0) if ms else None


async def _nothing() -> None:
    """The finishing step of a batch abandoned before its writes (`_start_batch`)."""


def _backoff(attempt: int, initial_ms: int, max_ms: int) -> float:
    """Capped exponential backoff with full jitter (AWS architecture blog's recommendation)."""
    return random.uniform(0, min(max_ms, initial_ms * 2 ** (attempt - 2))) / 1000


__all__ = ["PipelineApp", "PrismError", "RunStats", "build_stages", "resolve_schema"]


def app_from_env() -> faust.App:
    """Factory for running a topology's worker as a subprocess
    (`python -m app.worker.faust_app app.worker.pipeline:app_from_env`).

    Reads PRISM_TOPOLOGY, PRISM_BOOTSTRAP, PRISM_DATA_DIR, PRISM_APP_ID, PRISM_EMBEDDED
    (1 when the broker is the embedded one; otherwise the broker credentials come from
    PRISM_SECURITY_PROTOCOL etc. as for `prism run`), PRISM_ARCHIVE (archive location; unset: no
    archive tap), PRISM_ARCHIVE_WRITER_ID and PRISM_ARCHIVE_SHARD (app/worker/archive_service.py),
    PRISM_WEB_PORT and PRISM_WEB_BIND (the interface the web port listens on; default 127.0.0.1),
    PRISM_MAX_REQUEST_BYTES (the producer's max_request_size; default 4 MiB: the largest record
    the worker writes, app/worker/limits.py), PRISM_PROCESSING_GUARANTEE (overrides the
    topology's `processing_guarantee`; exactly_once is refused at once, in one line, where the
    broker has no transactions: app/worker/transactions.py)."""
    import os

    from app.topology import load_topology
    from app.worker.archive_service import SHARD_ENV, parse_shard

    missing = [k for k in ("PRISM_TOPOLOGY", "PRISM_BOOTSTRAP", "PRISM_DATA_DIR") if not os.environ.get(k)]
    if missing:
        raise ConfigError(f"missing environment variable(s) {missing}", hint="set them before starting the worker")
    topo = load_topology(os.environ["PRISM_TOPOLOGY"])
    from app.worker.observe import ENV_WEB_PORT, Observer

    port = os.environ.get(ENV_WEB_PORT)
    embedded = os.environ.get("PRISM_EMBEDDED") == "1"
    settings = None
    if not embedded and os.environ.get("PRISM_BROKER_URL"):
        settings = BrokerSettings.from_env()  # SASL/SSL for a real cluster, validated as in `prism run`
    bind = os.environ.get("PRISM_WEB_BIND") or "127.0.0.1"
    overrides: dict[str, Any] = {}
    max_request = max_request_from_env()  # the one reader of PRISM_MAX_REQUEST_BYTES (app/worker/limits.py)
    if max_request is not None:
        overrides["producer_max_request_size"] = max_request
    from app.worker.transactions import GUARANTEE_ENV, check_transactions, refusal

    guarantee = check_guarantee(os.environ.get(GUARANTEE_ENV) or topo.processing_guarantee,
                                where=GUARANTEE_ENV if os.environ.get(GUARANTEE_ENV) else "processing_guarantee")
    if guarantee == EXACTLY_ONCE:
        if embedded:
            raise ConfigError(refusal("the embedded broker has none"), path="processing_guarantee")
        check_transactions(os.environ["PRISM_BOOTSTRAP"], os.environ.get("PRISM_APP_ID") or f"prism-{topo.name}",
                           settings)
    pipeline = PipelineApp(topo, bootstrap=os.environ["PRISM_BOOTSTRAP"], data_dir=os.environ["PRISM_DATA_DIR"],
                       app_id=os.environ.get("PRISM_APP_ID"), embedded=embedded, broker_settings=settings,
                       web_port=int(port) if port else None, observe=Observer.from_env(),
                       web_bind=bind, web_host=socket.gethostname() if bind in ("0.0.0.0", "::") else bind,
                       archive_location=os.environ.get("PRISM_ARCHIVE") or None,
                       archive_shard=parse_shard(os.environ.get(SHARD_ENV)), processing_guarantee=guarantee,
                       **overrides)
    if settings is not None:
        from app.broker.preflight import plan_for, preflight

        # auth, TLS and ACLs as one error line now, not a retry loop inside Faust (app/broker/preflight.py)
        preflight(settings, plan_for(pipeline))
    pipeline.check_write_room()  # output limits that leave no room: one error line, not a DLQ of everything
    return pipeline.app
