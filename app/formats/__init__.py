"""Input shapes -> envelope: detection and normalization of everything producers send today.

    from app.formats import normalize

    result = normalize(record.value, record.headers, topic=record.topic, namespace="order-events")
    result.envelope   # a valid Envelope, payload = the producer's bytes
    result.shape      # InputShape.KAFKA_HEADERS, CLOUDEVENT_BINARY, LNMP_TEXT, ...
    result.notes      # what had to be generated or kept aside

Modules: `detect` (precedence + normalize), `legacy` (Kafka/NATS headers, Redis JSON, raw),
`cloudevents` (both Kafka content modes, both directions), `lnmp` (the LNMP envelope codec),
`lnmp_envelope` (LNMP <-> Prism), `lnmp_bindings` (LNMP Kafka/HTTP/gRPC headers).
Mapping tables and the detection precedence: docs/formats.md.
"""

from .detect import InputShape, NormalizeResult, detect, normalize

__all__ = ["InputShape", "NormalizeResult", "detect", "normalize"]
