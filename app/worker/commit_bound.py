"""An offset commit never waits forever.

Why: Faust commits offsets by handing the commit to its consumer thread (``call_thread``) and
awaiting the answer with no bound, and every later commit - and the fetcher once it has read
``broker_commit_every`` records - waits for the one in flight. A commit that never returns
therefore stops the worker for good. CI saw exactly that once on Apache Kafka: a worker's commit
(its first) was still unanswered minutes after a partition leader's ``kill -9``, the fetcher
waited behind it, and nothing was committed or written any more (tests/kafka/test_broker_failures.py).
The cause could not be reproduced: aiokafka's own commit survived ten coordinator kills under
load with 4.4 s at most (docs/operations.md, "An offset commit never waits forever").

So every commit of the at_least_once path is bounded, in two places:

* in the consumer thread, the commit is cancelled after :data:`COMMIT_TIMEOUT_SECONDS` - Kafka's
  own bound for a synchronous commit (``default.api.timeout.ms``, 60 s), far above a commit that
  waits out a coordinator fail-over (seconds) - and the thread's tasks are logged at that moment,
  so a recurrence says where it waited;
* in the worker's loop, the wait for the thread's answer is bounded a little above that, which
  also covers a commit the thread never started (its method queue busy).

A commit that timed out is reported as not done, and the offsets it carried are committed again by
the next commit (the consumer puts its record of committed offsets back, app/worker/offsets.py): Faust records a commit's offsets as committed even when
the commit failed, which would leave an idle partition's last offset uncommitted until new records
arrive - and the stall watch (app/worker/progress.py) reading lag from the broker would see work
waiting that is done. Nothing is lost either way: offsets are never committed past unprocessed
records. exactly_once commits through its transaction (app/worker/transactions.py), not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from app.worker.diagnose import task_stacks

__all__ = ["COMMIT_TIMEOUT_SECONDS", "bounded_commit", "commit_from_worker"]

log = logging.getLogger(__name__)

#: Kafka's default.api.timeout.ms: how long a Java client's commitSync waits before it gives up.
COMMIT_TIMEOUT_SECONDS = 60.0

#: How much longer the worker's loop waits for the consumer thread's answer than the thread waits
#: for the commit: the thread's own timeout, its cancellation and the hand-back fit well within it.
HANDOVER_SLACK_SECONDS = 10.0


async def bounded_commit(commit: Callable[[], Awaitable[bool]], partitions: int,
                         timeout: float | None = None) -> bool | None:
    """Run ``commit()`` (in the consumer thread); None when it did not finish within ``timeout``.

    Cancelled then, with a WARNING that carries the await chain of every task of this loop taken
    *before* the cancellation (where the commit waited)."""
    limit = COMMIT_TIMEOUT_SECONDS if timeout is None else timeout
    task = asyncio.ensure_future(commit())
    done, _ = await asyncio.wait({task}, timeout=limit)
    if done:
        return task.result()
    stacks = task_stacks()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # its outcome no longer matters
        await asyncio.wait_for(task, 5.0)
    log.warning("an offset commit of %d partition(s) did not finish within %.0f s and was cancelled; the next "
                "commit sends its offsets again (nothing is lost: no offset passes an unprocessed record). "
                "Consumer thread tasks: %s", partitions, limit, " | ".join(stacks[:60]),
                extra={"event": "commit_timeout"})
    return None


async def commit_from_worker(call: Callable[[], Awaitable[bool | None]], partitions: int,
                             thread_loop: asyncio.AbstractEventLoop | None,
                             timeout: float | None = None) -> bool | None:
    """Await the consumer thread's answer to a commit (``call()``), bounded; None on timeout.

    Covers the case :func:`bounded_commit` cannot: the thread never started the commit."""
    limit = (COMMIT_TIMEOUT_SECONDS if timeout is None else timeout) + HANDOVER_SLACK_SECONDS
    try:
        return await asyncio.wait_for(call(), limit)
    except TimeoutError:
        stacks = task_stacks(thread_loop) if thread_loop is not None else []
        log.warning("the consumer thread did not answer an offset commit of %d partition(s) within %.0f s; the "
                    "next commit sends its offsets again. Consumer thread tasks: %s", partitions, limit,
                    " | ".join(stacks[:60]), extra={"event": "commit_timeout"})
        return None

