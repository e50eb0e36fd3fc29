"""Topic metadata read the same way on the embedded broker and on Apache Kafka.

aiokafka's ``consumer.partitions_for_topic(t)`` answers from the client's *tracked* metadata:
topics it subscribed to or was asked about. A consumer with a manual assignment tracks none,
so on Apache Kafka it answers ``None`` for a topic that exists (the embedded broker's full
metadata answers happen to fill the cache, which hid this). ``partitions_of`` reads the
partitions from a full metadata fetch instead - which lists every topic, so it never names a
missing one in a Metadata request (the embedded broker auto-creates topics named there).

``await_topics_known`` waits, the same way, until just-created topics are listed (a worker
subscribing before that loses its changelogs from the assignment), and ``track_topics`` makes a
group-less consumer track topics so that its first request finds the leaders.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.client import AIOKafkaClient

log = logging.getLogger(__name__)


async def partitions_of(consumer: Any, topic: str) -> set[int]:
    """The partition ids of ``topic`` from a fresh full metadata fetch; empty when it does not exist.

    ``consumer``: a started ``AIOKafkaConsumer`` (or anything with its ``_client``).
    """
    cluster = await consumer._client.fetch_all_metadata()
    return set(cluster.partitions_for_topic(topic) or ())


async def await_topics_known(client: AIOKafkaClient, topics: Iterable[str], timeout: float) -> list[str]:
    """Wait until a full metadata fetch lists every one of ``topics`` with partitions; return the
    topics still missing after ``timeout`` seconds (empty: all known).

    A full fetch (not one naming the topics) so that a missing topic is never auto-created by
    being named (the embedded broker does that). The client's own metadata is brought up to date
    too, so what the coordinator snapshots at the join includes them.
    """
    wanted = set(topics)
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        try:
            cluster = await client.fetch_all_metadata()
        except Exception as exc:  # the subscribe that follows reports a broker that does not answer
            log.debug("metadata fetch before subscribing failed: %r", exc)
            return sorted(wanted)
        missing = sorted(t for t in wanted if not cluster.partitions_for_topic(t))
        if not missing:
            if any(not client.cluster.partitions_for_topic(t) for t in wanted):
                await client.force_metadata_update()
            return []
        if time.monotonic() + delay > deadline:
            return missing
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def track_topics(consumer: AIOKafkaConsumer, topics: Iterable[str]) -> None:
    """Make ``consumer``'s metadata track ``topics`` (one metadata request when any is new).

    A group-less consumer tracks no topic; aiokafka would learn a partition's leader only after a
    failed first attempt and its retry backoff (100 ms) - see the module docstring.
    """
    client = consumer._client
    wanted = set(topics)
    if wanted - set(client._topics):
        await client.set_topics(sorted(set(client._topics) | wanted))
