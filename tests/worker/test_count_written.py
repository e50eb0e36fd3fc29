"""`count_written` (app/worker/delivery.py): what a send wrote, counted once per send - every
record per topic in `RunStats.written`, one `emitted` per message whose outputs were written, the
DLQ copies counted by their topic only - and the messages whose outputs were written returned in
order (what the delivery records in the dedup table and acknowledges)."""

from __future__ import annotations

from app.agents.base import Message
from app.agents.dlq import DlqRecord
from app.agents.publish import Emission
from app.bindings.kafka import KafkaRecord
from app.worker.delivery import count_written
from app.worker.interfaces import RunStats


def _msg(offset: int) -> Message:
    return Message("src", 0, offset, b"v")


def _outputs(*topics: str) -> list[Emission]:
    return [Emission(t, KafkaRecord(key=b"k", value=b"v", headers=[], timestamp_ms=1000)) for t in topics]


def test_outputs_and_dlq_copies_are_counted_per_topic_and_the_emitted_returned_in_order() -> None:
    stats = RunStats()
    stats.written["src.v2"] = 5  # an earlier send's: added to, not replaced
    stats.emitted = 5
    m0, m1, m2, m3 = (_msg(o) for o in range(4))
    written = [(m0, _outputs("src.v2", "src.v3")), (m1, DlqRecord("src.dlq", b"k", b"v")),
               (m2, _outputs("src.v2", "src.v3")), (m3, _outputs("src.v3"))]
    emitted = count_written(stats, written)
    assert emitted == [m0, m2, m3] and all(a is b for a, b in zip(emitted, [m0, m2, m3], strict=True))
    assert stats.emitted == 8
    assert stats.written == {"src.v2": 7, "src.v3": 3, "src.dlq": 1}


def test_nothing_written_counts_nothing() -> None:
    stats = RunStats()
    assert count_written(stats, []) == []
    assert stats.emitted == 0 and stats.written == {}
    assert count_written(stats, [(_msg(0), DlqRecord("src.dlq", None, b"v"))]) == []
    assert stats.emitted == 0 and stats.written == {"src.dlq": 1}
