"""One small storage interface over a local directory or an object store (via `pyarrow.fs`).

Why two write strategies behind one `write_atomic`:

* Local disk: write a hidden temp file in the target directory, `fsync` it, `os.replace` it
  onto the final name, `fsync` the directory. A reader sees either nothing or the whole file,
  even after a power cut.
* Object stores (S3 and compatible): there is no atomic rename (a "move" is copy + delete),
  but a PUT - single or multipart - is atomic: the object appears whole when the upload
  completes and not at all if the writer dies first (an abandoned multipart upload is
  invisible; a bucket lifecycle rule `AbortIncompleteMultipartUpload` reclaims its parts).
  So objects are written straight to their final key, and whether they *count* is decided
  by the manifest that names them (see `app.lake.archive`).

URLs: a plain path or `file://` is local; anything else goes to
`pyarrow.fs.FileSystem.from_uri`, e.g.
`s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1`
(credentials from the usual AWS environment variables / profile chain, never from the URL).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from app.errors import ArchiveError


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A file below a store's root: path relative to the root, size in bytes."""

    path: str
    size: int


class Store:
    """A root directory on some filesystem; every path argument is relative to that root."""

    def __init__(self, url: str, filesystem: pafs.FileSystem | None = None) -> None:
        self.url = url
        if filesystem is not None:
            self.fs, self.root = filesystem, url.rstrip("/")
        else:
            self.fs, self.root = open_filesystem(url)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    # -- paths -------------------------------------------------------------------------------
    def full(self, rel: str) -> str:
        """The filesystem path of `rel` (what `self.fs` understands)."""
        return posixpath.join(self.root, rel) if rel else self.root

    def uri(self, rel: str = "") -> str:
        """A URL of `rel` that Spark / delta-rs / pyarrow accept (local: absolute path)."""
        if self.local:
            return self.full(rel)
        base = self.url.split("?", 1)[0].rstrip("/")
        return f"{base}/{rel}" if rel else base

    def child_url(self, rel: str) -> str:
        """The URL of a sub-location, keeping the query (endpoint, region) for object stores."""
        if self.local:
            return self.full(rel)
        base, sep, query = self.url.partition("?")
        return f"{base.rstrip('/')}/{rel}{sep}{query}"

    # -- writes --------------------------------------------------------------------------------
    def write_atomic(self, rel: str, data: bytes | memoryview) -> None:
        """Make `rel` hold exactly `data`, all or nothing (see the module docstring)."""
        target = self.full(rel)
        try:
            if self.local:
                _local_write_atomic(target, data)
            else:
                with self.fs.open_output_stream(target) as out:
                    out.write(data)
        except OSError as exc:
            raise ArchiveError(f"cannot write {rel!r} under {self.url_for_messages}: {exc}",
                               hint="check the location exists and is writable") from exc

    def delete(self, rel: str) -> bool:
        """Delete a file; False when it was not there (deleting twice is not an error)."""
        try:
            self.fs.delete_file(self.full(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            if not self.exists(rel):
                return False
            raise ArchiveError(f"cannot delete {rel!r} under {self.url_for_messages}: {exc}") from exc

    # -- reads -----------------------------------------------------------------------------------
    def read(self, rel: str, max_bytes: int | None = None) -> bytes:
        """The bytes of `rel`; with `max_bytes`, at most one byte more than that, so a caller
        that reads a location it did not choose (a reference in a record) can refuse a larger
        file without holding it - or reading `/dev/zero` until memory runs out."""
        try:
            with self.fs.open_input_stream(self.full(rel)) as f:
                return f.read() if max_bytes is None else f.read(max_bytes + 1)
        except FileNotFoundError as exc:
            raise ArchiveError(f"{rel!r} does not exist under {self.url_for_messages}") from exc
        except OSError as exc:
            raise ArchiveError(f"cannot read {rel!r} under {self.url_for_messages}: {exc}") from exc

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self.full(rel)).type == pafs.FileType.File

    def list_files(self, rel_dir: str = "", *, recursive: bool = True) -> list[StoredFile]:
        """Files below `rel_dir`, sorted by path; an absent directory lists as empty."""
        base = self.full(rel_dir)
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=recursive, allow_not_found=True))
        except OSError as exc:
            raise ArchiveError(f"cannot list {rel_dir or '/'!r} under {self.url_for_messages}: {exc}") from exc
        prefix = self.root.rstrip("/") + "/"
        out = [StoredFile(i.path[len(prefix):], i.size or 0) for i in infos if i.type == pafs.FileType.File]
        return sorted(out, key=lambda f: f.path)

    def list_dirs(self, rel_dir: str) -> list[str]:
        """Names of the immediate sub-directories of `rel_dir`."""
        base = self.full(rel_dir)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=False, allow_not_found=True))
        return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.Directory)

    @property
    def url_for_messages(self) -> str:
        """The root URL without its query string (which may name endpoints, never secrets)."""
        return self.url.split("?", 1)[0]


def is_local_url(url: str) -> bool:
    scheme = urlsplit(url).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def absolute_url(url: str) -> str:
    """A local path made absolute (a ``file://`` URL becomes its absolute path); any other URL as
    given. Why: Spark reads a relative path like ``var/lake/envelopes`` in ``delta.`...``` SQL as a
    table name and failed with a 59-line traceback; delta-rs and pyarrow resolve it against a
    different working directory than the user's shell when run under spark-submit."""
    if not is_local_url(url) or (len(urlsplit(url).scheme) == 1):
        return url
    path = urlsplit(url).path if url.startswith("file://") else url
    return os.path.abspath(os.path.expanduser(path))


def open_filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) for a local path, a `file://` URL or any `pyarrow.fs` URI."""
    if is_local_url(url):
        path = urlsplit(url).path if url.startswith("file://") else url
        return pafs.LocalFileSystem(), os.path.abspath(path)
    if url.startswith(("s3a://", "s3n://")):  # Hadoop's spellings of S3 (what Spark on a cluster uses)
        url = "s3://" + url.split("://", 1)[1]
    try:
        fs, path = pafs.FileSystem.from_uri(url)
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"cannot open storage URL {url.split('?', 1)[0]!r}: {exc}",
                           hint="use a local path, file://..., or s3://bucket/prefix[?endpoint_override=host:port&scheme=http]") from exc
    return fs, path.rstrip("/")


def _local_write_atomic(target: str, data: bytes | memoryview) -> None:
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    # Hidden name: Spark, Hive and pyarrow datasets all skip files starting with "." or "_".
    tmp = os.path.join(directory, f".{os.path.basename(target)}.tmp-{uuid.uuid4().hex[:12]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, target)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def temp_leftovers(store: Store, rel: str) -> list[str]:
    """Temp files a crashed local `write_atomic(rel)` may have left (hidden, same directory)."""
    if not store.local:
        return []
    directory, name = posixpath.split(rel)
    full_dir = store.full(directory)
    if not os.path.isdir(full_dir):
        return []
    prefix = f".{name}.tmp-"
    return [posixpath.join(directory, n) for n in os.listdir(full_dir) if n.startswith(prefix)]
