"""A Redis client configured the way sinks need it."""

from __future__ import annotations

import contextlib
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


def client(url: str, *, timeout_s: float) -> aioredis.Redis:
    """Binary-safe (`decode_responses=False`: the envelope is bytes), short connect timeout,
    and no client-side retries: the delivery loop owns retrying, with backoff and the outage
    policy, so a retry never happens twice over in two layers."""
    return aioredis.from_url(url, decode_responses=False, socket_connect_timeout=min(timeout_s, 3.0),
                             socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0), health_check_interval=0)


async def close(c: Any) -> None:
    if c is None:
        return
    with contextlib.suppress(Exception):  # closing a dead connection must never mask the real error
        await c.aclose()
