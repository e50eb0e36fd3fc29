"""The pipeline worker: one topology -> one Faust app whose tasks run the stage chain.

Data flow per source topic (one feeder task each):

    source topic --BatchSource--> Chain(normalize ... enrich) --> Publisher --> .v2 / .v3 / archive
                                         \\--> any failure -------------------> <topic>.dlq

This module is the composition root: it checks the topology's configuration (keys, schema,
encryption), builds the stage chains and wires the worker's parts into the Faust app
(`PipelineApp`). The parts, each in its own module (docs/architecture.md, "Inside the worker"):

* `app/worker/batch_runner.py` - the hot path: a fetched batch through the chain, signed,
  fitted to the size limits, handed to the delivery;
* `app/worker/delivery.py` - the `Delivery` protocol, with `at_least_once.py` (write, retry,
  dead-letter, block loudly, then acknowledge) and `exactly_once.py` (one transaction per batch);
* `app/worker/size_fit.py` - the written topics' size limits, read and kept current;
* `app/worker/worker_state.py` - blocked/stopping state, problem reports, `RunStats`;
* `app/worker/observe.py` - metrics, health, tracing, the management API (optional).

Why batches: Faust's per-event machinery costs more per message than several of Prism's
stages. The source topic is read beneath it (`app/worker/batch_source.py`); Faust keeps the
group, rebalances, tables, commits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import faust

from app.agents.authenticate import Authenticate
from app.agents.base import Stage
from app.agents.chain import Chain, Outcome
from app.agents.dedup import Dedup
from app.agents.enrich import Enrich, SchemaInfo
from app.agents.identity import IdentityRule, insert_identity_stage
from app.agents.normalize import Normalize
from app.agents.policy import Policy
from app.agents.publish import Publisher
from app.agents.validate import Validate
from app.agents.verify_signature import VerifySignature
from app.broker.admin import BrokerSettings, RetentionCheck, check_retention
from app.errors import ConfigError, PrismError
from app.observability.logging import install_redaction
from app.schema.pii import PiiValueFinder
from app.security.attestation import AttestationVerifier
from app.security.producers import ProducerBindings, check_key_ids_known, keyring_scopes
from app.security.signing import SigningKeyring
from app.security.topology_keys import attestation_setup, keyring_for
from app.security.worker_encryption import WorkerEncryption, build_worker_encryption
from app.sinks.runner import register_sinks
from app.tables.counters import FaustTopicCounters
from app.tables.dedup import DedupWindow, FaustDedupWindow
from app.tables.sequence import FaustSequenceTracker
from app.topology import EnrichStage, Topology, load_topology
from app.worker.at_least_once import AtLeastOnce
from app.worker.batch_runner import BatchRunner, hold_counts_until_commit
from app.worker.batch_source import BatchSource
from app.worker.continuity import HoleFetcher, OffsetTracker
from app.worker.delivery import Delivery
from app.worker.dlq_overflow import build_overflow
from app.worker.exactly_once import ExactlyOnce
from app.worker.faust_app import make_app
from app.worker.group_topology import client_id_for, topology_digest
from app.worker.interfaces import RunStats
from app.worker.kafka_health import WriteWatch
from app.worker.limits import WriteLimits, max_request_from_env, measured_overhead
from app.worker.observe import ENV_WEB_PORT, Observer
from app.worker.size_fit import SizeFitter
from app.worker.transactions import (
    EXACTLY_ONCE,
    GUARANTEE_ENV,
    PartitionProducers,
    check_guarantee,
    check_transactions,
    install_read_committed,
    refusal,
)
from app.worker.worker_state import WorkerState

log = logging.getLogger("prism.worker")
#: at_least_once: seconds a finished batch's counters and metrics may wait to be counted with the
#: next ones (app/worker/batch_runner.py; every offset commit counts them first)
COUNT_EVERY_S = 0.1


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


class PipelineApp:
    """One topology's worker: builds its parts and wires them into one Faust app. Construct,
    then run with `run_worker(p.app)` or `InProcessWorker(p.app)`.

    The parts (docs/architecture.md, "Inside the worker"):

    * `state` - `WorkerState` (app/worker/worker_state.py): blocked/stopping state, problem
      reports, `RunStats`;
    * `fitter` - `SizeFitter` (app/worker/size_fit.py): the written topics' size limits;
    * `delivery` - `AtLeastOnce` or `ExactlyOnce` (app/worker/delivery.py and its two modules);
    * `runner` - `BatchRunner` (app/worker/batch_runner.py): the hot path, batch by batch;
    * one `BatchSource` per source topic (app/worker/batch_source.py), feeding the runner;
    * `observe` - the optional `Observer` (app/worker/observe.py), attached last.

    Lifecycle (Faust runs it; every hook is connected in `_wire_lifecycle`):
    construction checks the configuration and builds the parts, touching no broker; at start
    Faust runs the tasks - read the size limits and keep them current, check the sources'
    retention, one feeder per source; on a rebalance the offset expectations start afresh;
    before shutdown the delivery closes (exactly_once: its transactional producers, after the
    batches in flight) and the hole fetcher stops."""

    def __init__(self, topology: Topology, *, bootstrap: str, data_dir: str | Path, app_id: str | None = None,
                 embedded: bool = False, web_port: int | None = None, batch_size: int = 500,
                 batch_within_s: float = 0.0, broker_settings: BrokerSettings | None = None,
                 on_batch: Callable[[RunStats], None] | None = None, archive_location: str | Path | None = None,
                 observe: Observer | None = None, archive_writer_id: str | None = None,
                 archive_shard: tuple[int, int] | None = None, processing_guarantee: str | None = None,
                 **faust_overrides: Any) -> None:
        self.topology = topology
        #: at_least_once (default) or exactly_once (app/worker/transactions.py); the argument wins
        #: over the topology's `processing_guarantee`
        self.guarantee = check_guarantee(processing_guarantee or topology.processing_guarantee)
        self.batch_size = batch_size
        #: how long a batch waits to fill once it has a message: none by default - a batch is
        #: what has been fetched when the chain is ready for it (app/worker/batch_source.py,
        #: "Adaptive batches"); positive, it trades latency for fuller batches at light load
        self.batch_within_s = batch_within_s
        self.on_batch = on_batch
        self._bootstrap, self._broker_settings = bootstrap, broker_settings
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
            install_read_committed(self.app)
            self.transactions = PartitionProducers(
                str(self.app.conf.id), bootstrap, sources=[s.topic for s in topology.sources],
                settings=broker_settings, max_request_size=int(self.app.conf.producer_max_request_size),
                max_batch_size=int(self.app.conf.producer_max_batch_size),
                transaction_timeout_ms=topology.transaction_timeout_ms)
            self.transactions.wrap_rebalance(self.app)
        # Every table write queues a changelog record; Faust stalls the stream whenever more
        # than 100 are pending (and logs "producer buffer full"). A batch writes one dedup
        # entry per message, so let a few batches' worth queue up.
        self.app.producer.buffer.max_messages = max(10_000, batch_size * 8)
        # -- keys, schema, encryption: checked now, before any broker is touched -----------------
        self.keyring = keyring_for(topology)
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
        self.counters = FaustTopicCounters(self.app, "topic-counters", partitions=max(parts))
        self.sequences = FaustSequenceTracker(self.app, "sequences", partitions=max(parts))
        # Source topics hold producers' tokens: warn when the broker keeps them longer than the
        # topology allows (memo-031 Recommendation 5). Off the start-up path: never delays work.
        self.retention_checks: list[RetentionCheck] | None = None
        # -- size limits (app/worker/limits.py, app/worker/size_fit.py) ---------------------------
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
        #: where a truncated DLQ copy's whole value is kept (`dlq.overflow`; checked now, before any broker)
        self.overflow = build_overflow(topology)
        # -- the parts -------------------------------------------------------------------------
        self.observe = observe
        self.state = WorkerState(self.app, topology, observe=observe, write_topics=self.write_topics)
        self.fitter = SizeFitter(
            self.app, WriteLimits(int(self.app.conf.producer_max_request_size),
                                  output_topics=tuple(dict.fromkeys(outputs)),
                                  overhead=max(measured_overhead(self.publisher, s.topic, id_length=id_length)
                                               for s in topology.sources)),
            write_topics=self.write_topics, source_outputs=self.source_outputs, overflow=self.overflow,
            stats=self.state.stats, bootstrap=bootstrap, settings=broker_settings)
        self.delivery: Delivery = (
            ExactlyOnce(self.app, self.state, self.fitter, self.transactions) if self.transactions is not None
            else AtLeastOnce(self.app, topology, self.state, self.fitter))
        self.dedups: dict[int, Dedup] = {}  # id(chain) -> its dedup stage
        self.runner = BatchRunner(self.app, publisher=self.publisher, delivery=self.delivery, state=self.state,
                                  fitter=self.fitter, offsets=self.offsets, hole_fetcher=self.hole_fetcher,
                                  counters=self.counters, sequences=self.sequences, dedups=self.dedups,
                                  observe=observe, on_batch=on_batch,
                                  # at_least_once: counted per interval, before each commit (the
                                  # runner's docstring); exactly_once counts inside each transaction
                                  count_every_s=0.0 if self.transactions is not None else COUNT_EVERY_S)
        if self.transactions is None:
            hold_counts_until_commit(self.app.consumer, self.runner)
        # Connect-style sinks (`sinks:` in the topology): separate agents reading the outputs.
        self.sinks = register_sinks(self.app, topology, bootstrap=bootstrap, overflow=self.overflow,
                                    limit_for=lambda t: self.fitter.limits.limit_for(t)) if topology.sinks else []
        self.archive: Any = None
        if archive_location is not None and topology.archive.enabled:
            from app.worker.archive_service import ArchiveService  # pulls in pyarrow: only when archiving

            # a unique writer id per worker process (app/worker/archive_service.py), and with a
            # shard only that share of the archive topics' partitions
            self.archive = self.app.add_dependency(ArchiveService(
                bootstrap, topology.archive_source_topics(), str(archive_location), writer_id=archive_writer_id,
                partitions=topology.topics(), shard=archive_shard, roll_interval_s=topology.archive.roll_interval_s,
                consumer_kwargs=broker_settings.aiokafka_kwargs() if broker_settings else None))
        self.chains: dict[str, Chain] = {}
        self.sources: list[BatchSource] = []
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
            self.sources.append(BatchSource(self.app, topic, functools.partial(self.runner.start, chain),
                                            batch_size=batch_size, within=batch_within_s,
                                            split_partitions=self.transactions is not None))
        self._wire_lifecycle()
        # Observability (app/worker/observe.py): metrics, health, stage spans, management API.
        if observe is not None:
            observe.attach(self)

    # -- lifecycle ---------------------------------------------------------------------------
    def _wire_lifecycle(self) -> None:
        """Every hook the worker has in Faust's lifecycle, in one place (see the class docstring)."""
        app = self.app
        # Redaction is a property of the log handlers, not of callers (observability docs):
        # now for handlers that exist, and again once Faust has set up its own.
        install_redaction()
        app.task(_redact_after_startup)
        app.task(self._check_retention_task)
        # the topics' limits: the first batch's writes wait for them (`SizeFitter.limits_read`)
        app.task(self.fitter.keep_current)
        for source in self.sources:
            app.task(self._feeder(source))
        app.on_partitions_revoked.connect(self._forget_partitions)
        app.on_partitions_assigned.connect(self._forget_partitions)
        if self.transactions is not None:
            app.on_before_shutdown.connect(self._close_delivery)
        app.on_before_shutdown.connect(self._stop_hole_fetcher)

    async def _check_retention_task(self) -> None:
        await self.check_source_retention(self._bootstrap, self._broker_settings)

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

    async def _forget_partitions(self, sender: Any, partitions: Any = None, **kwargs: Any) -> None:
        # Revoked or (re)assigned: Faust seeks to the committed offset, expectations start afresh.
        self.offsets.forget(partitions or kwargs.get("revoked") or kwargs.get("assigned") or ())

    async def _close_delivery(self, sender: Any, **kwargs: Any) -> None:
        await self.delivery.close()

    async def _stop_hole_fetcher(self, sender: Any, **kwargs: Any) -> None:
        await self.hole_fetcher.stop()

    def _stages(self, topic: str, partitions: int) -> list[Stage]:
        return build_stages(self.topology, keyring=self.keyring, schema=self.schema, attestations=self.attestations,
                            encryption=self.encryption,
                            dedup_window=lambda window_s: FaustDedupWindow(
                                self.app, f"dedup-{topic}", window=window_s, partitions=partitions))

    # -- start-up checks -----------------------------------------------------------------------
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

    def check_write_room(self, *, timeout: float = 20.0) -> WriteLimits:
        """Start-up: refuse to start, with one `error [no_room] ... fix:` line, when the written
        topics' limits leave an input no usable room (`SizeFitter.check_room`)."""
        return self.fitter.check_room(timeout=timeout)

    async def refresh_write_limits(self) -> WriteLimits:
        """Read the topics' `max.message.bytes` again (`SizeFitter.refresh`)."""
        return await self.fitter.refresh()

    # -- what the observer, the CLI and the tests read -------------------------------------------
    @property
    def stats(self) -> RunStats:
        return self.state.stats

    @property
    def blocked(self) -> str | None:
        """Why the worker cannot write its DLQ (None: it can); /readyz reports it."""
        return self.state.blocked

    @property
    def limits(self) -> WriteLimits:
        """The size limits in force (app/worker/size_fit.py)."""
        return self.fitter.limits

    @property
    def write_watch(self) -> WriteWatch:
        return self.state.write_watch

    def kafka_problem(self) -> str | None:
        """Why writes do not go through right now (None: they do): `WorkerState.kafka_problem`."""
        return self.state.kafka_problem()

    def source_problems(self) -> list[str]:
        """Assigned source partitions whose leader the consumer has no metadata for or cannot reach."""
        return self.state.source_problems()

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
    from app.worker.archive_service import SHARD_ENV, parse_shard  # pulls in pyarrow: only here

    missing = [k for k in ("PRISM_TOPOLOGY", "PRISM_BOOTSTRAP", "PRISM_DATA_DIR") if not os.environ.get(k)]
    if missing:
        raise ConfigError(f"missing environment variable(s) {missing}", hint="set them before starting the worker")
    topo = load_topology(os.environ["PRISM_TOPOLOGY"])
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
