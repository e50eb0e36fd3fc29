"""`send_all` (app/worker/delivery.py): a batch's records handed to the aiokafka producer beneath Faust's in
item order (one batch per topic-partition, `app/worker/batch_send.py`), deliveries awaited
together, failures reported per item (what `AtLeastOnce.write_all` retries or sends to the DLQ)."""

from __future__ import annotations

import asyncio

from app.agents.dlq import DlqRecord
from app.agents.publish import Emission
from app.bindings.kafka import KafkaRecord
from app.worker.batch_send import RefusedUpFront
from app.worker.delivery import send_all
from tests.worker.test_batch_send import FakeAiokafka


class FaustProducer:
    """What `send_all` is given: Faust's producer, whose aiokafka producer does the work."""

    def __init__(self, inner: FakeAiokafka) -> None:
        self.inner = inner

    def _ensure_producer(self) -> FakeAiokafka:
        return self.inner


#: The write limits `send_all` is given: none that these records reach, so that the producer's
#: own refusal is what is tested here (the limits are tested in test_write_limits.py).
def no_limit(topic: str) -> int:
    return 1 << 30


def _item(*names: str, size: int = 0) -> list[Emission]:
    return [Emission(f"t.{n[-2:]}", KafkaRecord(key=b"k", value=n.encode() + b"." * size, headers=[],
                                                timestamp_ms=1000)) for n in names]


def test_records_go_out_in_order_and_failures_stay_with_their_item() -> None:
    items = [_item("a.v2", "a.v3"), _item("b.v2", size=5000) + _item("b.v3"), DlqRecord("t.dlq", None, b"c"),
             _item("d.v2", "d.v3")]
    inner = FakeAiokafka(fail={b"d.v3"}, room=100)
    errors = asyncio.run(send_all(FaustProducer(inner), items, no_limit))
    # b's first record was refused (too large): its .v3 is not sent; every other record is, in
    # order, one batch per topic-partition
    assert inner.batches == [("t.v2", [b"a.v2", b"d.v2"]), ("t.v3", [b"a.v3", b"d.v3"]), ("t.dlq", [b"c"])]
    assert errors[2] is None
    assert isinstance(errors[1], RefusedUpFront)  # a MessageSizeTooLargeError raised before anything was queued
    # d.v3's batch failed, and a.v3 was in it: both items are retried (at-least-once)
    assert isinstance(errors[3], OSError) and isinstance(errors[0], OSError)


def test_nothing_to_send() -> None:
    assert asyncio.run(send_all(FaustProducer(FakeAiokafka()), [], no_limit)) == []
