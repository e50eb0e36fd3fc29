"""DedupWindow core (plain dict backend) and the FaustDedupWindow expiry queue logic."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from app.tables.dedup import DedupVerdict, DedupWindow, FaustDedupWindow

from .conftest import FakeApp


def test_first_sighting_is_new_then_duplicate_inside_window() -> None:
    window = DedupWindow({}, window=60)
    assert window.check("m1", now=1000.0) == DedupVerdict(duplicate=False, first_seen=1000.0)
    assert window.check("m1", now=1059.9) == DedupVerdict(duplicate=True, first_seen=1000.0)
    assert window.check("m2", now=1059.9).duplicate is False
    assert window.seen("m1", now=1001) and not window.seen("m3", now=1001)


def test_window_is_measured_from_the_first_sighting() -> None:
    backend: dict[str, Any] = {}
    window = DedupWindow(backend, window=60)
    window.check("m1", now=1000.0)
    window.check("m1", now=1050.0)  # a duplicate does not extend the window
    verdict = window.check("m1", now=1060.0)  # exactly one window later: forgotten
    assert verdict == DedupVerdict(duplicate=False, first_seen=1060.0)
    assert backend["m1"] == [1_060_000, 0]  # re-recorded as a new first sighting


def test_expired_entries_count_as_unseen_before_any_sweep() -> None:
    window = DedupWindow({}, window=10)
    window.check("m1", now=0.0)
    assert not window.seen("m1", now=10.0)
    assert len(window) == 1  # still stored until purged


def test_expired_scan_purge_and_discard() -> None:
    backend: dict[str, Any] = {}
    window = DedupWindow(backend, window=10)
    window.check("old-a", now=0.0, partition=1)
    window.check("old-b", now=5.0, partition=2)
    window.check("new", now=14.0, partition=1)
    assert sorted(window.expired(now=15.0)) == [("old-a", 1), ("old-b", 2)]
    assert window.purge(now=15.0) == 2
    assert list(backend) == ["new"]
    assert window.discard("new", now=15.0) is False  # still live
    assert window.discard("missing", now=15.0) is False


def test_partition_is_recorded_with_the_entry() -> None:
    backend: dict[str, Any] = {}
    DedupWindow(backend, window=10).check("m", now=1.5, partition=3)
    assert backend == {"m": [1500, 3]}


@pytest.mark.parametrize("bad", ["", None, 42, b"bytes"])
def test_invalid_message_ids(bad: Any) -> None:
    with pytest.raises(ValueError, match="message_id must be a non-empty string"):
        DedupWindow({}, window=1).check(bad)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        DedupWindow({}, window=0)


def test_faust_binding_expires_entries_in_their_own_partition_a_few_per_event() -> None:
    app = FakeApp()
    dedup = FaustDedupWindow(app, "dedup", window=10, sweep_interval=30, max_deletes_per_event=2)
    assert [interval for interval, _ in app.timers] == [30]
    for i in range(5):
        dedup.check(f"p0-{i}", now=0.0, partition=0)
    dedup.check("p1-old", now=0.0, partition=1)
    dedup.check("p1-new", now=19.0, partition=1)

    queued = asyncio.run(dedup.scan_expired(now=20.0))
    assert queued == 6 and dedup.pending_expiry == 6

    # An event on partition 1 deletes only partition 1's expired ids.
    assert dedup.check("fresh-1", now=20.0, partition=1).duplicate is False
    assert dedup.entry("p1-old") is None and dedup.entry("p1-new") is not None
    assert all(dedup.entry(f"p0-{i}") is not None for i in range(5))

    # Events on partition 0 delete at most two per event.
    dedup.check("fresh-0a", now=20.0, partition=0)
    assert sum(dedup.entry(f"p0-{i}") is not None for i in range(5)) == 3
    dedup.check("fresh-0b", now=20.0, partition=0)
    dedup.check("fresh-0c", now=20.0, partition=0)
    assert not any(dedup.entry(f"p0-{i}") is not None for i in range(5))
    assert dedup.pending_expiry == 0


def test_faust_binding_does_not_delete_an_id_recorded_again_after_the_scan() -> None:
    dedup = FaustDedupWindow(FakeApp(), window=10, max_deletes_per_event=1)
    dedup.check("a", now=0.0, partition=0)
    dedup.check("m", now=0.0, partition=0)
    asyncio.run(dedup.scan_expired(now=11.0))  # queues a and m
    assert dedup.check("m", now=11.0, partition=0).duplicate is False  # drains "a" only, re-records m
    dedup.check("other", now=12.0, partition=0)  # drains the stale queue entry for m
    assert dedup.entry("m") == (11_000, 0) and dedup.entry("a") is None


def test_record_writes_without_reading_and_restarts_the_window() -> None:
    backend: dict[str, Any] = {}
    window = DedupWindow(backend, window=10)
    window.record("m", now=3.0, partition=2)
    assert backend == {"m": [3000, 2]} and window.seen("m", now=12.9) and not window.seen("m", now=13.0)


def test_faust_binding_stores_raw_bytes_and_reads_the_older_json_encoding() -> None:
    dedup = FaustDedupWindow(FakeApp(), window=10)
    dedup.record("new-id", now=1.0, partition=3)
    assert dedup.table == {b"new-id": (1000).to_bytes(8, "big") + (3).to_bytes(4, "big")}
    # an entry written by a version that used Faust's JSON codec: still seen, and still expired
    dedup.table[b'"old-id"'] = b"[1000, 1]"
    assert dedup.check("new-id", now=2.0, partition=3).duplicate
    assert asyncio.run(dedup.scan_expired(now=20.0)) == 2
    dedup.check("fresh", now=20.0, partition=1)  # drains partition 1's queue: the old entry
    assert b'"old-id"' not in dedup.table and dedup.entry("new-id") == (1000, 3)


class _Md:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.topic_partition, self.partition, self.offset = (topic, partition), partition, offset


class _Builder:
    def __init__(self, room: int) -> None:
        self.records: list[tuple[bytes, bytes, Any, Any]] = []
        self.room = room
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def append(self, *, timestamp: Any, key: bytes, value: bytes, headers: Any) -> Any:
        assert not self.closed, "appended to a closed batch"
        if len(self.records) >= self.room:
            return None
        self.records.append((key, value, timestamp, headers))
        return object()


class _Cluster:
    """The producer's cached metadata: `known` partitions per topic until a forced update."""

    def __init__(self, known: set[int] | None, actual: set[int]) -> None:
        self.known, self.actual, self.updates = known, actual, 0

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.known

    async def force_metadata_update(self) -> bool:
        self.updates += 1
        self.known = set(self.actual)
        return True


