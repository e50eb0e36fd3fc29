"""The archive tap as a worker service: the worker's `.v3` output -> rolling Parquet archive.

Runs next to the pipeline agents with an explicit lifecycle (a `mode.Service` child of the
Faust app): started with the worker, stopped with it, and on stop the sink commits what it
accepted, so a clean shutdown leaves nothing half-archived. The archive's manifests, not a
consumer group, record progress (see `app.lake.kafka_source`), so a crash resumes exactly
after the last committed roll.

Writer ids: every sink writing to one archive location needs its own (two sinks under one id
would number their rolls from the same sequence and overwrite each other's manifests). The
default is ``<host>-<pid>`` (:func:`default_writer_id`), unique among the processes alive at
any moment; ``prism run --processes N`` gives child ``i`` ``<host>-<supervisor pid>-p<i>`` so a
restarted child continues (and cleans up) its predecessor's rolls; ``PRISM_ARCHIVE_WRITER_ID``
sets it explicitly (e.g. a StatefulSet pod name: stable and unique). Compaction reads every
writer's rolls and keeps one row per message id across writers (``app.lake.compact.dedup``).

Sharding: a worker archives every partition of the archive topics unless told its share
(``shard=(i, n)``: partitions ``p`` with ``p % n == i``) - ``prism run --processes N`` does, so N
children archive each record once between them instead of N times.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from collections.abc import Mapping
from typing import Any

from mode import Service

from app.errors import ConfigError
from app.lake.archive import ArchiveSink
from app.lake.kafka_source import archive_topics

log = logging.getLogger("prism.archive")

#: Explicit archive writer id (default: :func:`default_writer_id`).
WRITER_ID_ENV = "PRISM_ARCHIVE_WRITER_ID"
#: ``i/n``: archive only partitions ``p % n == i`` of the archive topics (default: all).
SHARD_ENV = "PRISM_ARCHIVE_SHARD"
_MAX_WRITER = 64


def default_writer_id(*, suffix: str | None = None, host: str | None = None, pid: int | None = None,
                      env: Mapping[str, str] | None = None) -> str:
    """``PRISM_ARCHIVE_WRITER_ID`` if set, else ``<host>-<pid>[-<suffix>]``, valid as a writer id.

    The host name is reduced to ``A-Za-z0-9_.-`` and shortened so that the pid and suffix -
    the parts that make it unique - always fit the 64 characters a writer id may have."""
    environ = os.environ if env is None else env
    explicit = (environ.get(WRITER_ID_ENV) or "").strip()
    if explicit:
        return explicit  # validated by ArchiveSink, with a clear error
    tail = f"-{os.getpid() if pid is None else pid}" + (f"-{suffix}" if suffix else "")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", host if host is not None else socket.gethostname()).strip("-.")
    name = (name or "host")[: _MAX_WRITER - len(tail)]
    if not name[0].isalnum():
        name = "h" + name[1:]
    return name + tail


def check_writer_id(writer_id: str, *, source: str = WRITER_ID_ENV) -> str:
    """Refuse an id the archive would refuse, before any worker starts (not in a crash loop)."""
    from app.lake.archive import _WRITER_RE

    if not _WRITER_RE.fullmatch(writer_id):
        raise ConfigError(f"archive writer id {writer_id!r} is not valid", path=source,
                          hint="use 1-64 characters from A-Z a-z 0-9 _ . - starting with a letter or digit "
                               "(with --processes N, '-p<i>' is appended)")
    return writer_id


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``; empty -> None (archive everything)."""
    if not text or not text.strip():
        return None
    m = re.fullmatch(r"\s*(\d{1,4})\s*/\s*(\d{1,4})\s*", text)
    if m is None or not int(m.group(1)) < int(m.group(2)):
        raise ConfigError(f"archive shard {text!r} is not of the form i/n with 0 <= i < n", path=SHARD_ENV,
                          hint="e.g. 0/3, 1/3, 2/3 for three workers; unset it to archive every partition")
    return int(m.group(1)), int(m.group(2))


def shard_partitions(topics: Mapping[str, int], shard: tuple[int, int] | None) -> list[tuple[str, int]] | None:
    """The (topic, partition)s shard ``(i, n)`` archives; None (= all) without a shard."""
    if shard is None:
        return None
    i, n = shard
    return [(t, p) for t, count in sorted(topics.items()) for p in range(count) if p % n == i]


#: Longest a clean shutdown waits for the archive tap to commit its open roll. Part of the
#: worker's drain time: an orchestrator's grace period must exceed it (deploy/base).
STOP_TIMEOUT_S = 60.0


class ArchiveService(Service):
    """Args:
        writer_id: this sink's id in the archive (default :func:`default_writer_id`).
        partitions: archive topics -> partition count; needed with ``shard``.
        shard: ``(i, n)``: archive only partitions ``p % n == i`` (see the module docstring).
    """

    def __init__(self, bootstrap: str, topics: list[str], location: str, *, writer_id: str | None = None,
                 consumer_kwargs: dict[str, Any] | None = None, partitions: Mapping[str, int] | None = None,
                 shard: tuple[int, int] | None = None, roll_interval_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bootstrap = bootstrap
        self.topics = topics
        self.writer_id = writer_id or default_writer_id()
        self.sink = ArchiveSink(location, writer_id=self.writer_id, max_file_age_s=roll_interval_s)
        if shard is not None and partitions is None:
            raise ConfigError("an archive shard needs the archive topics' partition counts")
        self.assignment = shard_partitions({t: (partitions or {})[t] for t in topics}, shard) if shard else None
        self.consumer_kwargs = consumer_kwargs
        self.archived = 0
        self._stop_event: asyncio.Event | None = None
        self._task: asyncio.Task[int] | None = None

    async def on_start(self) -> None:
        self._stop_event = asyncio.Event()
        if self.assignment == []:
            return  # more shards than partitions: nothing for this one
        self._task = asyncio.ensure_future(archive_topics(self.bootstrap, self.topics, self.sink,
                                                          assignment=self.assignment, stop=self._stop_event,
                                                          consumer_kwargs=self.consumer_kwargs))

    async def on_stop(self) -> None:
        if self._stop_event is None or self._task is None:
            return
        self._stop_event.set()
        try:
            self.archived = await asyncio.wait_for(self._task, STOP_TIMEOUT_S)
        except Exception:  # the archive must never block shutdown; what was not committed is re-read
            log.exception("archive tap did not stop cleanly; it resumes from its last committed roll")
        finally:
            await asyncio.to_thread(self.sink.close)
