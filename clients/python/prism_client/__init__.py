"""Prism client SDK (RFC-031 "Developer APIs"): publish and subscribe with signed, validated
Prism envelopes over Kafka, Redis Streams, NATS JetStream and PostgreSQL, chosen by URL.

    from prism_client import PrismClient, PrismPublishOptions

    async with PrismClient("kafka://127.0.0.1:9092", namespace="order-events") as client:
        await client.publish("orders.created", {"order_id": 42}, PrismPublishOptions(priority=8))

This is the ``prism-client`` distribution. Its modules are the Prism worker's own files under
another name: what the worker's tree calls ``app.sdk``, ``app.envelope``, ``app.security`` ...
is ``prism_client.sdk``, ``prism_client.envelope``, ``prism_client.security`` ... here, and the
names below are those of ``prism_client.sdk``. Why the other name: a service with its own
``app`` package (the FastAPI convention) can install it. docs/sdk.md has the whole story.
"""

from . import sdk as _sdk
from .sdk import *  # noqa: F403 - the SDK's public names, listed once, in sdk/__init__.py
from .sdk.version import SDK_VERSION

#: The installed prism-client version (the worker's prism-envelope has the same one).
__version__ = SDK_VERSION.partition("/")[2]

__all__ = [*_sdk.__all__, "SDK_VERSION", "__version__"]
