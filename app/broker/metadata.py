"""Topic metadata read the same way on the embedded broker and on Apache Kafka.

aiokafka's ``consumer.partitions_for_topic(t)`` answers from the client's *tracked* metadata:
topics it subscribed to or was asked about. A consumer with a manual assignment tracks none,
so on Apache Kafka it answers ``None`` for a topic that exists (the embedded broker's full
metadata answers happen to fill the cache, which hid this). ``partitions_of`` reads the
partitions from a full metadata fetch instead - which lists every topic, so it never names a
missing one in a Metadata request (the embedded broker auto-creates topics named there).
"""

from __future__ import annotations

from typing import Any


async def partitions_of(consumer: Any, topic: str) -> set[int]:
    """The partition ids of ``topic`` from a fresh full metadata fetch; empty when it does not exist.

    ``consumer``: a started ``AIOKafkaConsumer`` (or anything with its ``_client``).
    """
    cluster = await consumer._client.fetch_all_metadata()
    return set(cluster.partitions_for_topic(topic) or ())
