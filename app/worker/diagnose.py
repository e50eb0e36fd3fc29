"""What a running worker is waiting for: a snapshot of its consumer, flow control and batches.

A worker that has stopped making progress without failing (a stall) shows nothing in its
metrics but a flat line. ``kill -USR1 <pid>`` makes :class:`~app.worker.faust_app.PrismWorker`
log this snapshot and the await chain of every asyncio task, which together say where it
waits: flow control stopped and never resumed, a partition paused, a batch in flight that
never finished, table recovery still running, a producer buffer full.

Not mode's own SIGUSR1 dump: it prints every frame's local variables, which in this process
include messages, tokens and key material, and runs to megabytes. The await chains here name
code locations only.

Every read is guarded: the snapshot is taken from a signal handler on a worker in an unknown
state, and a missing attribute (another Faust version, a worker not yet started) must cost one
field, not the dump.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["consumer_snapshot", "task_stacks", "worker_task_stacks"]


def _safe(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as exc:  # a diagnostic never raises: report what failed instead
        return f"<unavailable: {type(exc).__name__}: {exc}>"


def _tp(tp: Any) -> str:
    return f"{tp.topic}/{tp.partition}"


def consumer_snapshot(app: Any) -> dict[str, Any]:
    """The consumer's state as plain JSON-able data (see the module docstring)."""
    consumer = _safe(lambda: app._consumer)
    snap: dict[str, Any] = {
        "generation": _safe(lambda: app.consumer_generation_id),
        "rebalancing": _safe(lambda: app.rebalancing),
        "flow_control_active": _safe(lambda: app.flow_control.is_active()),
        "producer_buffer": _safe(lambda: {"size": app.producer.buffer.size,
                                          "max": app.producer.buffer.max_messages}),
        "recovery": _safe(lambda: {"in_recovery": app.tables.recovery.in_recovery,
                                   "active_remaining": app.tables.recovery.active_remaining_total()}),
    }
    if consumer is None or isinstance(consumer, str):
        snap["consumer"] = None
        snap["batch_sources"] = []
        return snap
    snap["consumer"] = {
        "flow_active": _safe(lambda: consumer.flow_active),
        "can_resume_flow": _safe(lambda: consumer.can_resume_flow.is_set()),
        "unacked": _safe(lambda: len(consumer._unacked_messages)),
        "paused": _safe(lambda: sorted(_tp(tp) for tp in consumer._paused_partitions)),
        "active": _safe(lambda: sorted(_tp(tp) for tp in consumer._active_partitions or ())),
    }
    partitions: dict[str, Any] = {}
    assignment = _safe(consumer.assignment)
    if isinstance(assignment, str):
        snap["assignment"] = assignment
    else:
        for tp in sorted(assignment):
            row: dict[str, Any] = {
                "read": _safe(lambda tp=tp: consumer._read_offset.get(tp)),
                "committed": _safe(lambda tp=tp: consumer._committed_offset.get(tp)),
                "highwater": _safe(lambda tp=tp: consumer.highwater(tp)),
            }
            with contextlib.suppress(Exception):  # .get: both are defaultdicts, a read must not add a key
                row["acked_pending"] = len(consumer._acked.get(tp) or ())
            with contextlib.suppress(Exception):
                row["gaps"] = len(consumer._gap.get(tp) or ())
            row["client"] = _safe(lambda tp=tp: _client_state(consumer, tp))
            partitions[_tp(tp)] = row
        snap["partitions"] = partitions
    sources = _safe(lambda: app.topics._prism_batch_sources)
    if not isinstance(sources, list):
        sources = []
    snap["batch_sources"] = [{"topics": sorted(s.names), "buffered": len(s.buffer)} for s in sources]
    return snap


def _client_state(consumer: Any, tp: Any) -> dict[str, Any] | None:
    """The aiokafka consumer's own view of `tp` (beneath Faust's): fetch position, the committed
    offset it was reset from, whether it still waits for a reset and whether it is paused.
    Faust's numbers say what it handed over; these say whether aiokafka fetches at all (a
    partition with no position is never fetched)."""
    from aiokafka.structs import TopicPartition

    client = consumer._thread._consumer
    if client is None:
        return None
    assignment = client._subscription.subscription.assignment
    state = assignment.state_value(TopicPartition(tp.topic, tp.partition))
    if state is None:
        return None
    return {"position": state._position, "status": str(getattr(state, "_status", "")),
            "highwater": state.highwater, "lso": state.lso, "waiting_for_committed": len(state._committed_futs),
            "awaiting_reset": state.awaiting_reset, "paused": state.paused}


def _await_chain(coro: Any, limit: int) -> list[str]:
    """Where a suspended coroutine waits: its frame, then the frame of what it awaits, down to
    the innermost (``cr_await`` / ``gi_yieldfrom``), as ``function (file:line)``."""
    out: list[str] = []
    while coro is not None and len(out) < limit:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) \
            or getattr(coro, "ag_frame", None)
        if frame is None:
            if not out or not hasattr(coro, "cr_frame"):
                out.append(f"<{type(coro).__name__}>")  # a Future, an Event's waiter, ...
            break
        code = frame.f_code
        where = code.co_filename.rpartition("site-packages/")[2]  # aiokafka/conn.py, not a venv path
        out.append(f"{code.co_name} ({where}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) \
            or getattr(coro, "ag_await", None)
    return out


def task_stacks(loop: asyncio.AbstractEventLoop | None = None, limit: int = 24) -> list[str]:
    """One line per asyncio task: its name and the await chain it is suspended in."""
    lines = []
    for task in sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name()):
        try:
            chain = " -> ".join(_await_chain(task.get_coro(), limit))
        except Exception as exc:  # a diagnostic never raises
            chain = f"<unavailable: {exc!r}>"
        lines.append(f"{task.get_name()}: {chain}")
    return lines


def worker_task_stacks(app: Any, loop: asyncio.AbstractEventLoop | None = None) -> list[str]:
    """`task_stacks` of the worker's loop, then of the consumer thread's loop.

    Why: Faust runs the aiokafka consumer in a thread with its own event loop, and every commit,
    seek and offset read the worker awaits is carried out there (``call_thread``). A worker stuck in
    a commit shows only ``call_thread -> <FutureIter>`` on its own loop; what the commit waits for
    (a coordinator lookup, a lock, a request to a dead broker) is on the thread's loop. Listing a
    foreign loop's tasks from this thread only reads them (``asyncio.all_tasks`` copies the set,
    retrying while it changes), which is safe for a diagnosis."""
    lines = task_stacks(loop)
    thread_loop = _safe(lambda: app._consumer._thread.thread_loop)
    if isinstance(thread_loop, asyncio.AbstractEventLoop) and thread_loop is not (loop or _running_loop()):
        theirs = _safe(lambda: task_stacks(thread_loop))
        if isinstance(theirs, str):  # the read failed: say so in place of the lines
            theirs = [theirs]
        lines.extend(f"[consumer thread] {line}" for line in theirs)
    return lines


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
