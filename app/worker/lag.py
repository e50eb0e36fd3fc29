"""Consumer-group lag as Burrow and Kafka's own tooling measure it: the group's committed offsets
(OffsetFetch, from the group coordinator) against the partitions' log end offsets.

Why not what the worker fetched: the worker used to compute lag from its own consumer
(``consumer.highwater(tp)``, the high watermark of its last fetch response). A paused worker
fetches nothing, so its high watermarks froze and lag read 0 while messages piled up (found: 50
messages produced while paused, the broker showed committed 10/11/9/6 against 22/28/18/18, and
``/status``, ``prism status`` and ``prism_consumer_lag`` all said 0). It also lost every
partition during a rebalance (nothing assigned) and did not exist at all while the worker was
down - exactly when lag matters.

So lag is read from the broker, by one module, for all three views:

* the worker's ``prism_consumer_lag{topic,partition}`` gauge and ``/connectors/{name}/status``
  (:class:`LagMonitor`, a background task: one read every ``PRISM_LAG_INTERVAL_S`` seconds,
  default 5, each bounded by ``PRISM_LAG_TIMEOUT_S``, default 5; a failed read keeps the last
  good snapshot and says why);
* ``prism status --group GROUP`` (:func:`read_group_lag_from_env`), with no worker running.

Every partition of the group's source topics is reported, assigned to this worker or not: the
committed offsets belong to the group, so every worker of a group reports the same numbers
(dashboards take ``max by (topic, partition)``).

The log end offset:

* Apache Kafka: ``ListOffsets(latest)``, the high watermark.
* The embedded broker (Tansu): its ``ListOffsets(latest)`` answers the base offset of the last
  record batch, short by up to a batch (docs/platform-notes.md). There the end is the high
  watermark of a ``Fetch`` from that offset (:func:`app.worker.offsets.true_end_offsets`; the
  result is ``max(listed, fetched)``, so it never reads lower than ListOffsets). ``prism status
  --group`` cannot tell the brokers apart from the address alone and always verifies with that
  fetch: on Kafka both answers agree, at the cost of one small Fetch per broker.

A partition the group never committed has ``committed: None``; its lag counts from the log
start (the worker's ``auto_offset_reset`` is ``earliest``: all of it is still to be read), as
``kafka-consumer-groups --describe`` would after the first poll.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

log = logging.getLogger(__name__)

ENV_INTERVAL = "PRISM_LAG_INTERVAL_S"
ENV_TIMEOUT = "PRISM_LAG_TIMEOUT_S"
DEFAULT_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 5.0


def _env_seconds(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    raw = ((os.environ if env is None else env).get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        from app.errors import ConfigError

        raise ConfigError(f"{name}={raw!r} is not a number of seconds", path=name, hint=f"e.g. {name}=5") from None
    if not 0 < value < 86_400:  # NaN fails it too: it crashed the worker after it had started
        from app.errors import ConfigError

        raise ConfigError(f"{name}={raw!r} must be a number of seconds above 0 and under a day", path=name,
                          hint=f"e.g. {name}={default:g}")
    return value


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of the group: committed offset (None: never committed), log start and end."""

    topic: str
    partition: int
    committed: int | None
    log_start: int | None
    log_end: int | None

    @property
    def lag(self) -> int | None:
        """Messages the group has still to consume; None when the log end is unknown."""
        if self.log_end is None:
            return None
        base = self.committed if self.committed is not None else (self.log_start or 0)
        return max(0, self.log_end - base)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "committed": self.committed,
                "log_start": self.log_start, "log_end": self.log_end, "lag": self.lag}


@dataclass(frozen=True, slots=True)
class GroupLag:
    """A snapshot of one group's lag on its topics, read at ``at`` (epoch seconds)."""

    group: str
    topics: tuple[str, ...]
    partitions: tuple[PartitionLag, ...]
    at: float
    end_from: str  # "list_offsets" or "fetch" (the embedded broker's high watermark)
    error: str | None = None  # why the latest read failed (the partitions are then the last good ones)

    @property
    def total(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    def get(self, topic: str, partition: int) -> PartitionLag | None:
        for p in self.partitions:
            if (p.topic, p.partition) == (topic, partition):
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "topics": list(self.topics), "lag": self.total, "at": self.at,
                "end_from": self.end_from, "error": self.error, "partitions": [p.to_dict() for p in self.partitions]}


