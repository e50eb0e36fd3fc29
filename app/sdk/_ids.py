"""Message ids for the publish hot path: RFC 9562 UUIDv7 without a syscall per id.

`app.envelope.ids.new_message_id` (the `uuid6` package) reads `os.urandom` for every id;
measured here that syscall alone is ~3.7 µs, about a tenth of the SDK's whole envelope
overhead per publish. Message ids need uniqueness and time order, not secrecy, so this
generator draws its random bits from `random` (Mersenne Twister, seeded from the OS at
import and re-seeded in every forked child by CPython) and keeps ids of the same
millisecond ordered with RFC 9562's "fixed-length dedicated counter" method in `rand_a`:

    48 bits unix_ts_ms | ver 7 | 12 bits counter | var 0b10 | 62 random bits

The counter starts at a random value below 2^11 in each new millisecond (so the next id
cannot be guessed from the last) and increments within it; on overflow the timestamp field
is advanced by one millisecond, as the RFC allows. Collisions need two ids with the same
millisecond, counter and 62 random bits.
"""

from __future__ import annotations

import os
import random
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_rand = random.Random()  # own instance: seeded from os.urandom, re-seeded after fork below


def _reseed() -> None:
    _rand.seed()


os.register_at_fork(after_in_child=_reseed)


def fast_uuid7() -> str:
    """A new UUIDv7 string (canonical lowercase 8-4-4-4-12 form)."""
    global _last_ms, _counter
    ms = time.time_ns() // 1_000_000
    with _lock:
        if ms > _last_ms:
            _last_ms, _counter = ms, _rand.getrandbits(11)
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    rand = _rand.getrandbits(62)
    # The five groups of `(ms << 80) | (7 << 76) | (counter << 64) | (0b10 << 62) | rand` in
    # hex, formatted directly (one % instead of a 128-bit int, its hex and five slices).
    return _FORMAT % (ms >> 16, ms & 0xFFFF, 0x7000 | counter, 0x8000 | (rand >> 48), rand & 0xFFFF_FFFF_FFFF)


_FORMAT = "%08x-%04x-%04x-%04x-%012x"
