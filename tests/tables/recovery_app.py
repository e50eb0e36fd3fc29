"""Faust worker used by test_recovery.py (run as ``python -m app.worker.faust_app
tests.tables.recovery_app:build``).

Configuration comes from the environment (the test sets it per run):

* ``RT_APP_ID``, ``RT_BOOTSTRAP``, ``RT_DATA_DIR``, ``RT_TOPIC``, ``RT_PARTITIONS``
* ``RT_SNAPSHOT``: JSON file the worker (re)writes with its tables' contents whenever processing
  has been idle for a 0.1 s tick and something changed since the last write
* ``RT_WORKAROUND``: ``0`` disables the ListOffsets workaround (to show the broker bug)
* ``RT_RECOVERY``: ``stock`` uses Faust's own table recovery instead of app/tables/recovery.py
* ``RT_STANDBYS``: ``table_standby_replicas`` (default 0)
* ``RT_COMMIT_INTERVAL``: ``broker_commit_interval`` in seconds (default 0.5)

The snapshot also says what the worker holds and what aiokafka fetches (``sources``: the source
partitions assigned, ``changelogs``: the changelog partitions assigned, ``paused``: the partitions
paused in aiokafka), and is written again whenever that changes (a rebalance).

Every record is ``key = "k<n>"``, ``value = {"id": <message id>, "seq": <per-key sequence>}``.
The agent updates all four kinds of table: a plain per-key count, topic counters, per-source
sequence tracking and the dedup window. Timers only start after table recovery is complete,
so the first snapshot of a run shows exactly what recovery restored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import faust
from faust.types import TP

from app.tables import FaustDedupWindow, FaustSequenceTracker, FaustTopicCounters, make_table
from app.worker.faust_app import make_app


def build() -> faust.App:
    env = os.environ
    topic_name = env["RT_TOPIC"]
    partitions = int(env["RT_PARTITIONS"])
    snapshot_path = Path(env["RT_SNAPSHOT"])
    app = make_app(
        env["RT_APP_ID"], env["RT_BOOTSTRAP"], env["RT_DATA_DIR"],
        partitions=partitions, embedded=env.get("RT_WORKAROUND", "1") == "1",
        broker_commit_interval=float(env.get("RT_COMMIT_INTERVAL", "0.5")),
        standby_replicas=int(env.get("RT_STANDBYS", "0")),
        **({"TableManager": "faust.tables:TableManager"} if env.get("RT_RECOVERY") == "stock" else {}),
    )
    source = app.topic(topic_name, partitions=partitions, key_serializer="raw", value_serializer="json")
    counts = make_table(app, "counts", partitions=partitions)
    counters = FaustTopicCounters(app, "topic_counters", partitions=partitions)
    sequences = FaustSequenceTracker(app, "sequences", partitions=partitions)
    dedup = FaustDedupWindow(app, "dedup", window=3600, partitions=partitions)
    # the worker's path: seen -> record (store only) -> flush_changelog (direct sends)
    emitted = FaustDedupWindow(app, "emitted", window=3600, partitions=partitions)
    state: dict[str, Any] = {"processed": 0, "duplicates": 0, "not_in_order": 0, "written_at": None}

    @app.agent(source)
    async def count(stream: Any) -> None:
        async for event in stream.events():
            key = event.key.decode()
            value = event.value
            counts[key] = (counts.get(key) or 0) + 1
            counters.incr(topic_name, "messages")
            if not sequences.observe(key, int(value["seq"])).in_order:
                state["not_in_order"] += 1
            if dedup.check(value["id"]).duplicate:
                state["duplicates"] += 1
            if not emitted.seen(value["id"]):
                emitted.record(value["id"])
                if emitted.unsent >= 100:  # in batches, as the worker flushes once per batch
                    await emitted.flush_changelog()
            state["processed"] += 1

    def fetch_state() -> tuple[frozenset[tuple[str, int]], frozenset[tuple[str, int]]] | None:
        """(assigned, paused in aiokafka) - aiokafka's state read from outside its thread (None
        when a rebalance changed it under the read: the next tick reads again)."""
        client = app.consumer._thread._consumer
        try:
            assigned = frozenset((tp.topic, tp.partition) for tp in app.consumer.assignment())
            paused = frozenset() if client is None else frozenset(
                (tp.topic, tp.partition) for tp in client._subscription.paused_partitions())
        except RuntimeError:
            return None
        return assigned, paused

    @app.timer(0.1)
    async def snapshot() -> None:
        # Write only when idle (nothing processed since the last tick): reading every table is
        # not free, and a test only needs the state once processing has settled.
        processed = state["processed"]
        idle, state["last_seen"] = processed == state.get("last_seen"), processed
        fetching = fetch_state()
        if not idle or fetching is None or state["written_at"] == (processed, fetching):
            return
        await emitted.flush_changelog()  # the tail of the last batch
        state["written_at"] = (processed, fetching)
        data = {
            "sources": sorted(p for t, p in fetching[0] if t == topic_name),
            "changelogs": sorted([t, p] for t, p in fetching[0] if t in app.tables.changelog_topics),
            "paused": sorted([t, p] for t, p in fetching[1]),
            "pid": os.getpid(),
            "processed_this_run": state["processed"],
            "duplicates_this_run": state["duplicates"],
            "not_in_order_this_run": state["not_in_order"],
            "counts": dict(counts.items()),
            "counter_total": counters.get(topic_name, "messages"),
            "counter_by_partition": {str(k): v for k, v in counters.by_partition(topic_name).items()},
            "sequences": {k: v.to_value() for k, v in sequences.snapshot().items()},
            "dedup_ids": sum(1 for _ in dedup.table),
            "emitted_ids": sum(1 for _ in emitted.table),
            "emitted_persisted_offsets": sorted(
                o for p in range(partitions)
                if (o := emitted.table.data.persisted_offset(
                    TP(emitted.table.changelog_topic.get_topic_name(), p))) is not None),
        }
        tmp = snapshot_path.with_name(snapshot_path.name + ".tmp")
        tmp.write_text(json.dumps(data, sort_keys=True))
        tmp.replace(snapshot_path)

    return app
