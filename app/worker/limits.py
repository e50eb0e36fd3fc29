"""Size limits of every record the worker writes, known before anything is sent.

Why: a record the broker (or the producer) will refuse is refused for good. Before this module
the worker found that out by sending: the producer raised `MessageSizeTooLargeError`, the
outputs were retried, the message's DLQ copy (the same size plus context headers) failed the
same way and was retried forever, and the batch - and with it every later batch's offsets -
never completed. Now each write path has one limit, computed from configuration and the broker:

* **per topic** the smaller of the producer's `max_request_size` (aiokafka refuses a larger
  record before queueing it) and the topic's `max.message.bytes` (the broker refuses a larger
  record batch). The topic value is read with DescribeConfigs at start-up; where the broker
  does not report it (the embedded broker reports only configs set on a topic) the configured
  producer limit is used and the start-up line says so;
* **a record's size** is what aiokafka itself checks: the exact bytes about to be sent (key,
  value, header names and values) plus the record and batch overhead
  (`DefaultRecordBatchBuilder.estimate_size_in_bytes`, the bound aiokafka compares with
  `max_request_size`; uncompressed, so it is never below what the broker sees);
* **the input limit** follows, per source: an input record larger than the smallest limit of
  its source's outputs minus the overhead the worker adds (`measured_overhead`: envelope,
  signature and audit path, headers) could never be written to the outputs, so it is
  dead-lettered as `too_large` before the chain decodes it - and never above the envelope
  codec's own limit (`Limits.max_message_bytes`, 16 MiB); limits that leave no usable room stop
  the start (`check_room`);
* **changelog records** (dedup ids, counters, sequences) are small by construction: their keys
  are bounded by the validate stage; the limit is reported, not checked per record.

`app.agents.dlq.fit_dlq_record` uses the DLQ topic's limit to cut a DLQ copy down to what fits,
so the DLQ write itself can never fail on size.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from app.decimal_text import decimal
from app.envelope.codec import DEFAULT_LIMITS
from app.errors import ConfigError, NoRoomError

__all__ = ["MAX_REQUEST_ENV", "MIN_INPUT_ROOM", "OUTPUT_OVERHEAD", "WriteLimits", "check_room", "max_request_from_env",
           "measured_overhead", "record_size"]

#: The producer's `max_request_size` in bytes, for every entry point that builds a worker
#: (`prism run`, its `--processes` children, `app_from_env`); unset: faust_app's 4 MiB.
MAX_REQUEST_ENV = "PRISM_MAX_REQUEST_BYTES"
#: Below this aiokafka cannot send the worker's own batches (256 KiB) plus headers sensibly.
MIN_MAX_REQUEST = 64 * 1024

#: The overhead assumed where none was measured (a `WriteLimits` built without a publisher, e.g.
#: the sinks-only app): generous, since the exact check before sending catches what it lets by.
#: A worker measures its own (`measured_overhead`).
OUTPUT_OVERHEAD = 64 * 1024

_estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes


def max_request_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """`PRISM_MAX_REQUEST_BYTES` as a byte count, None when unset; a `ConfigError` otherwise.

    Why one reader: the variable used to be read only by the subprocess entry point, so
    `prism run` (one process) silently ran with the default while `--processes N` children
    obeyed it - the same setting meant two limits. Every entry point calls this with its other
    start-up checks, so a bad value is reported before any broker is contacted."""
    raw = (os.environ if environ is None else environ).get(MAX_REQUEST_ENV, "").strip()
    if not raw:
        return None
    if (decimal(raw) or 0) < MIN_MAX_REQUEST:
        raise ConfigError(f"{MAX_REQUEST_ENV}={raw!r} is not a byte count of at least {MIN_MAX_REQUEST}",
                          path=MAX_REQUEST_ENV, hint="set the producer's max_request_size in bytes, e.g. 4194304")
    return int(raw)


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> int:
    """The bytes aiokafka counts for one record in a batch of its own (key, value, headers,
    record and batch overhead): what it compares with `max_request_size`."""
    return int(_estimate(key, value, headers))


@dataclass(frozen=True, slots=True)
class WriteLimits:
    """The size limit of every topic the worker writes, and the input limit that follows.

    `topic_limits`: topic -> its `max.message.bytes` as the broker reported it; topics missing
    from it use `max_request_size` alone (`unknown` lists them, with why, for the start-up line).
    """

    max_request_size: int
    topic_limits: Mapping[str, int] = field(default_factory=dict)
    unknown: Mapping[str, str] = field(default_factory=dict)
    envelope_limit: int = DEFAULT_LIMITS.max_message_bytes
    output_topics: tuple[str, ...] = ()
    #: what an output record may add to its input's bytes (`output_overhead`)
    overhead: int = OUTPUT_OVERHEAD

    def limit_for(self, topic: str) -> int:
        """The largest record (`record_size`) that `topic` accepts from this worker."""
        broker = self.topic_limits.get(topic)
        return self.max_request_size if broker is None else min(self.max_request_size, broker)

    @property
    def output_limit(self) -> int:
        """The smallest limit among the output topics (`.v2`, `.v3`, archive)."""
        return min((self.limit_for(t) for t in self.output_topics), default=self.max_request_size)

    @property
    def input_limit(self) -> int:
        """The largest input record (key + value + headers) whose outputs can fit."""
        return max(0, min(self.envelope_limit, self.output_limit - self.overhead))

    def input_limit_for(self, outputs: Iterable[str]) -> int:
        """The largest input record of a source whose outputs are `outputs`: each source is held
        to its own outputs' limits, not to the tightest topic of another source."""
        smallest = min((self.limit_for(t) for t in outputs), default=self.max_request_size)
        return max(0, min(self.envelope_limit, smallest - self.overhead))

    def fits(self, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> bool:
        return record_size(key, value, headers) <= self.limit_for(topic)

    def with_broker(self, reported: Mapping[str, int | None], why: Mapping[str, str] | None = None) -> WriteLimits:
        """These limits with the topics' `max.message.bytes` as the broker reported them (None:
        not reported; `why` says why, per topic)."""
        known = {t: v for t, v in reported.items() if v is not None and v > 0}
        unknown = {t: (why or {}).get(t, "not reported by the broker") for t, v in reported.items()
                   if v is None or v <= 0}
        return WriteLimits(self.max_request_size, known, unknown, self.envelope_limit, self.output_topics, self.overhead)

    def lowered(self, topic: str, limit: int) -> WriteLimits:
        """These limits with `topic`'s lowered to `limit` (at least 1 KiB): the broker refused a
        record the known limit allowed, so its real limit is lower than configured or reported."""
        topics = dict(self.topic_limits)
        topics[topic] = max(1024, min(limit, self.limit_for(topic)))
        unknown = {t: why for t, why in self.unknown.items() if t != topic}
        return WriteLimits(self.max_request_size, topics, unknown, self.envelope_limit, self.output_topics,
                           self.overhead)

    def describe(self, topics: Iterable[str]) -> str:
        """One line for the start-up log: every limit and where it came from."""
        parts = []
        for t in topics:
            if t in self.topic_limits:
                src = f"max.message.bytes={self.topic_limits[t]}"
            else:
                src = f"max.message.bytes unknown ({self.unknown.get(t, 'not read')}); configured limit used"
            parts.append(f"{t}: {self.limit_for(t)} ({src})")
        return (f"write limits: producer max_request_size={self.max_request_size}; " + "; ".join(parts)
                + f"; input limit {self.input_limit} bytes (smallest output limit {self.output_limit} minus "
                  f"{self.overhead} overhead, at most the envelope limit {self.envelope_limit})")


#: Where the measured overhead cannot see: fields a stage may add from configuration (schema
#: context, validation headers, labels). The exact check before sending still catches any output
#: over its limit; this only keeps the input pre-check from admitting inputs that cannot fit.
MEASURE_MARGIN = 2048
#: Below this many bytes of room for an input the pipeline cannot carry real messages: refuse to start.
MIN_INPUT_ROOM = 1024


def measured_overhead(publisher: Any, topic: str, *, id_length: int) -> int:
    """What the worker adds to an input, measured with its own publisher: the largest output
    record (`record_size`, every output topic) built from an *empty* input whose worker-set
    fields are at their largest - ids and names at the validate stage's `id_length`, trace and
    schema contexts, identity extensions, the `prism-source` header with the widest partition
    and offset, the worker's signature - plus the longest batch audit path (a tree of
    `MAX_TREE_SIZE` leaves, which the one signed here lacks) and `MEASURE_MARGIN`.

    Why measured rather than a constant (issue 31): a fixed 64 KiB left no room at all under
    output limits of 64 KiB or less, and far more than needed above; the real figure is a few
    KiB and depends on the layouts, the signature scope and the topology's names."""
    import math

    from app.agents.base import Message
    from app.envelope import new_envelope
    from app.security.signing import MAX_TREE_SIZE

    wide = "w" * id_length
    env = new_envelope(topic, b"", namespace=wide, message_id=wide, correlation_id=wide, causality_parent=wide,
                       data_classification="confidential", contains_pii=True, producer_sdk_version="v" * 64,
                       extensions={"prism.identity.method": b"attestation", "prism.claimed.publisher_id": wide.encode(),
                                   "prism.claimed.publisher_team": wide.encode()})
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.parent_span_id, obs.trace_flags = "f" * 32, "f" * 16, "f" * 16, 1
    sch = env.ensure_schema()
    sch.schema_url, sch.schema_version, sch.schema_format = "s" * 256, "v" * 32, "protobuf"
    sch.schema_hash, sch.schema_name, sch.compatibility_mode = "h" * 64, wide, "FULL_TRANSITIVE"
    sec = env.ensure_security()
    sec.publisher_id, sec.publisher_team = wide, wide
    msg = Message(topic=topic, partition=2**31 - 1, offset=2**63 - 1, value=b"", envelope=env, settled=True)
    emissions = publisher.emissions(msg)
    largest = max((record_size(e.record.key, e.record.value, e.record.headers) for e in emissions), default=0)
    audit_path = math.ceil(math.log2(MAX_TREE_SIZE)) * (32 + 2) + 16  # hashes, their tags, index and size
    return largest + audit_path + MEASURE_MARGIN


def check_room(limits: WriteLimits, sources: Mapping[str, Sequence[str]]) -> None:
    """Refuse to start when the output limits leave a source's inputs no usable room
    (`MIN_INPUT_ROOM`): one `NoRoomError` naming the tightest output topic and the setting."""
    for source, outputs in sources.items():
        room = limits.input_limit_for(outputs)
        if room >= MIN_INPUT_ROOM:
            continue
        tight = min(outputs, key=limits.limit_for, default=None)
        where = (f"{tight} (max.message.bytes {limits.limit_for(tight)})" if tight is not None
                 else f"the producer's max_request_size {limits.max_request_size}")
        raise NoRoomError(
            f"the output limit of {where} leaves {room} bytes for an input of {source} after the {limits.overhead} "
            "bytes the worker adds (envelope, headers, signature and audit path): every message would be "
            "dead-lettered as too_large", path="max.message.bytes",
            hint=f"raise max.message.bytes of {tight or 'the output topics'} to at least "
                 f"{limits.overhead + 64 * 1024} (kafka-configs --alter --entity-type topics --entity-name {tight} "
                 f"--add-config max.message.bytes=...) or PRISM_MAX_REQUEST_BYTES")
