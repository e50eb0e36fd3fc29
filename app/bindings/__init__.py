"""Backend bindings (RFC-031 "Backend-Specific Serialization"): how one envelope is laid out
on each backend, as pure encode/decode pairs with no client and no I/O. The live sinks and
sources call these; tests exercise them without any server.

    from app.bindings import kafka
    rec = kafka.encode(env, kafka.layout_for_topic("orders.created.v3"), key=input_key)
    await producer.send("orders.created.v3", rec.value, key=rec.key, headers=rec.headers,
                        timestamp_ms=rec.timestamp_ms)
    same = kafka.decode(consumer_record)   # header copies cross-checked

Modules: `kafka`, `nats`, `redis` (Pub/Sub bytes and Streams fields), `postgres` (JSONB row
and DDL), `s3` (object key, body, metadata), `tracecontext` (W3C headers), `partitioner`
(Kafka's key placement, the key hash compiled when `prism_native` is in use). Every decode
raises `app.errors.BindingError` when a header copy disagrees with the envelope, and the
codec's `EnvelopeError` subclasses for malformed bytes. See docs/bindings.md.
"""
