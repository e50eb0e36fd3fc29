"""SDK backends, one per URL scheme: the same client API over Kafka, Redis Streams, NATS
JetStream and PostgreSQL. See `base` for the contract and each module for its URL
parameters and acknowledgement model."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from urllib.parse import urlsplit

from ...errors import ConfigError
from .base import Backend, redact_url

#: scheme -> (module in this package, class). Module names are relative so that the same
#: source serves `app.sdk` (the worker's tree) and `prism_client.sdk` (the client distribution);
#: each backend is imported on first use, so a client installs only the drivers it uses.
SCHEMES = {
    "kafka": ("kafka", "KafkaBackend"),
    "redis": ("redis", "RedisBackend"),
    "rediss": ("redis", "RedisBackend"),
    "nats": ("nats", "NatsBackend"),
    "postgresql": ("postgres", "PostgresBackend"),
    "postgres": ("postgres", "PostgresBackend"),
}

#: backend module -> (the driver package it imports, the distribution that has it, the prism-client
#: extra that installs it). The client distribution installs only the Kafka driver by default;
#: a missing one is reported when the client is created, with the command that fixes it, instead
#: of as a bare ModuleNotFoundError on the first publish.
DRIVERS = {
    "kafka": ("aiokafka", "aiokafka", None),
    "redis": ("redis", "redis", "redis"),
    "nats": ("nats", "nats-py", "nats"),
    "postgres": ("psycopg", "psycopg", "postgres"),
}


def backend_for_url(url: str) -> Backend:
    """The backend a URL names (not yet connected). Raises `ConfigError` for other schemes."""
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:  # "Invalid IPv6 URL": a traceback from `prism audit --url` before
        raise ConfigError(f"not a usable backend URL: {exc}", path=redact_url(url),
                          hint="write scheme://host:port, an IPv6 host in brackets (kafka://[::1]:9092)") from None
    if scheme not in SCHEMES:
        raise ConfigError(f"unsupported backend URL scheme {scheme or '(none)'!r}", path=redact_url(url),
                          hint="use kafka://host:port, redis://host:port/db, nats://host:port or "
                               "postgresql://user@host:port/db")
    module, name = SCHEMES[scheme]
    driver, dist, extra = DRIVERS[module]
    if find_spec(driver) is None:
        install = f"pip install 'prism-client[{extra}]' (or pip install {dist})" if extra else f"pip install {dist}"
        raise ConfigError(f"the {scheme}:// backend needs the {dist} package, which is not installed",
                          path=redact_url(url), hint=install)
    cls = getattr(import_module(f"{__name__}.{module}"), name)
    return cls(url)


__all__ = ["DRIVERS", "SCHEMES", "Backend", "backend_for_url"]
