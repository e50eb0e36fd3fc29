"""An independent Kafka client for end-to-end tests: librdkafka (C) through confluent-kafka.

The brief suggests kcat, and Debian's kcat is librdkafka too - but Debian 12 ships
librdkafka 2.0.2, which cannot parse the ApiVersions response of the embedded Tansu
0.6.0 broker ("Read underflow"), so kcat cannot connect to it at all. confluent-kafka bundles
librdkafka 2.16, which can. Either way no line of Prism's (or aiokafka's) code is on the
client side of these tests.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition


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
    """Every record of `topic` from the beginning: stops 1 s after `expected` records, or
    after 3 s without a new one, or at `timeout`. `read_committed`: librdkafka's
    ``isolation.level=read_committed`` - what a consumer of an exactly_once worker configures
    (records of aborted transactions are never returned); otherwise every record written."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"independent-{time.monotonic_ns()}",
                  "enable.auto.commit": False,
                  "isolation.level": "read_committed" if read_committed else "read_uncommitted"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list = []
    deadline = last = time.monotonic()
    deadline += timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            now = time.monotonic()
            if m is not None and m.error() is None:
                out.append(m)
                last = now
            elif (len(out) >= expected and now - last > 1.0) or now - last > 3.0:
                break
    finally:
        c.close()
    return out
