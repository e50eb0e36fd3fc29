"""dedup: drop a message whose id was already emitted inside the window.

The window lives in a RocksDB-backed Faust table with a changelog (`app.tables.dedup`),
partitioned like the source topic, so it survives restarts and rebalances. On the
embedded broker delivery is at-least-once; this stage turns redelivered input into
"duplicate" instead of a second output.

The stage only *checks*. An id is recorded (`record_emitted`) after the message's outputs
are written: if the worker dies in between, the redelivered message is emitted again (a
duplicate downstream, at-least-once) - recording first would make the redelivery look
like a duplicate of an output that never reached Kafka, and lose it. Ids seen earlier in
the same batch, or in an earlier batch whose writes are still in flight, are caught by
`pending`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from app.agents.base import Message, Stage
from app.errors import DuplicateError
from app.tables.dedup import DedupWindow


class Dedup(Stage):
    name = "dedup"

    def __init__(self, window: DedupWindow) -> None:
        self.window = window
        #: ids checked and not yet recorded, of every batch in flight (the worker overlaps the
        #: writes of one batch with the chain of the next)
        self.pending: set[str] = set()
        self._batches: dict[int, list[str]] = {}
        self._batch = 0

    def begin_batch(self) -> int:
        """Start a batch; its ids stay `pending` until :meth:`end_batch` with the returned token,
        so a later batch run before this one's ids are recorded still sees them."""
        self._batch += 1
        self._batches[self._batch] = []
        return self._batch

    def process(self, msg: Message) -> None:
        mid = msg.env.message_id
        if mid in self.pending or self.window.seen(mid, time.time(), partition=msg.partition):
            raise DuplicateError(f"message id {mid} already processed", path="metadata.message_id")
        self.pending.add(mid)
        ids = self._batches.get(self._batch)
        if ids is not None:
            ids.append(mid)

    def record_emitted(self, msg: Message) -> None:
        """Remember `msg`'s id; call once its outputs are written (Faust's current event must
        be `msg`'s so the entry lands in the right table partition)."""
        # `process` found the id not live and `pending` kept later copies in the batch out:
        # record without reading it again.
        self.window.record(msg.env.message_id, time.time(), partition=msg.partition)

    def record_emitted_all(self, msgs: Iterable[Message]) -> None:
        """:meth:`record_emitted` for a batch's written messages at once (one clock read, one
        store write batch per partition); each id is routed by its message's partition."""
        self.window.record_many(((m.env.message_id, m.partition) for m in msgs), time.time())

    async def flush(self) -> None:
        """Hand the batch's recorded ids to the producer (their changelog records); call after the
        batch's `record_emitted` calls. Faust flushes the producer before it commits the batch's
        source offsets, so the ids are durable first; the batch does not wait for the round trip."""
        flush = getattr(self.window, "flush_changelog", None)
        if flush is not None:
            await flush(wait=False)

    def end_batch(self, token: int | None = None) -> None:
        """Forget the pending ids of the batch `token` (after its ids were recorded, or its
        outputs failed); without a token, of every batch (one batch at a time)."""
        if token is None:
            self.pending.clear()
            self._batches.clear()
            return
        pending = self.pending
        for mid in self._batches.pop(token, ()):
            pending.discard(mid)
