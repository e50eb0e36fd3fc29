"""Subscribers tell the schema registry which schema versions they read (RFC-030 "active
consumers per schema version"), without anyone having to call ``POST /v1/consumers``.

`PrismClient(..., registry_url=...)` gives every subscription a shared `VersionReporter`.
For each message it reads, the subscription passes the envelope's `SchemaContext`; the
reporter works out (subject, version) from `schema_url` - the registry URL the producer
resolved, ``.../v1/subjects/{subject}/versions/{n}`` (Prism) or ``.../subjects/{subject}/versions/{n}``
(Confluent) - and POSTs ``{subject, version, consumer_id}`` to the registry.

Why it cannot hurt consumption:

* per message it costs one dict lookup and a clock read: (consumer, schema_url) pairs
  reported less than `interval` seconds ago (default 60 s) are skipped;
* the POST runs in a worker thread from a background task; the message is handed to the
  caller before the report is even started;
* a failure (registry down, 404 for a subject it does not know) is logged once at WARNING,
  later ones at DEBUG, and the pair is retried no sooner than `interval` later;
* `close()` waits at most `close_timeout` seconds for reports in flight.

The registry keeps one row per (subject, consumer, version), so a consumer reading two
versions during a rollout is listed under both (`GET /v1/subjects/{s}/consumers`,
`GET /v1/subjects/{s}/versions`, `prism schema list --topic`, the `/ui` version table).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import urllib.parse
import urllib.request

log = logging.getLogger("prism.sdk.usage")

# [0-9]{1,10}, not \d+: the URL is a received envelope's, and int() refuses 5,000 digits
_VERSION_PATH = re.compile(r"/subjects/([^/]+)/versions/([0-9]{1,10})/?$")
DEFAULT_INTERVAL_S = 60.0


def subject_version(schema_url: str) -> tuple[str, int] | None:
    """(subject, version number) named by a registry schema URL, or None when it names none
    (a git or file URL, a label instead of a number)."""
    path = urllib.parse.urlsplit(schema_url).path if "://" in schema_url else schema_url
    m = _VERSION_PATH.search(path)
    if m is None:
        return None
    return urllib.parse.unquote(m.group(1)), int(m.group(2))


class VersionReporter:
    """De-duplicated, throttled, fire-and-forget reports of (consumer, subject, version)."""

    def __init__(self, registry_url: str, *, interval: float = DEFAULT_INTERVAL_S, timeout: float = 2.0,
                 close_timeout: float = 1.0, auth_headers: dict[str, str] | None = None) -> None:
        from ..security.client_auth import client_auth_from_env

        self.endpoint = registry_url.rstrip("/") + "/v1/consumers"
        #: Credentials (the read role is enough): given, else PRISM_REGISTRY_TOKEN or _USER/_PASSWORD.
        self._auth = dict(auth_headers) if auth_headers is not None else client_auth_from_env("PRISM_REGISTRY")
        self.interval, self.timeout, self.close_timeout = interval, timeout, close_timeout
        self._next: dict[tuple[str, str], float] = {}  # (consumer_id, schema_url) -> monotonic time allowed again
        self._tasks: set[asyncio.Task[None]] = set()
        self._warned = False
        #: Counters, for tests and debugging: POSTs that succeeded / failed.
        self.stats = {"sent": 0, "failed": 0}

    def seen(self, consumer_id: str, schema_url: str) -> None:
        """A message of `schema_url` was read by `consumer_id`. Cheap; never raises, never blocks."""
        key = (consumer_id, schema_url)
        now = time.monotonic()
        if now < self._next.get(key, 0.0):
            return
        self._next[key] = now + self.interval
        sv = subject_version(schema_url)
        if sv is None:
            log.debug("schema_url %r names no subject version; not reported", schema_url)
            return
        try:
            task = asyncio.get_running_loop().create_task(self._report(sv[0], sv[1], consumer_id))
        except RuntimeError:  # no running loop: nothing to report from
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report(self, subject: str, version: int, consumer_id: str) -> None:
        body = json.dumps({"subject": subject, "version": version, "consumer_id": consumer_id}).encode()
        try:
            await asyncio.to_thread(self._post, body)
            self.stats["sent"] += 1
        except Exception as exc:  # anything: a report must never disturb consumption
            self.stats["failed"] += 1
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(level, "could not report schema %s v%d read by %s to %s: %s (retrying in %.0f s at the "
                    "earliest; further failures are logged at DEBUG)", subject, version, consumer_id,
                    self.endpoint, exc, self.interval)

    def _post(self, body: bytes) -> None:
        req = urllib.request.Request(self.endpoint, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **self._auth})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            resp.read()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait (at most `timeout`, default `close_timeout` seconds) for reports in flight."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.close_timeout if timeout is None else timeout)

    async def close(self) -> None:
        """Give reports in flight `close_timeout` seconds, then drop them."""
        await self.flush()
        for t in list(self._tasks):
            t.cancel()

    def __repr__(self) -> str:
        return f"VersionReporter({self.endpoint!r}, interval={self.interval})"

