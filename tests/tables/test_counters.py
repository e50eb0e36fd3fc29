"""TopicCounters core: per-partition keys, totals summed over partitions."""

from __future__ import annotations

from typing import Any

import pytest

from app.tables.counters import TopicCounters


def test_incr_per_partition_and_sum_on_read() -> None:
    backend: dict[str, Any] = {}
    counters = TopicCounters(backend)
    assert counters.incr("orders.created", partition=0) == 1
    assert counters.incr("orders.created", partition=0) == 2
    assert counters.incr("orders.created", partition=3, n=5) == 5
    counters.incr("orders.created", "dlq", partition=1)
    counters.incr("payments", partition=0)
    assert backend == {"orders.created/0/messages": 2, "orders.created/3/messages": 5,
                       "orders.created/1/dlq": 1, "payments/0/messages": 1}
    assert counters.get("orders.created") == 7
    assert counters.get("orders.created", "dlq") == 1
    assert counters.get("unknown") == 0
    assert counters.by_partition("orders.created") == {0: 2, 3: 5}
    assert counters.totals() == {"orders.created": {"messages": 7, "dlq": 1}, "payments": {"messages": 1}}


def test_zero_increment_is_allowed_and_returns_current_value() -> None:
    counters = TopicCounters({})
    counters.incr("t", n=3)
    assert counters.incr("t", n=0) == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"topic": "bad/topic"}, "invalid topic name"),
    ({"topic": ""}, "invalid topic name"),
    ({"topic": "t", "counter": "a/b"}, "invalid counter name"),
    ({"topic": "t", "n": -1}, "counters only grow"),
    ({"topic": "t", "n": True}, "counters only grow"),
    ({"topic": "t", "partition": -1}, "invalid partition"),
])
def test_invalid_input(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TopicCounters({}).incr(**kwargs)


def test_key_round_trip() -> None:
    key = TopicCounters.key("a.b-c_d", "to.v3", 12)
    assert TopicCounters.parse_key(key) == ("a.b-c_d", 12, "to.v3")


def test_faust_bindings_refuse_to_write_outside_an_agent() -> None:
    from app.tables import FaustSequenceTracker, FaustTopicCounters

    from .conftest import FakeApp

    with pytest.raises(RuntimeError, match="inside an agent"):
        FaustTopicCounters(FakeApp()).incr("t")
    with pytest.raises(RuntimeError, match="inside an agent"):
        FaustSequenceTracker(FakeApp()).observe("s", 1)