class LagReader:
    """Reads :class:`GroupLag` from the broker over its own connections: a group-less consumer
    (metadata, ListOffsets, Fetch) and an admin client (FindCoordinator, OffsetFetch). Neither
    joins the group, so reading lag never triggers a rebalance, and neither shares the worker
    consumer's connection (a request there would queue behind its long-poll fetch)."""

    def __init__(self, bootstrap: str, *, client_kwargs: Mapping[str, Any] | None = None,
                 end_from_fetch: bool, request_timeout_ms: int = 10_000) -> None:
        self.bootstrap = bootstrap
        self.client_kwargs = dict(client_kwargs or {})
        self.end_from_fetch = end_from_fetch
        self.request_timeout_ms = request_timeout_ms
        self._consumer: Any = None
        self._admin: Any = None

    async def _clients(self) -> tuple[Any, Any]:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        if self._consumer is None:
            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, client_id="prism-lag", enable_auto_commit=False,
                                        request_timeout_ms=self.request_timeout_ms, **self.client_kwargs)
            await consumer.start()
            self._consumer = consumer
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="prism-lag",
                                        request_timeout_ms=self.request_timeout_ms, **self.client_kwargs)
            await admin.start()
            self._admin = admin
        return self._consumer, self._admin

    async def read(self, group: str, topics: Iterable[str]) -> GroupLag:
        """One snapshot: every partition of ``topics`` (from a full metadata fetch, so a topic is
        never auto-created by naming it), the group's committed offsets, the log ends."""
        from aiokafka.structs import TopicPartition

        from app.worker.offsets import true_end_offsets

        wanted = tuple(sorted(set(topics)))
        consumer, admin = await self._clients()
        cluster = await consumer._client.fetch_all_metadata()
        tps = [TopicPartition(t, p) for t in wanted for p in sorted(cluster.partitions_for_topic(t) or ())]
        if not tps:
            return GroupLag(group, wanted, (), time.time(), self._end_from())
        committed_raw = await admin.list_consumer_group_offsets(group, partitions=tps)
        committed = {tp: int(om.offset) for tp, om in committed_raw.items() if om is not None and om.offset >= 0}
        # Track the (existing) topics so the client's metadata knows their leaders: ListOffsets and
        # Fetch are routed by them, and an untracked topic has none on Apache Kafka (app/broker/metadata.py).
        present = sorted({tp.topic for tp in tps})
        if set(present) - set(consumer._client._topics):
            await consumer._client.set_topics(sorted(set(consumer._client._topics) | set(present)))
        if self.end_from_fetch:
            ends = await true_end_offsets(consumer, tps)
        else:
            ends = {tp: int(v) for tp, v in (await consumer.end_offsets(tps)).items() if v is not None}
        never = [tp for tp in tps if tp not in committed]
        starts = {tp: int(v) for tp, v in (await consumer.beginning_offsets(never)).items()} if never else {}
        parts = tuple(PartitionLag(tp.topic, tp.partition, committed.get(tp), starts.get(tp), ends.get(tp))
                      for tp in tps)
        return GroupLag(group, wanted, parts, time.time(), self._end_from())

    def _end_from(self) -> str:
        return "fetch" if self.end_from_fetch else "list_offsets"

    async def stop(self) -> None:
        consumer, admin, self._consumer, self._admin = self._consumer, self._admin, None, None
        for client in (consumer, admin):
            if client is not None:
                try:
                    await client.stop() if client is consumer else await client.close()
                except Exception as exc:  # closing is best effort
                    log.debug("closing the lag reader's client failed: %r", exc)


