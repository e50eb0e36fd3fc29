"""The Prism client SDK (RFC-031 "Developer APIs"): one publish/subscribe API over Kafka,
Redis Streams, NATS JetStream and PostgreSQL, chosen by URL.

    from app.sdk import PrismClient, PrismPublishOptions

    async with PrismClient("redis://127.0.0.1:6379/0", namespace="order-events") as client:
        msg_id = await client.publish("orders.created", {"order_id": 42},
                                      PrismPublishOptions(correlation_id="req-1", priority=8))
        async with client.subscribe("orders.created", group="billing") as sub:
            async for msg in sub:
                handle(msg.payload()); await msg.ack()

`SyncPrismClient` is the blocking twin. Migration helpers (dual-write, dual-read, the live
Redis -> Kafka move) are in `app.sdk.migration`; docs/sdk.md has the whole story.
"""

from .client import PrismClient, Subscription, UnreadableMessage
from .options import EncryptionOptions, PrismPublishOptions, TraceContext
from .pii import PiiAccessWarning
from .received import ReceivedEnvelope
from .sync import SyncPrismClient, SyncReceivedEnvelope, SyncSubscription

__all__ = [
    "EncryptionOptions",
    "PiiAccessWarning",
    "PrismClient",
    "PrismPublishOptions",
    "ReceivedEnvelope",
    "Subscription",
    "SyncPrismClient",
    "SyncReceivedEnvelope",
    "SyncSubscription",
    "TraceContext",
    "UnreadableMessage",
]
