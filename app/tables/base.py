"""Helpers shared by the Faust table bindings.

Faust is imported lazily so that the pure cores (and their unit tests) do not pay for it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["current_partition", "make_table"]


def current_partition() -> int:
    """Partition of the event the calling agent is processing.

    Faust's RocksDB store keeps one database per partition and routes table reads and writes by
    the current event; the bindings record the partition next to values that must later be
    expired from the right changelog partition.

    Raises:
        RuntimeError: when called outside an agent/stream iteration.
    """
    from faust import current_event

    event = current_event()
    if event is None:
        raise RuntimeError("this table operation must run inside an agent processing an event "
                           "(Faust routes table writes by the current event's partition)")
    return int(event.message.partition)


def make_table(app: Any, name: str, *, partitions: int | None = None, help: str | None = None,
               raw: bool = False) -> Any:
    """A plain (non-windowed) Faust table with no default: JSON keys and values, or with
    ``raw=True`` bytes in and out (for per-message tables, where the codec is the cost).

    ``partitions`` must equal the source topic's partition count (Faust raises
    ``PartitionsMismatch`` otherwise); ``None`` uses the app's ``topic_partitions``.
    """
    if raw:
        # bytes as key/value type: Faust's registry passes bytes through for store and changelog
        return app.Table(name, default=None, partitions=partitions, help=help, key_type=bytes, value_type=bytes)
    # No key_type/value_type: Faust then serializes keys and values as JSON.
    return app.Table(name, default=None, partitions=partitions, help=help)
