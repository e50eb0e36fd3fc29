"""Message ids for the publish hot path: RFC 9562 UUIDv7 from `uuid_utils` (Rust, the `uuid`
crate's generator).

`app.envelope.ids.new_message_id` (the `uuid6` package, pure Python) reads `os.urandom` for
every id. The SDK used a hand-written generator here instead (Mersenne Twister bits, a
12-bit counter), ~2 µs per id; `uuid_utils.uuid7()` and its string are ~0.4 µs, keep ids of
one process in order within a millisecond (a counter in the random bits, RFC 9562 method 1),
and draw fresh random bits in a forked child (tests/sdk/test_ids.py checks all three).
"""

from __future__ import annotations

from uuid_utils import uuid7


def fast_uuid7() -> str:
    """A new UUIDv7 string (canonical lowercase 8-4-4-4-12 form)."""
    return str(uuid7())
