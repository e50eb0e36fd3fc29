"""`PipelineApp._send_all`: a batch's records sent in order from one coroutine, deliveries
awaited together, failures reported per item (what `_write_all` retries or sends to the DLQ)."""

from __future__ import annotations

import asyncio

from app.agents.dlq import DlqRecord
from app.agents.publish import Emission
from app.bindings.kafka import KafkaRecord
from app.worker.pipeline import PipelineApp


class FakeProducer:
    def __init__(self, refuse: set[str] = frozenset(), fail: set[str] = frozenset()) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.refuse, self.fail = refuse, fail

    async def send(self, topic, key, value, partition, timestamp, headers):
        if value.decode() in self.refuse:
            raise RuntimeError(f"refused {value!r}")
        self.sent.append((topic, value))
        fut = asyncio.get_running_loop().create_future()
        if value.decode() in self.fail:
            fut.set_exception(OSError(f"lost {value!r}"))
        else:
            fut.set_result(None)
        return fut


def _item(*names: str) -> list[Emission]:
    return [Emission(f"t.{n[-2:]}", KafkaRecord(key=b"k", value=n.encode(), headers=[], timestamp_ms=1000))
            for n in names]


def test_records_go_out_in_order_and_failures_stay_with_their_item() -> None:
    items = [_item("a.v2", "a.v3"), _item("b.v2", "b.v3"), DlqRecord("t.dlq", None, b"c"), _item("d.v2", "d.v3")]
    p = FakeProducer(refuse={"b.v2"}, fail={"d.v3"})
    errors = asyncio.run(PipelineApp._send_all(None, p, items))  # type: ignore[arg-type]  # self is unused
    # b's first send was refused: its .v3 is not sent; every other record is, in order
    assert [v for _, v in p.sent] == [b"a.v2", b"a.v3", b"c", b"d.v2", b"d.v3"]
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], RuntimeError) and isinstance(errors[3], OSError)


def test_nothing_to_send() -> None:
    assert asyncio.run(PipelineApp._send_all(None, FakeProducer(), [])) == []  # type: ignore[arg-type]
