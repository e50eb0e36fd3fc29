"""Backend size limits, against the real servers: a record over what the backend accepts goes to
the sink's DLQ as `too_large` at once, and the rest of its batch is written.

Before, such a record failed its whole batch on every retry (forever under `on_outage: wait`).
NATS: a second nats-server started here with a small `max_payload` (config file) (the run's shared server keeps
the default 1 MiB); the sink reads the limit from the server's INFO. Redis and PostgreSQL: the
limits are configured (`max_bulk_bytes`, `max_document_bytes`), set small so the test stays small.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import nats
import pytest

from app.agents.dlq import DlqRecord, error_context
from app.envelope import Layout, new_envelope
from app.security.signing import sign
from app.sinks.base import SinkRecord
from app.sinks.delivery import Delivery, OutagePolicy
from app.sinks.nats import NatsSink
from app.sinks.postgres import PostgresSink
from app.sinks.redis_pubsub import RedisPubSubSink
from app.sinks.redis_stream import RedisStreamSink
from tests.servers import NatsServer
from tests.sinks.conftest import WORKER_KEY, make_records
from tests.support import require

pytestmark = pytest.mark.integration
FAST = OutagePolicy("wait", backoff_initial_s=0.01, backoff_max_s=0.05)
SMALL_MAX_PAYLOAD = 16 * 1024


def big_record(topic: str, size: int) -> SinkRecord:
    """One signed envelope whose payload is `size` bytes, read from `<topic>.v3`."""
    env = new_envelope(topic, {"order_id": "big", "pad": "x" * size}, namespace="order-events")
    return SinkRecord.from_bytes(sign(env, WORKER_KEY, Layout.REVIEWED), topic=topic + ".v3", partition=0, offset=99)


class DlqBox:
    def __init__(self) -> None:
        self.records: list[DlqRecord] = []

    async def __call__(self, recs: Sequence[DlqRecord]) -> None:
        self.records.extend(recs)

    def reasons(self) -> list[str]:
        return [error_context(r.headers)["reason"] for r in self.records]


class _SmallNats(NatsServer):
    name = "nats-small"

    def command(self, binary: str) -> list[str]:
        # max_payload is a config-file setting (this nats-server has no command-line flag for it)
        conf = self.dir / "small.conf"
        conf.write_text(f"max_payload: {SMALL_MAX_PAYLOAD}\n")
        return [*super().command(binary), "-c", str(conf)]


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[str]:
    """A nats-server of this test's own, with `max_payload` 16 KiB."""
    server = _SmallNats(tmp_path)
    require(server.binary() is not None or shutil.which("nats-server") is not None, "nats-server is not installed")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


async def test_nats_reads_max_payload_from_the_server_and_dead_letters_larger_records(small_nats: str) -> None:
    recs = make_records(5)
    topic = recs[0].envelope.topic
    big = big_record(topic, SMALL_MAX_PAYLOAD)  # the payload alone reaches the limit
    stream = f"PRISM_SIZE_{uuid.uuid4().hex[:8].upper()}"
    sink = NatsSink("n", url=small_nats, stream=stream, stream_subjects=[topic])
    dlq = DlqBox()
    result = await Delivery(sink, FAST, dlq=dlq).deliver([recs[0], big, *recs[1:]])
    assert sink.max_item_bytes() == SMALL_MAX_PAYLOAD  # from the server's INFO, not a default
    assert (result.written, result.dlq, result.aborted) == (5, 1, False)
    assert dlq.reasons() == ["too_large"]
    ctx = error_context(dlq.records[0].headers)
    assert "max_payload" in ctx["exception.message"] and str(SMALL_MAX_PAYLOAD) in ctx["exception.message"]
    assert ctx["stage"] == "sink:n" and dlq.records[0].topic == topic + ".dlq"
    nc = await nats.connect(small_nats)
    try:
        assert (await nc.jetstream().stream_info(stream)).state.messages == 5
    finally:
        await nc.close()
    await sink.stop()


async def test_nats_limit_lowered_after_encoding_is_caught_on_the_retry(small_nats: str) -> None:
    """A record that passed the check when its batch was encoded, then refused by the server (its
    max_payload was lowered - a restart with a new config): the failed publish is not retried
    forever; the check runs again after the failure and the record goes to the DLQ."""
    recs = make_records(3)
    topic = recs[0].envelope.topic
    big = big_record(topic, 2 * SMALL_MAX_PAYLOAD)
    sink = NatsSink("n", url=small_nats, stream=f"PRISM_SIZE_{uuid.uuid4().hex[:8].upper()}", stream_subjects=[topic])
    await sink.start()
    real = sink.size_problem
    checks = {"n": 0}

    def stale_first(item: object) -> object:  # the first pass over the batch saw an older, larger limit
        checks["n"] += 1
        return None if checks["n"] <= 4 else real(item)  # type: ignore[arg-type]

    sink.size_problem = stale_first  # type: ignore[method-assign,assignment]
    dlq = DlqBox()
    result = await Delivery(sink, FAST, dlq=dlq).deliver([*recs, big])
    assert (result.written, result.dlq) == (3, 1) and dlq.reasons() == ["too_large"]
    assert sink.stats.failed_attempts == 0  # the refused publish was not counted as an outage retry
    await sink.stop()


async def test_redis_sinks_check_the_configured_bulk_limit(redis_url: str) -> None:
    recs = make_records(4)
    big = big_record(recs[0].envelope.topic, 8 * 1024)
    for sink in (RedisStreamSink("rs", url=redis_url, stream=f"s-{uuid.uuid4().hex[:8]}", max_bulk_bytes=4096),
                 RedisPubSubSink("rp", url=redis_url, channel=f"c-{uuid.uuid4().hex[:8]}", max_bulk_bytes=4096)):
        dlq = DlqBox()
        result = await Delivery(sink, FAST, dlq=dlq).deliver([big, *recs])
        assert (result.written, result.dlq) == (4, 1), sink.kind
        assert dlq.reasons() == ["too_large"], sink.kind
        assert "proto-max-bulk-len" in error_context(dlq.records[0].headers)["exception.message"]
        await sink.stop()


async def test_postgres_checks_the_document_limit(pg_dsn: str, pg_schema: str) -> None:
    recs = make_records(4)
    big = big_record(recs[0].envelope.topic, 8 * 1024)
    sink = PostgresSink("pg", dsn=pg_dsn, schema=pg_schema, max_document_bytes=4096)
    dlq = DlqBox()
    result = await Delivery(sink, FAST, dlq=dlq).deliver([*recs[:2], big, *recs[2:]])
    assert (result.written, result.dlq) == (4, 1) and dlq.reasons() == ["too_large"]
    assert "jsonb" in error_context(dlq.records[0].headers)["exception.message"]
    assert sink.stats.written == 4
    await sink.stop()


def test_the_defaults_are_the_backends_own_limits() -> None:
    from app.topology import PostgresSinkSpec, RedisStreamSinkSpec

    assert RedisStreamSinkSpec(name="r", type="redis-stream").max_bulk_bytes == 512 * 1024 * 1024
    assert PostgresSinkSpec(name="p", type="postgres").max_document_bytes == 268_435_455
    with pytest.raises(ValueError):
        PostgresSinkSpec(name="p", type="postgres", max_document_bytes=2**30)  # jsonb cannot hold it
