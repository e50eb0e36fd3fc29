"""Object storage sink against moto's S3-compatible server (its real HTTP API on a loopback
port): byte-exact objects with prism-* metadata, write-once idempotency, and the DLQ policy
when the store is unreachable."""

from __future__ import annotations

import boto3
import pytest

from app.bindings import s3 as s3b
from app.security.signing import VerificationKeys, verify
from app.sinks.delivery import Delivery, OutagePolicy
from app.sinks.s3 import S3Sink
from tests.sinks.conftest import WORKER_KEY, make_records

pytestmark = pytest.mark.integration


async def test_objects_round_trip_byte_exact_and_replays_write_nothing(s3_endpoint: str) -> None:
    recs = make_records(25)
    sink = S3Sink("s3", bucket="prism-sink-test", endpoint=s3_endpoint, create_bucket=True, prefix="archive")
    await sink.start()
    await sink.write_batch(recs)
    await sink.write_batch(recs[:10])  # replay: If-None-Match refuses, counted as duplicates
    assert await sink.healthy()
    await sink.stop()
    assert sink.stats.written == 25 and sink.stats.duplicates == 10 and sink.conditional_writes

    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    listed = client.list_objects_v2(Bucket="prism-sink-test", Prefix="archive/")
    assert listed["KeyCount"] == 25
    for r in recs:
        key = s3b.object_key(r.envelope, prefix="archive")
        obj = client.get_object(Bucket="prism-sink-test", Key=key)
        body = obj["Body"].read()
        assert body == r.raw  # the signed bytes, unchanged
        assert obj["ContentType"].startswith("application/protobuf")
        env = s3b.decode(body, obj["Metadata"], key=key)  # metadata cross-checked against the envelope
        assert env.message_id == r.message_id and obj["Metadata"]["prism-message-id"] == r.message_id
    verify(body, VerificationKeys.of([WORKER_KEY]))


async def test_missing_bucket_is_an_error_unless_created(s3_endpoint: str) -> None:
    sink = S3Sink("s3", bucket="prism-no-such-bucket", endpoint=s3_endpoint)
    with pytest.raises(Exception, match="cannot connect or prepare"):
        await sink.start()
    assert not await sink.healthy()
    await sink.stop()


async def test_unreachable_store_sends_the_batch_to_the_dlq_after_max_attempts(s3_endpoint: str) -> None:
    recs = make_records(4)
    dead: list = []

    async def dlq(batch) -> None:
        dead.extend(batch)

    # A loopback port nothing listens on: every attempt fails fast with a connection error.
    sink = S3Sink("s3", bucket="prism-sink-test", endpoint="http://127.0.0.1:9", timeout_s=2)
    policy = OutagePolicy("dlq", max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02)
    result = await Delivery(sink, policy, dlq=dlq).deliver(recs)
    await sink.stop()
    assert result.dlq == 4 and result.written == 0 and not result.aborted
    assert sink.stats.failed_attempts == 3 and sink.stats.dlq == 4 and sink.stats.in_outage
    assert [r.value for r in dead] == [r.raw for r in recs]
    h = dict(dead[0].headers)
    assert dead[0].topic == recs[0].topic.removesuffix(".v3") + ".dlq"
    assert h["prism.errors.reason"] == b"sink_failed" and h["prism.errors.attempts"] == b"3"
    assert h["prism.errors.class.name"] == b"app.sinks.s3.S3Sink"
