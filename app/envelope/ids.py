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
