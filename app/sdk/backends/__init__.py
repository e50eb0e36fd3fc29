"""SDK backends, one per URL scheme: the same client API over Kafka, Redis Streams, NATS
JetStream and PostgreSQL. See `base` for the contract and each module for its URL
parameters and acknowledgement model."""

from __future__ import annotations

from urllib.parse import urlsplit

from app.errors import ConfigError
from app.sdk.backends.base import Backend, redact_url

SCHEMES = {
    "kafka": ("app.sdk.backends.kafka", "KafkaBackend"),
    "redis": ("app.sdk.backends.redis", "RedisBackend"),
    "rediss": ("app.sdk.backends.redis", "RedisBackend"),
    "nats": ("app.sdk.backends.nats", "NatsBackend"),
    "postgresql": ("app.sdk.backends.postgres", "PostgresBackend"),
    "postgres": ("app.sdk.backends.postgres", "PostgresBackend"),
}


def backend_for_url(url: str) -> Backend:
    """The backend a URL names (not yet connected). Raises `ConfigError` for other schemes."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"unsupported backend URL scheme {scheme or '(none)'!r}", path=redact_url(url),
                          hint="use kafka://host:port, redis://host:port/db, nats://host:port or "
                               "postgresql://user@host:port/db")
    module, name = SCHEMES[scheme]
    cls = getattr(__import__(module, fromlist=[name]), name)
    return cls(url)


__all__ = ["SCHEMES", "Backend", "backend_for_url"]