class _Producer:
    """aiokafka's batch API beneath Faust's producer; the test settles each batch's future."""

    def __init__(self, room: int = 100, known: set[int] | None = frozenset(range(8))) -> None:  # type: ignore[assignment]
        self.sent: list[tuple[str, list[tuple[bytes, bytes, Any, Any]], int, asyncio.Future[Any]]] = []
        self.closed: list[bool] = []  # per sent batch: handed over complete (no linger in the accumulator)?
        self.room = room
        self.cluster = _Cluster(None if known is None else set(known), set(range(8)))
        self.client = SimpleNamespace(cluster=self.cluster, force_metadata_update=self.cluster.force_metadata_update)

    def _ensure_producer(self) -> _Producer:
        return self

    def create_batch(self) -> _Builder:
        return _Builder(self.room)

    async def send_batch(self, batch: _Builder, topic: str, *, partition: int) -> Any:
        known = self.cluster.known
        assert known is not None and partition in known, "Unrecognized partition"  # as aiokafka does
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sent.append((topic, batch.records, partition, fut))
        self.closed.append(batch.closed)
        return fut


def test_a_stale_metadata_cache_is_refreshed_before_the_changelog_is_sent() -> None:
    """A worker that cached the changelog topic before all its partitions existed failed every
    flush with "Unrecognized partition" until aiokafka's 5-minute metadata refresh (seen in the
    rebalance test): the flush refreshes the cache once when it lacks a partition."""
    app = FakeApp()
    dedup = FaustDedupWindow(app, window=10)
    dedup.table.changelog_topic = SimpleNamespace(get_topic_name=lambda: "app-dedup-changelog")
    dedup.table.set_persisted_offset = lambda tp, offset: None
    producer = app.producer = _Producer(known={0})  # partitions 1-3 not in the cache yet
    dedup._app = app

    async def scenario() -> None:
        for i, part in enumerate((0, 3)):
            dedup.record(f"id-{i}", now=5.0, partition=part)
        await dedup.flush_changelog(wait=False)
        assert producer.cluster.updates == 1 and sorted(s[2] for s in producer.sent) == [0, 3]
        dedup.record("id-9", now=5.0, partition=3)
        await dedup.flush_changelog(wait=False)
        assert producer.cluster.updates == 1  # the cache knows the partition now: no second refresh

    asyncio.run(scenario())