@dataclass
class LagMonitor:
    """The worker's periodic lag read (bounded, cheap: one metadata, one OffsetFetch, one
    ListOffsets - plus one Fetch per broker on the embedded broker - per interval). The latest
    snapshot is what ``/metrics`` and ``/connectors/{name}/status`` show, so neither ever waits
    on the broker."""

    reader: LagReader
    group: str
    topics: tuple[str, ...]
    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    latest: GroupLag | None = None
    reads: int = 0
    _failing: bool = field(default=False, repr=False)

    async def refresh(self) -> GroupLag | None:
        """Read once (at most ``timeout_s``); on failure keep the last snapshot, with the error."""
        try:
            snap = await asyncio.wait_for(self.reader.read(self.group, self.topics), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if not self._failing:
                log.warning("reading the lag of group %s failed (%s); showing the last good values", self.group, why)
            self._failing = True
            old = self.latest
            self.latest = GroupLag(self.group, self.topics, old.partitions if old else (), old.at if old else 0.0,
                                   self.reader._end_from(), why)
            await self.reader.stop()  # a fresh connection next time
            return self.latest
        if self._failing:
            log.warning("reading the lag of group %s works again", self.group)
        self._failing = False
        self.latest = snap
        self.reads += 1
        return snap

    async def run(self) -> None:
        """Refresh every ``interval_s`` until cancelled (the worker's shutdown cancels it)."""
        try:
            while True:
                await self.refresh()
                await asyncio.sleep(self.interval_s)
        finally:
            await self.reader.stop()


def monitor_for_pipeline(pipeline: Any, env: Mapping[str, str] | None = None) -> LagMonitor:
    """The worker's monitor: its group (the Faust app id), its source topics, the broker address
    and credentials the worker itself uses (those of its offset-continuity fetcher), and the
    fetch-derived log end where the embedded broker's workaround is installed."""
    from app.worker.offsets import listoffsets_workaround_installed

    fetcher = pipeline.hole_fetcher
    reader = LagReader(fetcher.bootstrap, client_kwargs=fetcher.consumer_kwargs,
                       end_from_fetch=listoffsets_workaround_installed(pipeline.app))
    interval_s, timeout_s = lag_settings_from_env(env)
    return LagMonitor(reader, str(pipeline.app.conf.id), tuple(sorted({s.topic for s in pipeline.topology.sources})),
                      interval_s=interval_s, timeout_s=timeout_s)


def lag_settings_from_env(env: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(interval, timeout) of the lag monitor, from PRISM_LAG_INTERVAL_S / PRISM_LAG_TIMEOUT_S.
    `prism run` calls it with its other start-up checks: the monitor is built once the worker
    runs, and a bad value (NaN was accepted) crashed the worker then instead of refusing the start."""
    from app.errors import ConfigError, ConfigProblems

    values: list[float] = []
    problems: list[ConfigError] = []
    for name, default in ((ENV_INTERVAL, DEFAULT_INTERVAL_S), (ENV_TIMEOUT, DEFAULT_TIMEOUT_S)):
        try:  # both checked: a bad interval hid a bad timeout until the next start
            values.append(_env_seconds(name, default, env))
        except ConfigError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigProblems("; ".join(str(p) for p in problems), problems)
    return values[0], values[1]


async def read_group_lag(bootstrap: str, group: str, topics: Iterable[str] | None = None, *,
                         client_kwargs: Mapping[str, Any] | None = None, end_from_fetch: bool = True,
                         timeout_s: float = 15.0) -> GroupLag:
    """One read for a tool (``prism status --group``). ``topics=None``: every topic the group
    has committed offsets for."""
    reader = LagReader(bootstrap, client_kwargs=client_kwargs, end_from_fetch=end_from_fetch)
    try:
        async def _read() -> GroupLag:
            from aiokafka.errors import KafkaConnectionError

            names = list(topics or ())
            if not names:
                consumer, admin = await reader._clients()
                try:
                    names = sorted({tp.topic for tp in await admin.list_consumer_group_offsets(group)})
                except KafkaConnectionError:
                    return await _committed_topics_one_by_one(reader, consumer, group)
            return await reader.read(group, names)

        return await asyncio.wait_for(_read(), timeout_s)
    finally:
        await reader.stop()


async def _committed_topics_one_by_one(reader: LagReader, consumer: Any, group: str) -> GroupLag:
    """The group's lag on every topic it has committed offsets for, asked partition by partition.

    Why: the embedded broker (Tansu) closes the connection on an OffsetFetch for "all topics"
    (the request without a topic list), so `prism status --group prism-<topology>` - the
    documented command - failed with "Connection ... closed" on the default broker; with
    `--topic` it worked. The same question with every topic's partitions named is answered."""
    cluster = await consumer._client.fetch_all_metadata()
    every = sorted(t for t in cluster.topics() if not t.startswith("__"))
    lag = await reader.read(group, every)
    kept = {p.topic for p in lag.partitions if p.committed is not None}
    return replace(lag, topics=tuple(sorted(kept)), partitions=tuple(p for p in lag.partitions if p.topic in kept))


def read_group_lag_from_env(group: str, topics: Iterable[str] | None = None,
                            note: Callable[[str], None] | None = None) -> GroupLag:
    """``prism status --group``: connect with the usual ``PRISM_BROKER_URL`` / SASL / TLS settings
    (an unreachable broker or a wrong password is one line each), or - without
    ``PRISM_BROKER_URL`` - to the running local broker, said through `note`, as `prism dlq list`
    does (docs/operations.md); it said "no broker configured" while `prism broker start`'s
    broker, the one the worker used, was running."""
    from app.broker.local import cli_bootstrap

    bootstrap, settings = cli_bootstrap(note)
    return asyncio.run(read_group_lag(bootstrap, group, topics,
                                      client_kwargs=settings.aiokafka_kwargs() if settings is not None else None))


__all__ = ["ENV_INTERVAL", "ENV_TIMEOUT", "GroupLag", "LagMonitor", "LagReader", "PartitionLag",
           "lag_settings_from_env", "monitor_for_pipeline", "read_group_lag", "read_group_lag_from_env"]
