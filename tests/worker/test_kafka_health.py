"""The `/readyz` check for a cluster in trouble (app/worker/kafka_health.py) and the
replication-factor setting, without a broker: the end-to-end proof is in
tests/kafka/test_broker_failures.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.broker.admin import BrokerSettings, BrokerSettingsError
from app.observability.health import HealthState
from app.worker.kafka_health import WRITE_STALL_S, WriteWatch, leader_problems


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_failed_write_is_reported_until_one_succeeds() -> None:
    watch = WriteWatch(clock=Clock())
    token = watch.begin()
    watch.end(token, RuntimeError("NotEnoughReplicasError"))
    assert watch.problem(lambda: ["broker unreachable: 2"]) == \
        "writes failing: RuntimeError: NotEnoughReplicasError (retrying); broker unreachable: 2"
    watch.end(watch.begin(), None)
    assert watch.problem(lambda: ["never asked"]) is None


def test_a_write_waiting_past_the_threshold_is_reported_with_its_cause() -> None:
    clock = Clock()
    watch = WriteWatch(clock=clock)
    first = watch.begin()
    clock.now += 1
    watch.begin()
    clock.now += WRITE_STALL_S - 1.5  # the oldest has waited just under the threshold
    asked: list[bool] = []
    assert watch.problem(lambda: asked.append(True) or []) is None and not asked  # type: ignore[func-returns-value]
    clock.now += 2  # now 6.5 s
    assert watch.problem(lambda: ["partition leader unavailable: t.v3[1]"]) == \
        "writes failing: a write has waited 6 s; partition leader unavailable: t.v3[1]"
    watch.discard(first)  # abandoned at shutdown: no verdict, no longer in flight
    assert watch.oldest_age() == pytest.approx(5.5)


class _Conn:
    def __init__(self, up: bool) -> None:
        self.up = up

    def connected(self) -> bool:
        return self.up


def _client(leaders: dict[tuple[str, int], int], conns: dict[int, bool]) -> Any:
    from aiokafka.client import ConnectionGroup

    cluster = SimpleNamespace(
        partitions_for_topic=lambda t: {p for (tt, p) in leaders if tt == t} or None,
        leader_for_partition=lambda tp: leaders[(tp.topic, tp.partition)],
        broker_metadata=lambda node: SimpleNamespace(host="127.0.0.1", port=9000 + node) if node < 9 else None)
    return SimpleNamespace(cluster=cluster,
                           _conns={(n, ConnectionGroup.DEFAULT): _Conn(up) for n, up in conns.items()})


def test_leader_problems_names_lost_leaders_and_unreachable_brokers() -> None:
    client = _client({("t", 0): 1, ("t", 1): -1, ("t", 2): 2, ("t", 3): 3}, {1: True, 2: False})
    assert leader_problems(client, [("t", 0), ("t", 1), ("t", 2), ("t", 3), ("other", 0)]) == [
        "partition leader unavailable: t[1]",
        "broker unreachable: 2 (127.0.0.1:9002) leads t[2]",
        "broker unreachable: 3 (127.0.0.1:9003) leads t[3]",
    ]
    assert leader_problems(client, [("t", 0)]) == []
    assert leader_problems(object(), [("t", 0)]) == []  # not an aiokafka client (not started): cannot tell


def test_readiness_fails_while_kafka_is_in_trouble_and_recovers() -> None:
    clock = Clock()
    h = HealthState(clock=clock)
    h.mark_started()
    h.set_broker_connected(True)
    h.partitions_assigned([("t", 0)])
    assert h.readiness().ok
    h.set_kafka_problem("writes failing: a write has waited 6 s")
    clock.now += 2
    h.set_kafka_problem("writes failing: a write has waited 8 s")
    r = h.readiness()
    assert not r.ok and r.checks["kafka"] == {"ok": False, "reason": "writes failing: a write has waited 8 s",
                                              "for_seconds": 2.0}
    assert h.liveness().ok  # restarting the worker would not bring a broker back
    h.set_kafka_problem(None)
    assert h.readiness().ok and "kafka" not in h.readiness().checks


def test_replication_factor_setting_is_validated_at_start_up() -> None:
    url = {"PRISM_BROKER_URL": "k1:9092,k2:9092,k3:9092"}
    assert BrokerSettings.from_env(url).replication_factor == 1
    assert BrokerSettings.from_env({**url, "PRISM_REPLICATION_FACTOR": "3"}).replication_factor == 3
    for bad in ("0", "three", "-1", "40000"):
        with pytest.raises(BrokerSettingsError, match="PRISM_REPLICATION_FACTOR"):
            BrokerSettings.from_env({**url, "PRISM_REPLICATION_FACTOR": bad})
    with pytest.raises(BrokerSettingsError, match="embedded broker is one node"):
        BrokerSettings.from_env({"PRISM_REPLICATION_FACTOR": "3"})
    assert BrokerSettings.from_env({"PRISM_REPLICATION_FACTOR": "1"}).embedded


def test_the_faust_app_replicates_its_changelogs_as_configured(tmp_path: Any) -> None:
    from app.worker.faust_app import make_app

    settings = BrokerSettings.from_env({"PRISM_BROKER_URL": "k1:9092", "PRISM_REPLICATION_FACTOR": "3"})
    assert make_app("rf", "k1:9092", tmp_path, settings=settings).conf.topic_replication_factor == 3
    assert make_app("rf1", "k1:9092", tmp_path).conf.topic_replication_factor == 1
    assert make_app("rf2", "k1:9092", tmp_path, settings=settings, replication_factor=2
                    ).conf.topic_replication_factor == 2


async def test_a_retried_changelog_flush_is_reported_to_readiness_until_it_succeeds() -> None:
    """`WorkerState.retrying` (the dedup changelog flush) reports its attempts to the write
    watch: while it retries, `/readyz` says "writes failing" instead of the worker stalling with
    200s (the outputs' writes were reported, this flush was not)."""
    from app.worker.worker_state import WorkerState

    state = WorkerState(SimpleNamespace(should_stop=False),  # type: ignore[arg-type]
                        SimpleNamespace(dlq=SimpleNamespace(backoff_initial_ms=1, backoff_max_ms=2)))  # type: ignore[arg-type]
    watch = WriteWatch()
    seen: list[str | None] = []
    attempts = iter([ValueError("Unrecognized partition"), ValueError("Unrecognized partition"), None])

    async def flush() -> str:
        seen.append(watch.failing)
        err = next(attempts)
        if err is not None:
            raise err
        return "flushed"

    assert await state.retrying(flush, "writing the dedup changelog", watch=watch) == "flushed"
    assert seen == [None, "ValueError: Unrecognized partition", "ValueError: Unrecognized partition"]
    assert watch.failing is None and watch.oldest_age() == 0.0  # the success cleared it
