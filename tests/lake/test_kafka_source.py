"""Archive tap topic (embedded Kafka-protocol broker) -> ArchiveSink -> Delta: a restart in the
middle resumes exactly after the last committed roll, and the table holds every message once."""

from __future__ import annotations

from collections import Counter

from aiokafka import AIOKafkaProducer
from deltalake import DeltaTable

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.lake.archive import Archive, ArchiveSink, read_archive_file
from app.lake.compact import Compactor
from app.lake.kafka_source import archive_topics
from tests.lake.conftest import make_traffic

TOPIC = "prism.archive.orders"


async def test_archive_tap_topic_to_delta_with_a_restart(spark, tmp_path):
    traffic = make_traffic(300, dup_every=10)
    async with EmbeddedBroker(log_dir=tmp_path / "broker") as broker:
        await ensure_topics(broker.bootstrap, {TOPIC: 2})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
        await producer.start()
        try:
            for rec in traffic.records:  # the records' own partitions; offsets are the broker's
                await producer.send(TOPIC, rec.envelope_bytes, partition=rec.partition)
            await producer.flush()
        finally:
            await producer.stop()
        total = len(traffic.records)
        archive = str(tmp_path / "archive")

        first = ArchiveSink(archive, writer_id="archiver-1", max_file_bytes=20_000)
        got = await archive_topics(broker.bootstrap, [TOPIC], first, max_records=total // 2)
        assert total // 2 <= got < total
        # a restarted archiver (fresh sink, same writer id) continues after the committed rolls
        second = ArchiveSink(archive, writer_id="archiver-1", max_file_bytes=20_000)
        assert second.committed_offsets() == first.committed_offsets()
        rest = await archive_topics(broker.bootstrap, TOPIC, second, max_records=total - got)
        assert got + rest == total

    seen = Counter()
    arch = Archive(archive)
    for m in arch.manifests("archiver-1"):
        for f in m.files:
            t = read_archive_file(arch.store, f.path)
            seen.update(zip(t.column("source_partition").to_pylist(), t.column("source_offset").to_pylist(),
                            strict=True))
    per_partition = Counter(r.partition for r in traffic.records)
    assert seen == Counter({(p, o): 1 for p, n in per_partition.items() for o in range(n)})

    table = str(tmp_path / "table")
    summary = Compactor(spark, archive, table).run()
    assert summary.exit_code == 0
    ids = DeltaTable(table).to_pyarrow_table(columns=["message_id"]).column(0).to_pylist()
    assert len(ids) == len(set(ids)) and set(ids) == traffic.ids
    assert summary.total("duplicates") == total - len(traffic.ids)