def _keys(sent: tuple[str, list[tuple[bytes, bytes, Any, Any]], int, Any]) -> list[bytes]:
    return [r[0] for r in sent[1]]


def test_deferred_changelog_requeues_failed_sends_and_persists_acked_offsets() -> None:
    from types import SimpleNamespace

    from app.tables.dedup import _ENTRY

    app = FakeApp()
    dedup = FaustDedupWindow(app, window=10)
    persisted: dict[Any, int] = {}
    dedup.table.changelog_topic = SimpleNamespace(get_topic_name=lambda: "app-dedup-changelog")
    dedup.table.set_persisted_offset = persisted.__setitem__  # FakeTable is its own store
    producer = app.producer = _Producer(room=2)
    dedup._app = app

    async def scenario() -> None:
        for i, part in enumerate((0, 1, 1, 1)):
            dedup.record(f"id-{i}", now=5.0, partition=part)
        assert dedup.unsent == 4 and dedup.entry("id-2") == (5000, 1)  # in the store already
        await dedup.flush_changelog(wait=False)
        # one batch per changelog partition, split when full; records as `send` wrote them
        assert dedup.unsent == 0 and [(_keys(s), s[2]) for s in producer.sent] == [
            ([b"id-0"], 0), ([b"id-1", b"id-2"], 1), ([b"id-3"], 1)]
        assert producer.sent[0][1][0] == (b"id-0", _ENTRY.pack(5000, 0), None, [])
        # handed over complete: an open batch waits out the producer's linger in the accumulator
        # and misses the produce request the sender builds meanwhile (a request of its own)
        assert producer.closed == [True, True, True]
        producer.sent[0][3].set_result(_Md("app-dedup-changelog", 0, 7))
        producer.sent[1][3].set_exception(RuntimeError("broker gone"))
        producer.sent[2][3].set_result(_Md("app-dedup-changelog", 1, 3))
        await asyncio.sleep(0)  # done callbacks
        assert dedup.unsent == 2  # the failed batch's records, queued again
        await dedup.flush_changelog(wait=False)  # resends them, stores the acknowledged offsets
        assert persisted == {("app-dedup-changelog", 0): 7, ("app-dedup-changelog", 1): 3}
        assert _keys(producer.sent[3]) == [b"id-1", b"id-2"] and dedup.unsent == 0
        producer.sent[3][3].set_result(_Md("app-dedup-changelog", 1, 4))  # its first record's offset
        await dedup.flush_changelog()  # wait=True: nothing to send, offsets stored
        assert persisted[("app-dedup-changelog", 1)] == 5  # the batch's last record: 4 + 2 - 1

    asyncio.run(scenario())


