"""An independent Kafka client for end-to-end tests: librdkafka (C) through confluent-kafka.

The brief suggests kcat, and Debian's kcat is librdkafka too - but Debian 12 ships
librdkafka 2.0.2, which cannot parse the ApiVersions response of the embedded Tansu
0.6.0 broker ("Read underflow"), so kcat cannot connect to it at all. confluent-kafka bundles
librdkafka 2.16, which can. Either way no line of Prism's (or aiokafka's) code is on the
client side of these tests.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


def produce(bootstrap: str, topic: str, messages: list[tuple[bytes, list[tuple[str, bytes]], bytes | None]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "linger.ms": 5})
    errors: list[str] = []
    for value, headers, key in messages:
        p.produce(topic, value=value, key=key, headers=headers,
                  on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
    left = p.flush(30)
    assert left == 0 and not errors, (left, errors[:3])


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 30.0, *,
                read_committed: bool = False) -> list:
    """Every record of `topic` from the beginning: stops as soon as at least `expected` records
    are read and every partition has reported its end (librdkafka's partition EOF: the high
    watermark, or under read_committed the last stable offset, reached since the partition's last
    record), or after 3 s without a new record (too few records, or no end reported), or at
    `timeout`. `expected=0` therefore means "read to the end". `read_committed`: librdkafka's
    ``isolation.level=read_committed`` - what a consumer of an exactly_once worker configures
    (records of aborted transactions are never returned); otherwise every record written.

    Why the end of every partition rather than 1 s of quiet after `expected` records: it is
    exact (a slow fetch cannot end the read early) and it costs no idle second per read - these
    reads follow every end-to-end test, five of them per exactly_once verdict."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"independent-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list = []
    at_end: set[int] = set()
    deadline = last = time.monotonic()
    deadline += timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            now = time.monotonic()
            if m is not None and m.error() is None:
                out.append(m)
                at_end.discard(m.partition())
                last = now
            elif m is not None and m.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(m.partition())
            if len(out) >= expected and len(at_end) == partitions:
                break
            if now - last > 3.0:  # no end reported (or too few records): 3 s of quiet ends it
                break
    finally:
        c.close()
    return out
