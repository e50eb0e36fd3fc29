"""The whole value of a DLQ copy that had to be truncated, stored by reference (`dlq.overflow`).

Why: a DLQ copy is cut to fit its topic (`app.agents.dlq.fit_dlq_record`), and without this
store only the value's SHA-256 and length survive in the DLQ; the original stays in the source
topic for the source's retention (24 h by default) and is then gone, so a truncated record can
neither be inspected nor replayed after a day. With

    dlq:
      overflow:
        path: file:///var/lib/prism/dlq-overflow      # or s3://bucket/prefix[?endpoint_override=...]

the worker stores the whole DLQ value (secrets already masked, exactly the bytes the digest
covers) in that location before it sends the DLQ record, and names it in the record's
`prism.errors.value.ref` header. `prism dlq replay` reads it back, checks it against
`prism.errors.value.sha256` and replays the whole record.

Design:

* **the archive's storage layer** (`app.lake.storage.Store`): the same local-disk atomic
  write (temp file, fsync, rename) and the same S3 PUT (atomic when it completes), the same
  URL forms, credentials from the usual AWS chain and never from the topology;
* **content-addressed**: `<location>/sha256/<first 2 hex>/<64 hex>`. The digest is the one
  already computed for the DLQ header, so the reference is self-verifying; the same value
  dead-lettered twice (a redelivery) is stored once, and writing it again is skipped;
* **before the DLQ record**: the record is built only after the write returned, so a
  reference never dangles. A write that fails (disk full, bucket unreachable) is logged as an
  ERROR and the copy goes out without a reference - today's digest + length - rather than
  holding the batch: the DLQ record is what makes the message accounted for;
* the reference is the location's URL without its query string (which may name an endpoint);
  a reader resolves it against the topology's configured location, which supplies the query.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import TYPE_CHECKING

from app.errors import ConfigError, PrismError

if TYPE_CHECKING:
    from app.lake.storage import Store
    from app.topology import Topology

log = logging.getLogger("prism.worker")

__all__ = ["OverflowStore", "RefTooLarge", "build_overflow", "read_ref"]

_SCHEMES = ("file://", "s3://")


class RefTooLarge(PrismError):
    """A referenced whole value over the size the reader would take (`read_ref`'s `max_bytes`)."""

    code = "too_large"


class OverflowStore:
    """A blob location holding whole DLQ values by SHA-256 (module docs)."""

    def __init__(self, url: str) -> None:
        from app.lake.storage import Store  # pyarrow: only when configured

        self.url = url
        try:
            self.store: Store = Store(url)
        except (PrismError, OSError) as exc:
            raise ConfigError(f"dlq.overflow: cannot open {url.split('?', 1)[0]!r}: {exc}", path="dlq.overflow.path",
                              hint="use file:///absolute/dir or s3://bucket/prefix; the directory must be creatable"
                              ) from exc
        if self.store.local and not os.access(self.store.root, os.W_OK):
            raise ConfigError(f"dlq.overflow: {self.store.root} is not writable by this process",
                              path="dlq.overflow.path", hint="fix the directory's owner/mode or name another one")
        base = self.store.url_for_messages.rstrip("/")
        self.base = f"file://{self.store.root}" if self.store.local else base
        self.stored = 0
        self.failed = 0
        self._lock = threading.Lock()

    @staticmethod
    def rel(digest: str) -> str:
        return f"sha256/{digest[:2]}/{digest}"

    def ref(self, digest: str) -> str:
        return f"{self.base}/{self.rel(digest)}"

    def put(self, digest: str, value: bytes) -> str | None:
        """Store `value` under `digest` (unless it is there already) and return its reference;
        None, with an ERROR line, when the store refused it (`fit_dlq_record`'s `Overflow`)."""
        rel = self.rel(digest)
        try:
            if not self.store.exists(rel):
                self.store.write_atomic(rel, value)
        except (PrismError, OSError) as exc:
            with self._lock:
                self.failed += 1
            log.error("dlq.overflow: could not store the whole value (%d bytes, sha256 %s) under %s: %s; the DLQ "
                      "copy keeps only its digest and length", len(value), digest, self.base, exc)
            return None
        with self._lock:
            self.stored += 1
        return self.ref(digest)

    def owns(self, ref: str) -> bool:
        return ref.startswith(self.base + "/")

    def get(self, ref: str, max_bytes: int | None = None) -> bytes:
        return self.store.read(ref[len(self.base) + 1:], max_bytes)


def build_overflow(topology: Topology) -> OverflowStore | None:
    """The topology's overflow store, opened and checked now (start-up, before any broker); without
    `dlq.overflow`, None - and one line saying what a truncated DLQ copy then keeps."""
    cfg = topology.dlq.overflow
    if cfg is None:
        log.warning("dlq.overflow is not set: a DLQ copy cut to fit its topic keeps only the value's SHA-256 and "
                    "length; the whole message stays in the source topic for its retention only (set dlq.overflow."
                    "path to keep it by reference)", extra={"event": "dlq_overflow", "configured": False})
        return None
    store = OverflowStore(cfg.path)
    log.info("dlq.overflow: whole values of truncated DLQ copies go to %s", store.base,
             extra={"event": "dlq_overflow", "configured": True})
    return store


def read_ref(ref: str, expected_sha256: str, configured: OverflowStore | None = None, *,
             max_bytes: int | None = None) -> bytes:
    """The value a `prism.errors.value.ref` names, checked against its digest. Resolved against the
    `configured` store when the reference lies below it (its URL carries the endpoint), else opened
    as it is. Raises `PrismError` (unreadable), `RefTooLarge` (more than `max_bytes`) or
    `ValueError` (the bytes do not match).

    Why `max_bytes`: the reference comes from a record's header, which anyone who can write to
    the DLQ topic controls; `file:///dev/zero` or a huge file was read whole before its digest
    was checked (`prism dlq replay --dry-run` grew to gigabytes). At most one byte over the
    limit is read, and a larger value could not be replayed anyway."""
    if configured is not None and configured.owns(ref):
        data = configured.get(ref, max_bytes)
    else:
        if not ref.startswith(_SCHEMES):
            raise PrismError(f"{ref!r} is not a file:// or s3:// reference", path="prism.errors.value.ref")
        from app.lake.storage import open_filesystem

        fs, path = open_filesystem(ref)
        try:
            with fs.open_input_stream(path) as f:
                data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        except OSError as exc:
            raise PrismError(f"cannot read {ref}: {exc}", path="prism.errors.value.ref") from exc
    if max_bytes is not None and len(data) > max_bytes:
        raise RefTooLarge(f"{ref} holds more than {max_bytes} bytes", path="prism.errors.value.ref",
                          hint="a value larger than its topic's limit cannot be replayed: raise the topic's "
                               "max.message.bytes and PRISM_MAX_REQUEST_BYTES first")
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected_sha256:
        raise ValueError(f"{ref} holds {len(data)} bytes with SHA-256 {digest}, not the recorded {expected_sha256}")
    return bytes(data)
