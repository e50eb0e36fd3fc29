"""Kafka's key placement, with the key hash compiled when `prism_native` is in use (issue 29).

A keyed Kafka record goes to partition ``(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)`` of
the topic's partitions sorted by id - the Java client's rule, which aiokafka's
`DefaultPartitioner` and librdkafka's `murmur2` partitioner follow, so a key lands on the same
partition whichever client writes it. aiokafka computes `murmur2` in pure Python: ~3.8 µs for a
36-byte key (a UUID correlation id, what `kafka.partition_key` gives by default), and the worker
writes every key twice (`.v2` and `.v3`). `murmur2` here is `prism_native.murmur2` (prism-client's
`partition::murmur2`) when `app.native` chose the compiled module, aiokafka's own function
otherwise; the two return the same unsigned 32-bit value for every input
(tests/bindings/test_partitioner.py), so placement does not depend on which one runs.

Used where Prism places keyed records itself (`app.worker.batch_send.send_batched`) and by the
SDK's Kafka producer (:class:`Partitioner`, handed to `AIOKafkaProducer(partitioner=...)`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as py_murmur2

from .. import native as _native

__all__ = ["Partitioner", "murmur2", "py_murmur2"]

#: Kafka's key hash (`aiokafka.partitioner.murmur2`'s value): compiled when `prism_native` is in
#: use (`app.native`), aiokafka's pure-Python function otherwise.
murmur2: Callable[[bytes], int] = _native.module.murmur2 if _native.module is not None else py_murmur2


class Partitioner(DefaultPartitioner):
    """aiokafka's `DefaultPartitioner` with the hash above: a keyed record goes where the
    default partitioner puts it (same hash, same mask, same modulo over all partitions), a
    keyless one is the default partitioner's own choice (random among the available
    partitions, else among all)."""

    def __call__(self, key: bytes | None, all_partitions: Sequence[int],  # type: ignore[override]
                 available: Sequence[int]) -> int:
        if key is None:
            return DefaultPartitioner.__call__(key, all_partitions, available)  # type: ignore[no-any-return]
        return all_partitions[(murmur2(key) & 0x7FFFFFFF) % len(all_partitions)]
