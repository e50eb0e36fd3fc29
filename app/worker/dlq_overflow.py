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
  a reader resolves it against the topology's configured location, which supplies the query;
* **read only from inside the store** (`read_ref`): a reference is read when it is exactly
  `<store>/sha256/<2 hex>/<64 hex>` of the configured store, nothing else. DLQ records written
  before the worker dropped producers' `prism.errors.*` headers may carry a producer's forged
  reference (`file:///etc/...`, `s3://their-bucket/...?endpoint_override=their-host`), and
  `prism dlq replay` / the console's Replay read whatever it named. So `..`, percent-encoding,
  another host (`file://host/...`), a query string or fragment, another bucket or prefix, or no
  configured store at all is refused (`RefRefused`) before anything is opened; a local file is
  opened one path component at a time below the store's root without following any symbolic
  link (the worker writes none), and must be a regular file.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
import threading
from typing import TYPE_CHECKING

from app.errors import ConfigError, PrismError

if TYPE_CHECKING:
    from app.lake.storage import Store
    from app.topology import Topology

log = logging.getLogger("prism.worker")

__all__ = ["OverflowStore", "RefRefused", "RefTooLarge", "build_overflow", "read_ref"]

#: What follows `<store>/` in a reference the worker writes (`OverflowStore.rel`): nothing else is read.
_REL = re.compile(r"sha256/([0-9a-f]{2})/([0-9a-f]{64})")
_REF_PATH = "prism.errors.value.ref"


class RefTooLarge(PrismError):
    """A referenced whole value over the size the reader would take (`read_ref`'s `max_bytes`)."""

    code = "too_large"


class RefRefused(PrismError):
    """A reference that does not name a file of the configured overflow store (`read_ref`): it is
    never opened. DLQ records written before producers' `prism.errors.*` headers were dropped may
    carry a forged one, naming any file or bucket."""

    code = "ref_refused"


def _shown(ref: str) -> str:
    """The reference for a message: it is a header anyone who wrote the record chose, so quoted
    (no newline or control character reaches the one error line) and cut to a readable length."""
    return repr(ref if len(ref) <= 160 else ref[:160] + "...")


class OverflowStore:
    """A blob location holding whole DLQ values by SHA-256 (module docs)."""

    def __init__(self, url: str, *, writable: bool = True) -> None:
        """`writable`: the worker checks at start-up that it can write; a reader (`prism dlq
        replay`, which may run as another user) only reads."""
        from app.lake.storage import Store  # pyarrow: only when configured

        self.url = url
        try:
            self.store: Store = Store(url)
        except (PrismError, OSError) as exc:
            raise ConfigError(f"dlq.overflow: cannot open {url.split('?', 1)[0]!r}: {exc}", path="dlq.overflow.path",
                              hint="use file:///absolute/dir or s3://bucket/prefix; the directory must be creatable"
                              ) from exc
        if writable and self.store.local and not os.access(self.store.root, os.W_OK):
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
        """Whether `ref` is a reference this store writes (`locate` says why not)."""
        try:
            self.locate(ref)
        except RefRefused:
            return False
        return True

    def locate(self, ref: str) -> str:
        """The path below the root that `ref` names, when it is exactly `<base>/sha256/<2 hex>/<64
        hex>` (what `ref` writes); else `RefRefused`. Compared as a string, never decoded or
        normalised: `..`, `%2e%2e`, `file://host/`, a query string or fragment, upper-case hex or
        another bucket or prefix cannot match."""
        head = self.base + "/"
        found = _REL.fullmatch(ref[len(head):]) if ref.startswith(head) else None
        if found is None or found[2][:2] != found[1]:
            raise RefRefused(
                f"reference {_shown(ref)} is not a file of the dlq.overflow store {self.base} (the worker writes "
                f"{self.base}/sha256/<2 hex>/<64 hex> and nothing else is read); it was not opened",
                path=_REF_PATH,
                hint="if the record is genuine, move the file into the store under that name (its SHA-256) or set "
                     "dlq.overflow.path to the store it is in; a reference elsewhere may have been forged by a "
                     "producer before the worker dropped their prism.errors.* headers")
        return found[0]

    def get(self, ref: str, max_bytes: int | None = None) -> bytes:
        """The bytes `ref` names (`locate`), at most `max_bytes` + 1 of them. A local file is
        opened component by component below the root, following no symbolic link, and must be a
        regular file; an object store has neither links nor `..` (the key is `locate`'s)."""
        rel = self.locate(ref)
        if not self.store.local:
            return self.store.read(rel, max_bytes)
        return _read_below(self.store.root, rel, ref, max_bytes)


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
    """The value a `prism.errors.value.ref` names, checked against its digest. Read only from the
    `configured` store, and only when the reference is one it writes (`OverflowStore.locate`):
    raises `RefRefused` for anything else - no store configured included - before opening
    anything, `PrismError` (unreadable), `RefTooLarge` (more than `max_bytes`) or `ValueError`
    (the reference or the bytes do not match `expected_sha256`).

    Why only the store: the reference comes from a record's header. The worker drops the
    `prism.errors.*` headers a producer sets, but records written before it did may carry a
    forged reference, and this read whatever file or bucket it named (`prism dlq replay`, the
    console's Replay - and re-produced it to the source topic when the digest matched).
    Why `max_bytes`: `file:///dev/zero` or a huge file was read whole before its digest was
    checked (`prism dlq replay --dry-run` grew to gigabytes). At most one byte over the limit is
    read, and a larger value could not be replayed anyway."""
    if configured is None:
        raise RefRefused(
            f"reference {_shown(ref)} was not read: no dlq.overflow store is configured, and a reference is read "
            "only from inside that store",
            path=_REF_PATH,
            hint="set dlq.overflow.path in the topology to the store the worker wrote the value to (a reference "
                 "outside it may have been forged by a producer)")
    digest_named = configured.locate(ref).rsplit("/", 1)[1]
    if digest_named != expected_sha256:
        raise ValueError(f"{_shown(ref)} names SHA-256 {digest_named}, not the recorded {expected_sha256}")
    data = configured.get(ref, max_bytes)
    if max_bytes is not None and len(data) > max_bytes:
        raise RefTooLarge(f"{ref} holds more than {max_bytes} bytes", path=_REF_PATH,
                          hint="a value larger than its topic's limit cannot be replayed: raise the topic's "
                               "max.message.bytes and PRISM_MAX_REQUEST_BYTES first")
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected_sha256:
        raise ValueError(f"{ref} holds {len(data)} bytes with SHA-256 {digest}, not the recorded {expected_sha256}")
    return bytes(data)


