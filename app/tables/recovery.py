"""Table recovery that never dies on a local store that is ahead of its changelog.

The failure (measured, issue 14): with two or three workers in one group, ``kill -9`` of one
made a survivor crash while it took over the dead worker's partitions::

    ConsistencyError: The persisted offset for changelog topic partition ...-dedup-...-changelog/1
    is higher than the last offset in that topic (highwater) (2812 > 2717).

Faust (``faust/tables/recovery.py``, ``Recovery._restart_recovery``) compares, per changelog
partition it is about to recover, the offset its local RocksDB says it already holds (the
"persisted offset", written when a changelog write is acknowledged) with the topic's last
offset (``consumer.highwaters()`` - a ``ListOffsets(latest)``), and raises when the local one is
higher. The exception escapes the recovery task and takes the worker down; in a rebalance that
is the *survivor* - so one crash cascades into the whole group.

When can the local store be ahead?

* **A wrong end offset.** The embedded broker answers ``ListOffsets(latest)`` with the base offset
  of the last batch, short by up to a batch (``app.worker.offsets``). The worker corrects that
  when it knows the broker is the embedded one; a Kafka-compatible broker with the same bug that
  is reached through ``PRISM_BROKER_URL`` gets no correction. The difference in the report above
  (95) is one producer batch.
* **A changelog that lost its tail** on a real cluster: unclean leader election, a topic deleted and
  re-created, retention shorter than the gap. The local store then holds writes that no other
  replica will ever see.

What a correct system does: Kafka Streams treats a checkpoint beyond the changelog's end offset as
a corrupted task - it wipes the local state store and restores it from the changelog
(``TaskCorruptedException``; ``StoreChangelogReader``), it does not stop the application. The
changelog is the shared truth: every other replica and every future owner rebuilds from it.

What this module does, on every broker (the decision does not depend on the broker's bug), in
Faust's recovery (``PrismRecovery``: Faust's ``Recovery`` with two steps extended, installed by
``make_app`` through ``PrismTableManager``), on start-up and on every rebalance alike:

1. Every changelog end offset is verified with a ``Fetch`` (its high watermark is right even
   where ``ListOffsets`` is short; ``app.worker.offsets``) and raised where the fetch sees more:
   otherwise recovery would also stop early and the table come back without the changelog's
   last batch. The embedded broker's transport already does this; with transactions the end is
   the stable offset and nothing is changed.
2. :func:`plan_recovery` compares persisted offsets with those ends (pure, unit-tested).
   Normally nothing is ahead and nothing more happens. A partition that looks ahead gets one
   more verification (:func:`reconcile`): within the verified end, the store is kept.
3. A partition still ahead has its local data wiped - never the changelog - and is recovered
   from the start of the changelog, the same as on an empty data directory. A warning names
   the partition and both offsets.

Why wipe rather than clamp (keep the store, pretend it ends at the highwater): the entries beyond
the changelog's end are exactly the writes the rest of the group lost. For the dedup window
that would mean remembering message ids whose outputs the broker may have lost too, and
suppressing their redelivery - a silent loss. Rebuilding from the changelog can only cost a
re-read (and, for dedup, a duplicate - which at-least-once already allows).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# PrismRecovery and PrismTableManager are built on first access (module __getattr__ below).
__all__ = ["AheadOfChangelog", "plan_recovery", "reconcile", "wipe_partition"]

log = logging.getLogger("prism.tables.recovery")


@dataclass(frozen=True, slots=True)
class AheadOfChangelog:
    """The local store of ``tp`` claims offset ``persisted``; the changelog ends at ``highwater``.

    Both in Faust's convention: the offset of the last record (``end offset - 1``; -1 when empty).
    """

    tp: Any
    persisted: int
    highwater: int

    def __str__(self) -> str:
        return (f"{getattr(self.tp, 'topic', self.tp)}[{getattr(self.tp, 'partition', '?')}]: local store at offset "
                f"{self.persisted}, changelog ends at {self.highwater}")


def plan_recovery(persisted: Mapping[Any, int | None], highwaters: Mapping[Any, int | None],
                  tps: Iterable[Any] | None = None) -> list[AheadOfChangelog]:
    """The partitions whose local store must be wiped and rebuilt from the changelog.

    Args:
        persisted: partition -> offset the local store holds (``None``/missing: nothing local).
        highwaters: partition -> last offset of the changelog (``None``/missing: not known).
        tps: the partitions to decide for (default: every key of ``persisted``).

    A partition is ahead when both are known and ``persisted > highwater``. An unknown end offset
    never triggers a wipe (nothing to compare with); Faust's own check is skipped then as well.
    """
    out: list[AheadOfChangelog] = []
    for tp in (persisted if tps is None else tps):
        mine, end = persisted.get(tp), highwaters.get(tp)
        if mine is None or end is None or mine < 0:
            continue
        if mine > end:
            out.append(AheadOfChangelog(tp, int(mine), int(end)))
    return out


def reconcile(persisted: Mapping[Any, int | None], listed: Mapping[Any, int | None],
              verified: Mapping[Any, int], tps: Iterable[Any] | None = None,
              ) -> tuple[dict[Any, int], list[AheadOfChangelog]]:
    """The recovery decision for partitions whose local store looks ahead of the changelog.

    Args:
        persisted: partition -> last offset the local store holds.
        listed: partition -> last offset of the changelog per ``ListOffsets`` (what Faust uses).
        verified: partition -> last offset per a ``Fetch`` high watermark, for the partitions that
            looked ahead (missing: could not be verified).
        tps: the partitions to decide for (default: every key of ``persisted``).

    Returns:
        ``(corrected, rebuild)``: the end offsets to use instead of ``listed`` (where the fetch saw
        more; a broker answering ``ListOffsets`` short, like the embedded one), and the partitions
        still ahead of the corrected end - to be wiped and rebuilt from the changelog.
    """
    corrected = {tp: end for a in plan_recovery(persisted, listed, tps)
                 if (end := verified.get(tp := a.tp)) is not None and end > a.highwater}
    ends = {**listed, **corrected}
    return corrected, plan_recovery(persisted, ends, tps)


def wipe_partition(table: Any, partition: int) -> int:
    """Delete every local entry of one partition of a Faust table (and its persisted offset).

    Works on the open RocksDB handle (Faust never closes revoked partitions' databases, so
    removing the files under it would not be safe); the in-memory key -> partition index is
    cleared too, so reads cannot be routed to the emptied partition. Returns the keys deleted.
    Only the local copy is touched: the changelog in Kafka stays as it is.
    """
    store = table.data
    db_for = getattr(store, "_db_for_partition", None)
    if db_for is None:  # in-memory store: it does not survive restarts, there is nothing persisted
        return 0
    db = db_for(partition)
    keys = list(db.keys())
    for key in keys:
        db.delete(key)
    index = getattr(store, "_key_index", None)
    if index is not None:
        index.clear()
    return len(keys)


def _faust_classes() -> tuple[type, type]:
    from faust.tables import TableManager
    from faust.tables.recovery import Recovery

    if not hasattr(TableManager, "_update_channels"):
        raise RuntimeError(  # pragma: no cover - guards a Faust upgrade
            "faust TableManager has no '_update_channels': app/tables/recovery.py must be re-checked against this Faust")
    for attr in ("_build_offsets", "_build_highwaters", "_seek_offsets", "on_recovery_completed", "_is_changelog_tp",
                 "signal_recovery_start", "active_highwaters", "standby_offsets", "standby_tps"):
        if not hasattr(Recovery, attr) and attr not in getattr(Recovery, "__annotations__", {}):
            raise RuntimeError(  # pragma: no cover - guards a Faust upgrade
                f"faust Recovery has no {attr!r}: app/tables/recovery.py must be re-checked against this Faust")

    class _PrismRecovery(Recovery):  # type: ignore[misc, valid-type]
        """Faust's recovery; a partition whose local store is ahead of its changelog is rebuilt."""

        #: partitions rebuilt so far (for tests, logs and metrics)
        rebuilt: list[AheadOfChangelog]
        #: raised each time a recovery is about to read changelog partitions (`_fetch_changelogs`)
        fetch_epoch: int

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.rebuilt = []
            self.fetch_epoch = 0
            if getattr(self.app, "_prism_read_committed", False):
                self.app = _ReadCommittedView(self.app)

        async def _build_offsets(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
            # Active partitions: highwaters were built just before (Faust's order); reconcile
            # before Faust's consistency check and before the seek.
            await super()._build_offsets(consumer, tps, destination, title)
            if destination is self.active_offsets:
                await self._reconcile(consumer, tps, destination, self.active_highwaters, seek=False)

        async def _build_highwaters(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
            await super()._build_highwaters(consumer, tps, destination, title)
            # Every partition's end, verified with a Fetch where the transport does not already
            # do that (the embedded broker's does): a broker that answers ListOffsets short would
            # otherwise end the recovery early and the table would come back without the
            # changelog's last batch. Never lowers an end; not with transactions (the stable
            # offset, not the high watermark, is the end there).
            if not self.app.in_transaction and not _fetch_verified_transport(self.app):
                for tp, end in (await self._verified_ends(consumer, list(tps))).items():
                    if end > destination.get(tp, -1):
                        log.warning("changelog %s[%s]: ListOffsets said the last offset is %s, a fetch shows %s; "
                                    "recovering to the fetched end", tp.topic, tp.partition, destination.get(tp), end)
                        destination[tp] = end
            # Standby partitions: Faust builds (and seeks to) their offsets first, then the
            # highwaters, then checks; reconcile here and seek again.
            if destination is self.standby_highwaters:
                await self._reconcile(consumer, tps, self.standby_offsets, destination, seek=True)

        async def _reconcile(self, consumer: Any, tps: Any, offsets: Any, highwaters: Any, *, seek: bool) -> None:
            suspects = [a.tp for a in plan_recovery(offsets, highwaters, tps)]
            if not suspects:
                return  # the normal case: no extra broker round trip
            corrected, ahead = reconcile(offsets, highwaters, await self._verified_ends(consumer, suspects), suspects)
            for tp, end in corrected.items():
                log.warning("changelog %s[%s]: the broker's ListOffsets said the last offset is %s, a fetch shows "
                            "%s; using the fetched end (docs/platform-notes.md, the embedded broker)",
                            tp.topic, tp.partition, highwaters.get(tp), end)
                highwaters[tp] = end
            if not ahead:
                return
            earliest = await consumer.earliest_offsets(*[a.tp for a in ahead])
            for a in ahead:
                table = self.tp_to_table[a.tp]
                wiped = wipe_partition(table, a.tp.partition)
                start = earliest.get(a.tp)
                offsets[a.tp] = start - 1 if start is not None else -1  # Faust's "offset - 1" convention
                self.rebuilt.append(a)
                log.warning("table %s, %s: the local store is ahead of the changelog; wiped %d local entries "
                            "and rebuilding the partition from the changelog (the changelog lost records, or "
                            "was re-created)", table.name, a, wiped)
            if seek:
                await consumer.seek_wait({a.tp: max(offsets[a.tp], 0) for a in ahead})

        async def _seek_offsets(self, consumer: Any, tps: Any, offsets: Any, title: str) -> None:
            # Faust seeks every changelog partition a recovery is about to read (actives, then
            # standbys) just before it reads them: that is where they are made fetchable again.
            await self._fetch_changelogs(consumer, tps)
            await super()._seek_offsets(consumer, tps, offsets, title)

        async def on_recovery_completed(self, generation_id: int = 0) -> None:
            await super().on_recovery_completed(generation_id)
            await self._pause_changelogs(generation_id)

        async def _fetch_changelogs(self, consumer: Any, tps: Any) -> None:
            """Make `tps` fetched by aiokafka again (see :meth:`_pause_changelogs`). The epoch
            goes up first: a pause issued before this point finds it changed and does nothing,
            one that ran before it is undone here (both run in the consumer thread, in order)."""
            from app.worker.batch_source import set_fetching

            self.fetch_epoch += 1
            if tps:
                await set_fetching(consumer, tps, paused=False)

        async def _pause_changelogs(self, generation_id: int) -> None:
            """Pause in aiokafka the changelog partitions Faust has stopped reading (issue 29).

            Why: after a recovery Faust only stops *asking* aiokafka for the changelog
            partitions (``pause_partitions``); aiokafka goes on fetching every assigned
            partition it has not paused itself, so each fetch carried the changelogs and a fetch
            of idle changelogs alone held the source partitions back for the whole long poll
            (docs/operations.md, "The worker consumer's fetches"). Paused, they are left out of
            every fetch until the next recovery reads them (:meth:`_fetch_changelogs`, or a new
            assignment: aiokafka starts every one with nothing paused). The producer side is
            untouched: table writes still go to the changelog.

            Paused: the changelog partitions of this assignment that Faust itself has paused -
            never a standby partition (Faust reads those for as long as they are assigned) nor
            one Faust keeps reading after the recovery (``recovery_buffer_size`` 1).

            The race with a rebalance: the pause is applied in the consumer thread and only if,
            there and then, aiokafka's group generation is still the one this recovery finished
            for, no reassignment is under way, and no recovery has begun reading since
            (``fetch_epoch``); otherwise it is dropped - a pause can cost fetches, never stall a
            recovery. A failure is logged and the changelogs stay fetched, as before."""
            from app.worker.batch_source import set_fetching

            app = self.app
            consumer = app.consumer
            if app.consumer_generation_id != generation_id or self.signal_recovery_start.is_set():
                return  # a rebalance began: the recovery it starts decides
            epoch = self.fetch_epoch
            paused = getattr(consumer, "_paused_partitions", set())
            tps = {tp for tp in consumer.assignment()
                   if self._is_changelog_tp(tp) and tp in paused and tp not in self.standby_tps}
            if not tps:
                return
            try:
                await set_fetching(consumer, tps, paused=True,
                                   still=lambda client: self.still_current(client, generation_id, epoch))
            except Exception as exc:
                log.warning("could not pause the table changelog partitions after recovery (they stay fetched): "
                            "%r", exc)

        def still_current(self, client: Any, generation_id: int, epoch: int) -> bool:
            """In the consumer thread: is the recovery that ended for `generation_id` at `epoch`
            still the last one (aiokafka's generation the same, no reassignment under way, no
            recovery reading since)?"""
            return (self.fetch_epoch == epoch and client._coordinator.generation == generation_id
                    and not client._subscription.reassignment_in_progress)

        async def _verified_ends(self, consumer: Any, tps: list[Any]) -> dict[Any, int]:
            """Last offsets from a Fetch's high watermark (``app.worker.offsets.true_end_offsets``),
            asked only for partitions that look ahead: a short ``ListOffsets`` answer (the
            embedded broker's bug, on any broker that has it) is then told apart from a real
            loss. Faust's convention (last offset = end - 1). Empty when the broker cannot say."""
            from app.worker.offsets import true_end_offsets

            thread = getattr(consumer, "_thread", None)
            if thread is None or not tps or self.app.in_transaction:
                return {}

            async def query() -> Any:
                return await true_end_offsets(thread._ensure_consumer(), tps)

            try:
                # The probe connection where there is one (app/worker/offsets.py): on the worker
                # consumer's own connection the check waits behind its 1.5 s long-poll fetch.
                verified = getattr(thread, "verified_end_offsets", None)
                ends = await (verified(tps) if verified is not None else thread.call_thread(query))
            except Exception as exc:  # never worse than without the check: decide on ListOffsets
                log.warning("could not verify changelog end offsets with a fetch: %r", exc)
                return {}
            return {tp: int(end) - 1 for tp, end in ends.items() if end is not None}

    class _PrismTableManager(TableManager):  # type: ignore[misc, valid-type]
        @property
        def recovery(self) -> Any:
            if self._recovery is None:
                self._recovery = _PrismRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
            return self._recovery

        async def on_start(self) -> None:
            """Faust's start-up without its fixed one-second sleep before the tables are finalized.

            Why: Faust sleeps 1 s (``TableManager.on_start``) so that tables declared late - in an
            agent's start-up - still make it into the subscription; the consumer does not subscribe
            before that (the Conductor's "Waiting for tables to be registered"), so every worker
            start and restart paid that second. Prism declares every table when the pipeline is
            built, before the app starts (``app.worker.pipeline``: counters, sequences, dedup). A
            table declared after this point still fails loudly, as it would after the sleep
            (``RuntimeError: Too late to add tables at this point``). Nothing in the recovery
            changes: the changelogs are subscribed and restored before the first record, as before.
            """
            await asyncio.sleep(0)  # one turn of the loop: work queued while the app was starting runs first
            if not self.should_stop:
                await self._update_channels()
                await self.recovery.start()

    return _PrismRecovery, _PrismTableManager


class _ReadCommittedView:
    """The app as recovery sees it under Prism's exactly_once (app/worker/transactions.py):
    ``in_transaction`` is True, everything else is the app itself (reads and writes).

    Why: Faust keeps at-least-once internally while the batch path writes the dedup changelog in
    transactions, and its consumer reads ``read_committed``. A transactional changelog ends with a
    commit or abort marker, an offset no record has, so recovery never "reaches" the end offset -
    Faust's recovery knows that only when ``app.in_transaction`` (after two idle polls it takes the
    consumer position past the end as done: ``detect_aborted_tx``). The same flag makes the
    end-offset verification above stand aside: with ``read_committed`` the end is the last stable
    offset, not the high watermark a fetch reports."""

    in_transaction = True

    def __init__(self, app: Any) -> None:
        object.__setattr__(self, "_app", app)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._app, name, value)


def _fetch_verified_transport(app: Any) -> bool:
    """True when the app's consumer already derives end offsets from a fetch (embedded broker)."""
    from app.worker.offsets import listoffsets_workaround_installed

    try:
        return listoffsets_workaround_installed(app)
    except Exception:  # a transport that is not Kafka's: nothing to verify with
        return True


_CLASSES: tuple[type, type] | None = None


def _classes() -> tuple[type, type]:
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _faust_classes()
    return _CLASSES


def __getattr__(name: str) -> Any:
    # PrismRecovery / PrismTableManager subclass Faust's classes: built on first use (importing
    # faust is slow and the pure planner above does not need it).
    if name == "PrismRecovery":
        return _classes()[0]
    if name == "PrismTableManager":
        return _classes()[1]
    raise AttributeError(name)