def test_changelog_records_not_handed_over_are_kept_for_the_next_flush() -> None:
    from types import SimpleNamespace

    class Refusing(_Producer):
        async def send_batch(self, batch: _Builder, topic: str, *, partition: int) -> Any:
            if partition == 1:
                raise RuntimeError("producer closed")
            return await super().send_batch(batch, topic, partition=partition)

    app = FakeApp()
    dedup = FaustDedupWindow(app, window=10)
    dedup.table.changelog_topic = SimpleNamespace(get_topic_name=lambda: "app-dedup-changelog")
    producer = app.producer = Refusing()
    dedup._app = app

    async def scenario() -> None:
        for i, part in enumerate((0, 1, 2, 1)):
            dedup.record(f"id-{i}", now=5.0, partition=part)
        try:
            await dedup.flush_changelog(wait=False)
            raise AssertionError("no error")
        except RuntimeError as exc:
            assert "producer closed" in str(exc)
        # partition 0 went out; partition 1's records and partition 2's (not reached) wait
        assert [_keys(s) for s in producer.sent] == [[b"id-0"]]
        assert sorted(k for k, _, _ in dedup._unsent) == [b"id-1", b"id-2", b"id-3"]

    asyncio.run(scenario())


def test_faust_binding_reads_and_writes_the_partitions_rocksdb_directly(tmp_path: Any) -> None:
    """The worker's per-message read and write go to the partition's RocksDB database itself;
    what they store is exactly what Faust's own store path reads (inside an event of that
    partition) and what the window's other methods see."""
    import weakref

    import faust
    from faust.streams import _current_event

    from app.worker.batch_source import CurrentMessage

    app = faust.App(f"t-dedup-{tmp_path.name}", broker="kafka://localhost:1", store="rocksdb://", datadir=tmp_path)
    dedup = FaustDedupWindow(app, "dedup", window=10, partitions=4)
    assert type(dedup.table.data).__module__ == "faust.stores.rocksdb"
    dedup.record("a", now=1.0, partition=2)
    assert dedup.seen("a", now=2.0, partition=2)
    assert not dedup.seen("a", now=2.0, partition=1)  # another partition's database
    assert not dedup.seen("a", now=11.0, partition=2)  # expired: the window is [1, 11)
    assert not dedup.seen("b", now=2.0, partition=2)

    class _Msg:
        topic, partition = "src", 2

    current = CurrentMessage(_Msg())  # held: the context keeps only a weak reference
    token = _current_event.set(weakref.ref(current))
    try:  # Faust's path, routed by the current event, finds the same bytes
        assert dedup.table.data.get(b"a") == (1000).to_bytes(8, "big") + (2).to_bytes(4, "big")
        assert dedup.check("a", now=3.0, partition=2).duplicate  # reads through the store
        dedup.table.data[b"c"] = (2000).to_bytes(8, "big") + (2).to_bytes(4, "big")  # written Faust's way
    finally:
        _current_event.reset(token)
    assert dedup.seen("c", now=3.0, partition=2) and not dedup.seen("c", now=3.0, partition=0)


def test_record_many_is_record_for_each_id() -> None:
    backend: dict[str, Any] = {}
    DedupWindow(backend, window=10).record_many([("a", 0), ("b", 3)], now=2.0)
    assert backend == {"a": [2000, 0], "b": [2000, 3]}
    with pytest.raises(ValueError):
        DedupWindow({}, window=10).record_many([("ok", 0), ("", 1)], now=1.0)


def test_faust_binding_records_a_batch_with_one_write_per_partition(tmp_path: Any) -> None:
    """The worker records a batch's ids with one RocksDB write batch per partition: the same
    bytes in the same partition databases as one `record` per id, the changelog records queued
    the same way, and expired ids drained with the quota of as many single records."""
    import faust

    def window(name: str) -> FaustDedupWindow:
        app = faust.App(f"t-many-{name}-{tmp_path.name}", broker="kafka://localhost:1", store="rocksdb://",
                        datadir=tmp_path / name)
        return FaustDedupWindow(app, "dedup", window=10, partitions=4, max_deletes_per_event=1)

    ids = [(f"id-{i}", i % 3) for i in range(9)]
    one, many = window("one"), window("many")
    for mid, part in ids:
        one.record(mid, now=5.0, partition=part)
    many.record_many(ids, now=5.0)
    for mid, part in ids:
        raw = many._partition_db(part).get(mid.encode())
        assert raw is not None and raw == one._partition_db(part).get(mid.encode())
        assert many.seen(mid, now=6.0, partition=part) and not many.seen(mid, now=6.0, partition=3)
    assert sorted(many._unsent) == sorted(one._unsent) and many.unsent == 9

    with pytest.raises(ValueError):
        many.record_many([("", 0)], now=1.0)


