"""The archive tap as a worker service: the worker's `.v3` output -> rolling Parquet archive.

Runs next to the pipeline agents with an explicit lifecycle (a `mode.Service` child of the
Faust app): started with the worker, stopped with it, and on stop the sink commits what it
accepted, so a clean shutdown leaves nothing half-archived. The archive's manifests, not a
consumer group, record progress (see `app.lake.kafka_source`), so a crash resumes exactly
after the last committed roll.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mode import Service

from app.lake.archive import ArchiveSink
from app.lake.kafka_source import archive_topics

log = logging.getLogger("prism.archive")

#: Longest a clean shutdown waits for the archive tap to commit its open roll. Part of the
#: worker's drain time: an orchestrator's grace period must exceed it (deploy/base).
STOP_TIMEOUT_S = 60.0


class ArchiveService(Service):
    def __init__(self, bootstrap: str, topics: list[str], location: str, *, writer_id: str = "worker",
                 consumer_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bootstrap = bootstrap
        self.topics = topics
        self.sink = ArchiveSink(location, writer_id=writer_id)
        self.consumer_kwargs = consumer_kwargs
        self.archived = 0
        self._stop_event: asyncio.Event | None = None
        self._task: asyncio.Task[int] | None = None

    async def on_start(self) -> None:
        self._stop_event = asyncio.Event()
        self._task = asyncio.ensure_future(archive_topics(self.bootstrap, self.topics, self.sink,
                                                          stop=self._stop_event,
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
