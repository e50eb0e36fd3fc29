"""app/broker/metadata.py: the wait for just-created topics, without a broker (a fake client
whose full metadata fetches list a topic only from the Nth on). On a real Apache Kafka the wait
and `track_topics` run in every worker start of tests/worker/test_offsets.py."""

from __future__ import annotations

import time

from app.broker.metadata import await_topics_known


class _Cluster:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.topics.get(topic)
        return set(range(n)) if n else None


class _LaggingMetadataClient:
    """A client whose full metadata fetches list a just-created topic only from the third on -
    what a worker's consumer sees right after Faust created its changelogs on Apache Kafka."""

    def __init__(self, known_from: int) -> None:
        self.fetches = 0
        self.known_from = known_from
        self.cluster = _Cluster({"source": 4})
        self.updates = 0

    async def fetch_all_metadata(self) -> _Cluster:
        self.fetches += 1
        return _Cluster({"source": 4, **({"source-changelog": 4} if self.fetches >= self.known_from else {})})

    async def force_metadata_update(self) -> bool:
        self.updates += 1
        self.cluster = _Cluster({"source": 4, "source-changelog": 4})
        return True


async def test_subscribe_waits_until_the_metadata_lists_a_just_created_changelog() -> None:
    """Subscribed before the metadata listed the changelog, the join left it out and the first
    table write failed the worker with Faust's PartitionsMismatch (seen in test_demo_e2e[kafka]);
    the wait polls until it is listed and brings the client's own metadata up to date."""
    client = _LaggingMetadataClient(known_from=3)
    assert await await_topics_known(client, {"source", "source-changelog"}, timeout=5) == []  # type: ignore[arg-type]
    assert client.fetches == 3
    assert client.updates == 1 and client.cluster.partitions_for_topic("source-changelog") == {0, 1, 2, 3}


async def test_subscribe_wait_is_bounded_and_names_what_is_missing() -> None:
    client = _LaggingMetadataClient(known_from=10**6)
    started = time.monotonic()
    missing = await await_topics_known(client, {"source", "source-changelog"}, timeout=0.3)  # type: ignore[arg-type]
    assert missing == ["source-changelog"]
    assert time.monotonic() - started < 2
    assert client.updates == 0
