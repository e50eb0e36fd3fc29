"""Per-topic counters (messages in, to ``.v3``, to the DLQ, expired, deduplicated, ...).

Keys are ``"<topic>/<partition>/<counter>"`` and reads sum over partitions. The partition is in
the key because Faust stores a table per partition and routes writes by the current event: a
plain ``topic -> count`` key written from four partitions would be four independent values
under one name, and reading it outside an agent would return whichever partition answered
first. With the partition in the key each value has exactly one writer and the sum is exact,
also after a changelog replay. ``/`` cannot occur in a Kafka topic name, so the key is
unambiguous.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any

from app.tables.base import current_partition, make_table

__all__ = ["FaustTopicCounters", "TopicCounters"]

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_COUNTER_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class TopicCounters:
    """Monotonic counters per (topic, counter name). ``backend``: mapping ``key -> int``."""

    def __init__(self, backend: MutableMapping[str, Any]) -> None:
        self.backend = backend

    @staticmethod
    def key(topic: str, counter: str, partition: int) -> str:
        if not isinstance(topic, str) or not _TOPIC_RE.match(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        if not isinstance(counter, str) or not _COUNTER_RE.match(counter):
            raise ValueError(f"invalid counter name {counter!r} (use [A-Za-z0-9._-], at most 64)")
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"invalid partition {partition!r}")
        return f"{topic}/{partition}/{counter}"

    @staticmethod
    def parse_key(key: str) -> tuple[str, int, str]:
        topic, partition, counter = key.split("/")
        return topic, int(partition), counter

    def incr(self, topic: str, counter: str = "messages", n: int = 1, *, partition: int = 0) -> int:
        """Add ``n`` (>= 0) and return this partition's new value."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"counters only grow: n must be an integer >= 0, got {n!r}")
        key = self.key(topic, counter, partition)
        value = int(self.backend.get(key) or 0) + n
        self.backend[key] = value
        return value

    def get(self, topic: str, counter: str = "messages") -> int:
        """Total over all partitions (on a Faust table: the partitions this worker holds)."""
        self.key(topic, counter, 0)  # validate
        total = 0
        for key, value in self.backend.items():
            t, _, c = self.parse_key(key)
            if t == topic and c == counter:
                total += int(value or 0)
        return total

    def totals(self) -> dict[str, dict[str, int]]:
        """``{topic: {counter: total}}`` over all partitions."""
        out: dict[str, dict[str, int]] = {}
        for key, value in self.backend.items():
            topic, _, counter = self.parse_key(key)
            bucket = out.setdefault(topic, {})
            bucket[counter] = bucket.get(counter, 0) + int(value or 0)
        return out

    def by_partition(self, topic: str, counter: str = "messages") -> dict[int, int]:
        out: dict[int, int] = {}
        for key, value in self.backend.items():
            t, partition, c = self.parse_key(key)
            if t == topic and c == counter:
                out[partition] = int(value or 0)
        return out


class FaustTopicCounters(TopicCounters):
    """:class:`TopicCounters` on a RocksDB-backed Faust table; :meth:`incr` inside an agent."""

    def __init__(self, app: Any, name: str = "topic_counters", *, partitions: int | None = None) -> None:
        self.table = make_table(app, name, partitions=partitions,
                                help="<topic>/<partition>/<counter> -> count")
        super().__init__(self.table)

    def incr(self, topic: str, counter: str = "messages", n: int = 1, *, partition: int | None = None) -> int:
        """Add ``n`` under the current event's partition (``partition`` only outside Faust)."""
        return super().incr(topic, counter, n, partition=current_partition() if partition is None else partition)
