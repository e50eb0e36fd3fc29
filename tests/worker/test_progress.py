"""The stall watch (app/worker/progress.py) and its readiness report, without a broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from app.errors import ConfigError
from app.observability.health import HealthState
from app.worker.progress import DEFAULT_STALL_S, ENV_STALL_S, ProgressWatch, stall_after_from_env
from tests.worker.test_kafka_health import Clock  # the same settable clock


def test_messages_waiting_and_nothing_processed_past_the_limit_is_a_stall_until_progress() -> None:
    clock = Clock()
    watch = ProgressWatch(60, clock)
    assert watch.check(processed=10, waiting=500, excuse=None) is None
    clock.now += 59
    assert watch.check(processed=10, waiting=500, excuse=None) is None
    clock.now += 2
    text = watch.check(processed=10, waiting=480, excuse=None)
    assert text is not None and "480 message(s)" in text and "61 s" in text and watch.stalled == text
    clock.now += 1
    assert watch.check(processed=11, waiting=480, excuse=None) is None  # one batch clears it
    assert watch.stalled is None


@pytest.mark.parametrize("waiting, excuse", [(0, None), (None, None), (500, "paused")])
def test_nothing_waiting_unknown_lag_or_a_known_cause_is_not_a_stall(waiting, excuse) -> None:
    clock = Clock()
    watch = ProgressWatch(60, clock)
    for _ in range(5):
        clock.now += 60
        assert watch.check(processed=10, waiting=waiting, excuse=excuse) is None


def test_the_clock_restarts_when_the_known_cause_ends() -> None:
    """Paused for an hour, then resumed: the stall clock starts at the resume, not an hour ago."""
    clock = Clock()
    watch = ProgressWatch(60, clock)
    watch.check(processed=10, waiting=500, excuse="paused")
    clock.now += 3_600
    assert watch.check(processed=10, waiting=500, excuse="paused") is None
    clock.now += 1
    assert watch.check(processed=10, waiting=500, excuse=None) is None
    clock.now += 61
    assert watch.check(processed=10, waiting=500, excuse=None) is not None


def test_readiness_reports_the_stall_and_clears() -> None:
    h = HealthState()
    h.mark_started()
    h.set_broker_connected(True)
    h.partitions_assigned([("t", 0)])
    assert h.readiness().ok
    h.set_stalled("stalled: 5 message(s) wait")
    r = h.readiness()
    assert not r.ok and r.checks["progress"] == {"ok": False, "reason": "stalled: 5 message(s) wait"}
    assert h.liveness().ok  # a restart would lose the diagnosis; readiness only
    h.set_stalled(None)
    assert h.readiness().ok


def test_stall_limit_from_the_environment() -> None:
    assert stall_after_from_env({}) == DEFAULT_STALL_S
    assert stall_after_from_env({ENV_STALL_S: "120"}) == 120.0
    for bad in ("0", "soon", "nan", "-5"):
        with pytest.raises(ConfigError, match=ENV_STALL_S):
            stall_after_from_env({ENV_STALL_S: bad})


def _observer_over(lags: dict[int, int], *, paused: bool = False):
    """An Observer attached to a stand-in pipeline that owns partitions 0..n of topic `src`,
    with a broker lag snapshot of `lags` (only what the progress check reads)."""
    import time
    from types import SimpleNamespace

    from aiokafka.structs import TopicPartition

    from app.worker.lag import GroupLag, PartitionLag
    from app.worker.observe import Observer

    obs = Observer(stall_after_s=5)
    consumer = SimpleNamespace(assignment=lambda: {TopicPartition("src", p) for p in lags})
    app = SimpleNamespace(_consumer=consumer, rebalancing=False, in_recovery=False)
    obs.pipeline = SimpleNamespace(app=app, stats=SimpleNamespace(read=100),
                                   topology=SimpleNamespace(name="t", sources=[SimpleNamespace(topic="src")]))
    parts = tuple(PartitionLag("src", p, committed=10, log_start=0, log_end=10 + lag) for p, lag in lags.items())
    obs.lag_monitor = SimpleNamespace(latest=GroupLag("g", ("src",), parts, time.time(), "list_offsets"),
                                      interval_s=5.0, timeout_s=5.0)
    obs.health.mark_started()
    obs.health.partitions_assigned([("src", p) for p in lags])
    if paused:
        obs.paused.add("t")
    return obs


def test_the_observer_reports_a_stall_once_with_its_diagnosis(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    obs = _observer_over({0: 40, 1: 1})  # partition 1: an exactly_once commit marker, not a message
    obs.progress = ProgressWatch(5, clock)
    assert obs._waiting() == 40
    with caplog.at_level("WARNING", logger="prism.worker"):
        obs._refresh_progress()
        clock.now += 6
        obs._refresh_progress()
        clock.now += 1
        obs._refresh_progress()
    stalls = [r for r in caplog.records if getattr(r, "event", "") == "stalled"]
    assert len(stalls) == 1 and "40 message(s)" in stalls[0].getMessage() and "consumer:" in stalls[0].getMessage()
    assert obs.health.readiness().checks["progress"]["ok"] is False
    obs.pipeline.stats.read += 1
    with caplog.at_level("WARNING", logger="prism.worker"):
        obs._refresh_progress()
    assert "progress" not in obs.health.readiness().checks
    assert any(getattr(r, "event", "") == "stall_over" for r in caplog.records)


def test_a_paused_topology_is_never_a_stall() -> None:
    clock = Clock()
    obs = _observer_over({0: 40}, paused=True)
    obs.progress = ProgressWatch(5, clock)
    for _ in range(3):
        clock.now += 10
        obs._refresh_progress()
    assert obs.health.stalled is None


def test_a_stall_is_rewound_once_then_ends_the_worker_after_a_second_period() -> None:
    """Issue 31: a stall never persists - RESEEK at the first report, EXIT at twice the limit."""
    from app.worker.progress import Action

    clock = Clock()
    watch = ProgressWatch(60, clock)
    watch.check(processed=10, waiting=500, excuse=None)
    assert watch.action() is Action.NONE
    clock.now += 61
    watch.check(processed=10, waiting=500, excuse=None)
    assert watch.action() is Action.RESEEK
    assert watch.action() is Action.NONE  # once per stall
    clock.now += 58
    watch.check(processed=10, waiting=500, excuse=None)
    assert watch.action() is Action.NONE
    clock.now += 2
    watch.check(processed=10, waiting=500, excuse=None)
    assert watch.action() is Action.EXIT
    # progress ends the stall; the next one is rewound again first
    watch.check(processed=11, waiting=500, excuse=None)
    assert watch.action() is Action.NONE
    clock.now += 61
    watch.check(processed=11, waiting=500, excuse=None)
    assert watch.action() is Action.RESEEK


def _stalling_observer(stall_after_s: float, clock: Clock, perform_seek: Any,
                       crashed: list[object]) -> Any:
    """An observer over 40 waiting messages whose app rewinds with `perform_seek` and records
    what it is crashed with in `crashed`."""
    obs = _observer_over({0: 40})
    obs.progress = ProgressWatch(stall_after_s, clock)

    async def crash(exc: BaseException) -> None:
        crashed.append(exc)

    obs.pipeline.app.consumer = SimpleNamespace(perform_seek=perform_seek)
    obs.pipeline.app.crash = crash
    return obs


async def test_the_observer_rewinds_then_crashes_the_app_with_a_stall_error(caplog: pytest.LogCaptureFixture) -> None:
    from app.errors import StallError

    clock = Clock()
    calls: list[object] = []

    async def perform_seek() -> None:
        calls.append("seek")

    obs = _stalling_observer(5, clock, perform_seek, calls)
    with caplog.at_level("WARNING", logger="prism.worker"):
        obs._refresh_progress()
        await obs._act_on_stall()
        clock.now += 6
        obs._refresh_progress()
        await obs._act_on_stall()
        assert calls == ["seek"]
        clock.now += 5
        obs._refresh_progress()
        await obs._act_on_stall()
    assert calls[0] == "seek" and isinstance(calls[1], StallError) and len(calls) == 2
    line = next(r.getMessage() for r in caplog.records if getattr(r, "event", "") == "stall_exit")
    assert line.startswith("error [stalled] stalled: 40 message(s)") and "fix:" in line


async def test_a_rewind_the_consumer_never_carries_out_ends_the_worker(caplog: pytest.LogCaptureFixture) -> None:
    """The stall seen in CI: the consumer thread stuck in a commit, so the rewind (which that thread
    carries out) never returned either - and the watch, waiting on it, never reached its exit. The
    rewind is bounded by the stall period; past it the worker exits with a StallError that says so."""
    import asyncio

    from app.errors import StallError

    clock = Clock()
    crashed: list[object] = []
    never = asyncio.Event()

    async def perform_seek() -> None:
        await never.wait()

    obs = _stalling_observer(0.2, clock, perform_seek, crashed)
    with caplog.at_level("WARNING", logger="prism.worker"):
        obs._refresh_progress()
        clock.now += 0.25  # stalled (past 0.2 s), not yet past the exit (0.4 s): the rewind is due
        obs._refresh_progress()
        await asyncio.wait_for(obs._act_on_stall(), timeout=10)
    assert len(crashed) == 1 and isinstance(crashed[0], StallError), crashed
    assert "did not carry out a rewind" in str(crashed[0])
    line = next(r.getMessage() for r in caplog.records if getattr(r, "event", "") == "stall_exit")
    assert line.startswith("error [stalled] stalled: 40 message(s)") and "fix:" in line


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "x", "86400"])
def test_lag_settings_that_are_no_usable_seconds_stop_the_start(value: str) -> None:
    """PRISM_LAG_INTERVAL_S=nan was accepted and crashed the worker once the monitor started."""
    from app.errors import ConfigError
    from app.worker.lag import lag_settings_from_env

    with pytest.raises(ConfigError, match="PRISM_LAG_INTERVAL_S"):
        lag_settings_from_env({"PRISM_LAG_INTERVAL_S": value})
    assert lag_settings_from_env({"PRISM_LAG_INTERVAL_S": "2.5"})[0] == 2.5
