"""Kafka Connect-style sinks: topology output topics -> Redis, PostgreSQL, NATS, S3.

    from app.sinks.runner import register_sinks
    agents = register_sinks(pipeline.app, topology, bootstrap=bootstrap)

Modules: `base` (the `Sink` contract, `SinkRecord`, stats), `delivery` (retries, outage
policy, DLQ), one module per backend (`redis_pubsub`, `redis_stream`, `postgres`, `nats`,
`s3`; the last three and Redis Streams also have a reading side), and `runner` (one Faust
agent per sink). See docs/sinks.md.
"""

from app.sinks.base import Sink, SinkRecord, SinkStats, WriteOutcome
from app.sinks.delivery import Delivery, DeliveryResult, OutagePolicy

__all__ = ["Delivery", "DeliveryResult", "OutagePolicy", "Sink", "SinkRecord", "SinkStats", "WriteOutcome"]
