"""Message ids: UUIDv7 (RFC 9562), time-ordered so ids sort roughly by publish time and
index well (RFC-031 "UUID v7 recommended"). The stdlib gains `uuid.uuid7` in 3.14; until
then the `uuid6` package provides the RFC implementation."""

from __future__ import annotations

import uuid

from uuid6 import uuid7


def new_message_id() -> str:
    return str(uuid7())


def uuid7_timestamp_ms(message_id: str) -> int | None:
    """The millisecond timestamp embedded in a UUIDv7 id, or None for other ids."""
    try:
        u = uuid.UUID(message_id)
    except ValueError:
        return None
    if u.version != 7:
        return None
    return u.int >> 80


def uuid7_from_seed(ts_ms: int, seed: bytes) -> str:
    """A UUIDv7 whose time part is `ts_ms` and whose 74 "random" bits come from SHA-256(seed).

    For inputs that carry no id of their own, the worker seeds this with the record's
    coordinates (topic/partition/offset): reprocessing the same record after a crash then
    yields the same message id, so dedup turns the redelivery into a duplicate instead of a
    second, differently-named message. Still time-ordered and a valid RFC 9562 UUIDv7.
    """
    import hashlib

    h = int.from_bytes(hashlib.sha256(seed).digest()[:10], "big")  # 80 bits, 74 used
    rand_a = h & 0xFFF
    rand_b = (h >> 12) & ((1 << 62) - 1)
    value = ((ts_ms & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))
