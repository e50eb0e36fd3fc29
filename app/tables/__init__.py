"""RocksDB-backed Faust tables with changelogs: dedup window, sequence tracking, topic counters.

Each table is a small class with a pure-Python core that works on any mutable mapping (a plain
``dict`` in unit tests) and a Faust binding (``Faust*`` subclass) that puts the same core on an
``app.Table`` stored in RocksDB (``store="rocksdb://"``) and replicated to a changelog topic, so
state survives restarts (on the embedded broker thanks to :mod:`app.worker.offsets`).

Partitioning rule (Kafka Streams semantics, enforced by Faust's RocksDB store): inside an agent,
a table read or write touches only the store of the *current event's partition*. So a key must
always arrive on the same partition: dedup keyed by ``message_id`` and sequence tracking keyed by
source work when the input topic is keyed accordingly (or re-keyed with ``group_by``). Counters
put the partition in their key and sum over partitions when read.
"""

from app.tables.base import current_partition, make_table
from app.tables.counters import FaustTopicCounters, TopicCounters
from app.tables.dedup import DedupVerdict, DedupWindow, FaustDedupWindow
from app.tables.sequence import (
    MAX_SEQUENCE,
    FaustSequenceTracker,
    SequenceStatus,
    SequenceTracker,
    SequenceVerdict,
    SourceStats,
)

__all__ = [
    "MAX_SEQUENCE",
    "DedupVerdict",
    "DedupWindow",
    "FaustDedupWindow",
    "FaustSequenceTracker",
    "FaustTopicCounters",
    "SequenceStatus",
    "SequenceTracker",
    "SequenceVerdict",
    "SourceStats",
    "TopicCounters",
    "current_partition",
    "make_table",
]
