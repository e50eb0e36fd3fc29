"""The `.v2` sunset (RFC-031 "Breaking Change Procedure", memo-031 on migration tracking).

A topology's `outputs.migration` names two instants: from `deprecation_date` every `.v2` record
carries the `prism-deprecation` header (and SDK consumers of `.v2` warn, naming the cutoff);
from `cutoff_date` the worker writes `.v3` only, says so at start-up, in its log when the
cutoff passes while it runs, and in `/connectors/{name}/status`.

Time comes from a `Clock` (seconds since the epoch) so the whole procedure can be rehearsed and
tested without waiting for a date: `clock_from_env()` adds `PRISM_MIGRATION_CLOCK_OFFSET_S`
(seconds, may be negative) to the system time. The offset moves only the migration phase -
never token expiry, TTLs or timestamps - so it is safe to use on a staging worker.
"""

from __future__ import annotations

import enum
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime

from .errors import ConfigError

#: Seconds since the epoch, as `time.time()`.
Clock = Callable[[], float]
CLOCK_OFFSET_ENV = "PRISM_MIGRATION_CLOCK_OFFSET_S"
#: The Kafka header on every `.v2` record from the deprecation date on.
DEPRECATION_HEADER = "prism-deprecation"


def clock_from_env(env: dict[str, str] | None = None) -> Clock:
    """The system clock, shifted by `PRISM_MIGRATION_CLOCK_OFFSET_S` when set (a controlled
    clock for rehearsing a sunset; see the module docstring)."""
    raw = (env if env is not None else os.environ).get(CLOCK_OFFSET_ENV, "").strip()
    if not raw:
        return time.time
    try:
        offset = float(raw)
    except ValueError:
        offset = math.nan
    if not math.isfinite(offset):  # nan and inf made every sunset date compare false
        raise ConfigError(f"{CLOCK_OFFSET_ENV}={raw!r} is not a number of seconds", path=CLOCK_OFFSET_ENV,
                          hint="e.g. 86400 to act as if it were one day later; unset it in production")
    return lambda: time.time() + offset


def to_utc(value: date | datetime | str) -> datetime:
    """A migration date as an aware UTC datetime: a date means its midnight UTC; a datetime
    without a zone is UTC; ISO 8601 text is parsed (YAML may hand over either)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00")) if "T" in text or " " in text \
                else date.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 date (2025-06-01) or date-time "
                             "(2025-06-01T00:00:00Z)") from None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return datetime(value.year, value.month, value.day, tzinfo=UTC)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Phase(enum.StrEnum):
    """Where a `.v2` output stands."""

    ACTIVE = "active"          # before the deprecation date: written as always
    DEPRECATED = "deprecated"  # written, every record with the deprecation header
    STOPPED = "stopped"        # after the cutoff: not written any more


@dataclass(frozen=True, slots=True)
class Sunset:
    """The `.v2` sunset of one topology: the two instants and the clock that decides."""

    deprecation: datetime
    cutoff: datetime
    clock: Clock = time.time

    def phase(self, now: float | None = None) -> Phase:
        t = self.clock() if now is None else now
        if t >= self.cutoff.timestamp():
            return Phase.STOPPED
        if t >= self.deprecation.timestamp():
            return Phase.DEPRECATED
        return Phase.ACTIVE

    def header_value(self, successor: str) -> bytes:
        """`deprecated=<date>; sunset=<cutoff>; successor=<topic>`: when `.v2` was deprecated,
        when it stops (the HTTP `Deprecation`/`Sunset` headers' meaning, RFC 9745 / RFC 8594)
        and which topic replaces it."""
        return f"deprecated={iso(self.deprecation)}; sunset={iso(self.cutoff)}; successor={successor}".encode()

    def status(self, now: float | None = None) -> dict[str, object]:
        """What `/connectors/{name}/status` reports under `migration`."""
        phase = self.phase(now)
        return {"v2": str(phase), "v2_written": phase is not Phase.STOPPED, "deprecation_date": iso(self.deprecation),
                "cutoff_date": iso(self.cutoff), "header": DEPRECATION_HEADER}


def parse_header(value: bytes | str) -> dict[str, str]:
    """The parameters of a `prism-deprecation` header (unknown ones kept, malformed parts skipped)."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    out: dict[str, str] = {}
    for part in text.split(";"):
        key, sep, val = part.strip().partition("=")
        if sep and key:
            out[key.strip()] = val.strip()
    return out