def test_faust_binding_record_many_drains_expired_ids_with_the_quota_of_single_records() -> None:
    dedup = FaustDedupWindow(FakeApp(), "dedup", window=10, max_deletes_per_event=1)
    dedup.record_many([("old-0", 0), ("old-1", 0), ("old-2", 0), ("old-p1", 1)], now=0.0)
    assert asyncio.run(dedup.scan_expired(now=10.5)) == 4
    dedup.record_many([("new-0", 0), ("new-1", 0)], now=10.5)  # two records on partition 0: quota 2 x 1
    assert sum(dedup.entry(f"old-{i}") is None for i in range(3)) == 2
    assert dedup.entry("old-p1") is not None and dedup.pending_expiry == 2  # partition 1 untouched
    assert dedup.entry("new-0") == (10_500, 0) and dedup.unsent == 6


def test_exactly_once_stages_in_the_transaction_and_applies_only_after_the_commit() -> None:
    """processing_guarantee exactly_once (app/worker/transactions.py): the batch's ids - and the
    tombstones of expired ids due on those partitions, before them - go to the changelog through the
    transaction's producer and reach the local store only with `apply_staged`, after the commit; the
    persisted offset is then the commit marker's (the last record's + 1). An aborted batch is simply
    never applied: the store does not remember ids whose outputs were rolled back."""
    from types import SimpleNamespace

    dedup = FaustDedupWindow(FakeApp(), window=10, max_deletes_per_event=1)
    persisted: dict[Any, int] = {}
    dedup.table.changelog_topic = SimpleNamespace(get_topic_name=lambda: "app-dedup-changelog")
    dedup.table.set_persisted_offset = persisted.__setitem__
    dedup.record_many([("old", 1)], now=0.0)
    assert asyncio.run(dedup.scan_expired(now=10.5)) == 1
    producer = _Producer(room=2)

    async def scenario() -> None:
        rows = dedup.stage_many([("a", 0), ("b", 1), ("old", 1)], now=10.5)
        assert [(k, v is None, p) for k, v, p in rows] == [
            (b"old", True, 1), (b"a", False, 0), (b"b", False, 1), (b"old", False, 1)]
        assert dedup.entry("a") is None and dedup.entry("old") == (0, 1)  # nothing applied yet
        sent = await dedup.send_staged(producer, rows)
        assert [(s[2], _keys(s)) for s in producer.sent] == [(1, [b"old", b"b"]), (1, [b"old"]), (0, [b"a"])]
        assert producer.sent[0][1][0][1] is None  # a tombstone
        producer.sent[0][3].set_result(_Md("app-dedup-changelog", 1, 10))
        producer.sent[1][3].set_result(_Md("app-dedup-changelog", 1, 12))
        producer.sent[2][3].set_result(_Md("app-dedup-changelog", 0, 4))
        dedup.apply_staged(rows, sent)  # the transaction committed
        assert dedup.entry("a") == (10_500, 0) and dedup.entry("old") == (10_500, 1)
        assert persisted == {("app-dedup-changelog", 1): 13, ("app-dedup-changelog", 0): 5}
        aborted = dedup.stage_many([("c", 0)], now=11.0)
        await dedup.send_staged(producer, aborted)  # ... and the transaction aborts: never applied
        assert dedup.entry("c") is None

    asyncio.run(scenario())