def _read_below(root: str, rel: str, ref: str, max_bytes: int | None) -> bytes:
    """`root`/`rel` read through `openat` one component at a time with `O_NOFOLLOW`: no symbolic
    link below the root is followed - not even between a check and the open, as with
    `realpath` then `open` - and the file must be a regular one (a FIFO or device never blocks
    or streams). The root itself is the operator's own configuration and may be a link."""
    parts = rel.split("/")
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as exc:
            raise PrismError(f"cannot open the dlq.overflow store {root}: {exc.strerror}", path=_REF_PATH) from exc
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                fds.append(os.open(name, flags, dir_fd=fds[-1]))
            except OSError as exc:
                raise _refusal(fds[-1], name, "/".join(parts[:i + 1]), root, ref, exc) from exc
        fd = fds[-1]
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RefRefused(f"reference {_shown(ref)} names {root}/{rel}, which is not a regular file; it was not read",
                             path=_REF_PATH, hint="the store holds regular files only: remove what is there")
        chunks: list[bytes] = []
        left = None if max_bytes is None else max_bytes + 1
        while left is None or left > 0:
            chunk = os.read(fd, 1 << 20 if left is None else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            if left is not None:
                left -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise PrismError(f"cannot read {_shown(ref)}: {exc.strerror}", path=_REF_PATH) from exc
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _refusal(dir_fd: int, name: str, rel: str, root: str, ref: str, exc: OSError) -> PrismError:
    """Why a component could not be opened: a symbolic link (refused: it may lead anywhere),
    something else where a directory should be, or not there (unreadable, as before)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return RefRefused(
            f"reference {_shown(ref)}: {root}/{rel} is a symbolic link (to {target!r}), which is never followed; "
            "it was not read", path=_REF_PATH,
            hint="the worker writes regular files only: replace the link with the file it should be (its SHA-256 "
                 "names it), or remove it")
    if exc.errno == errno.ENOENT:
        return PrismError(f"{rel!r} does not exist under the dlq.overflow store {root}", path=_REF_PATH,
                          hint="the value was removed from the store, or the record was written by another store")
    return PrismError(f"cannot read {_shown(ref)} ({root}/{rel}): {exc.strerror}", path=_REF_PATH)
