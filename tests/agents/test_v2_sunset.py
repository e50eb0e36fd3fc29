"""The `.v2` sunset (RFC-031 Breaking Change Procedure): `outputs.migration` with a controlled
clock - before the deprecation date nothing changes, from it every `.v2` record carries the
deprecation header, after the cutoff only `.v3` is written, signed so that it verifies alone;
phase changes are logged once; the topology refuses bad dates at load."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from app.agents.publish import Publisher
from app.envelope import Layout, decode, new_envelope
from app.errors import ConfigError
from app.security.signing import SCOPE_BATCH, SCOPE_PAIR, SCOPE_V2, VerificationKeys, verify
from app.sunset import CLOCK_OFFSET_ENV, DEPRECATION_HEADER, Phase, clock_from_env, parse_header
from app.topology import Archive, Outputs, Topology, load_topology
from tests.agents.conftest import make_msg

ROOT = Path(__file__).resolve().parents[2]
DEP = datetime(2030, 3, 1, tzinfo=UTC).timestamp()
CUT = datetime(2030, 6, 1, tzinfo=UTC).timestamp()


class Clock:
    """A controlled clock: the test moves it, nobody sleeps."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _topology(**kw: object) -> Topology:
    outputs = Outputs(migration={"deprecation_date": "2030-03-01", "cutoff_date": "2030-06-01T00:00:00Z"}, **kw)
    return Topology(name="t", namespace="ns", sources=[{"topic": "orders.created"}],
                    stages=[{"name": "normalize", "settings": {}}], outputs=outputs, archive=Archive(topic="arch"))


def _batch(pub: Publisher, n: int = 3) -> list[dict[str, object]]:
    prepared = []
    for i in range(n):
        msg = make_msg(b"", key=b"K", offset=i)
        msg.envelope = new_envelope("orders.created", {"a": i}, namespace="ns")
        prepared.append(pub.prepare(msg))
    return [{e.topic: e.record for e in emissions} for emissions in pub.finish(prepared)]


@pytest.mark.parametrize("scope", ["batch", "pair", "v2"])
def test_the_three_phases_with_a_controlled_clock(dev_keys, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    key = dev_keys.keyring.worker_key()
    keys = VerificationKeys.of([key])
    clock = Clock(DEP - 1)
    with caplog.at_level(logging.INFO, logger="prism.worker"):
        pub = Publisher(_topology(signature_scope=scope), worker_key=key, clock=clock)
        expected = {"batch": SCOPE_BATCH, "pair": SCOPE_PAIR, "v2": SCOPE_V2}[scope]

        # before the deprecation date: both copies, no header
        for out in _batch(pub):
            assert set(out) == {"orders.created.v2", "orders.created.v3", "arch"}
            assert DEPRECATION_HEADER not in dict(out["orders.created.v2"].headers)
        assert pub.migration_status()["v2"] == "active"

        # from the deprecation date: every .v2 record carries the header; signatures unchanged
        clock.now = DEP
        for out in _batch(pub):
            v2, v3 = out["orders.created.v2"], out["orders.created.v3"]
            notice = parse_header(dict(v2.headers)[DEPRECATION_HEADER])
            assert notice == {"deprecated": "2030-03-01T00:00:00Z", "sunset": "2030-06-01T00:00:00Z",
                              "successor": "orders.created.v3"}
            assert DEPRECATION_HEADER not in dict(v3.headers)
            assert verify(v2.value, keys, layout=Layout.DRAFT).scope == expected
            assert verify(v3.value, keys, layout=Layout.REVIEWED).scope == expected
        assert pub.migration_status() == {"v2": "deprecated", "v2_written": True, "header": DEPRECATION_HEADER,
                                          "deprecation_date": "2030-03-01T00:00:00Z",
                                          "cutoff_date": "2030-06-01T00:00:00Z"}

        # after the cutoff: .v3 (and the archive copy of it) only, each signed on its own
        clock.now = CUT + 1
        for i, out in enumerate(_batch(pub)):
            assert set(out) == {"orders.created.v3", "arch"}
            v3 = out["orders.created.v3"]
            assert out["arch"].value == v3.value
            assert verify(v3.value, keys, layout=Layout.REVIEWED).scope == SCOPE_V2
            assert decode(v3.value).payload_json() == {"a": i}
            assert ("prism-source", f"orders.created/0/{i}".encode()) in v3.headers
        assert pub.migration_status()["v2"] == "stopped" and pub.migration_status()["v2_written"] is False

    sunset_lines = [r for r in caplog.records if getattr(r, "event", "") == "v2_sunset"]
    assert [r.phase for r in sunset_lines] == ["active", "deprecated", "stopped"]  # once per change
    assert "writes .v3 only" in sunset_lines[-1].getMessage() and "2030-06-01" in sunset_lines[-1].getMessage()


def test_a_worker_started_after_the_cutoff_says_so_at_start_up(dev_keys, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="prism.worker"):
        pub = Publisher(_topology(), worker_key=dev_keys.keyring.worker_key(), clock=Clock(CUT + 3600))
    assert pub.phase is Phase.STOPPED
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "v2_sunset"]
    assert "at start-up" in line.getMessage() and "writes .v3 only" in line.getMessage()


def test_without_migration_nothing_changes(dev_keys) -> None:
    topo = Topology(name="t", namespace="ns", sources=[{"topic": "orders.created"}],
                    stages=[{"name": "normalize", "settings": {}}])
    pub = Publisher(topo, worker_key=dev_keys.keyring.worker_key(), clock=Clock(CUT + 1))
    assert pub.migration_status() is None
    out = _batch(pub, 1)[0]
    assert set(out) == {"orders.created.v2", "orders.created.v3"}


def test_clock_offset_from_the_environment() -> None:
    clock = clock_from_env({CLOCK_OFFSET_ENV: "86400"})
    import time

    assert abs(clock() - (time.time() + 86400)) < 5
    for bad in ("tomorrow", "nan", "inf"):  # nan and inf made every sunset date compare false
        with pytest.raises(ConfigError, match=CLOCK_OFFSET_ENV):
            clock_from_env({CLOCK_OFFSET_ENV: bad})


def test_migration_is_validated_at_load_with_every_problem_at_once(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["outputs"]["migration"] = {"deprecation_date": "2030-06-01", "cutoff_date": "2030-03-01"}
    doc["sources"][0]["lnmp"] = {"mode": "lenient"}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        load_topology(path)
    text = str(err.value)
    assert "2 problem(s)" in text
    assert "outputs.migration: cutoff_date" in text and "must come after deprecation_date" in text
    assert "sources[0].lnmp.mode" in text
    doc["sources"][0].pop("lnmp")
    doc["outputs"]["migration"] = {"deprecation_date": "soon", "cutoff_date": "2030-03-01"}
    doc["outputs"]["layouts"] = ["v3"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"outputs\.migration\.deprecation_date.*ISO 8601"):
        load_topology(path)
    doc["outputs"]["migration"] = {"deprecation_date": "2030-01-01", "cutoff_date": "2030-03-01"}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"layouts must be \[v2, v3\]"):
        load_topology(path)
    doc["outputs"]["layouts"] = ["v2", "v3"]
    path.write_text(yaml.safe_dump(doc))
    t = load_topology(path)
    assert t.outputs.migration is not None and t.outputs.migration.cutoff_date.year == 2030


def test_an_sdk_consumer_of_v2_warns_once_naming_the_cutoff(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    from types import SimpleNamespace

    from app.sdk.backends.base import Delivery, SubscribeSettings
    from app.sdk.client import Subscription
    from app.sdk.pii import PiiPolicy
    from app.sunset import Sunset

    notice = Sunset(datetime(2030, 3, 1, tzinfo=UTC), datetime(2030, 6, 1, tzinfo=UTC)).header_value(
        "orders.created.v3")
    env = new_envelope("orders.created", {"a": 1}, namespace="ns")

    class Fake(Delivery):
        backend = "kafka"

        def decode(self, verify_with):  # type: ignore[no-untyped-def]
            return env

        async def ack(self) -> None: ...

        async def nack(self) -> None: ...

        def header(self, name: str) -> bytes | None:
            return notice if name == DEPRECATION_HEADER else None

    client = SimpleNamespace(version_reporter=None, consumer_id=None)
    sub = Subscription(client, "orders.created.v2", SubscribeSettings(group="billing"),  # type: ignore[arg-type]
                       verify_with=None, decrypt_with=None, assertion=None, pii=PiiPolicy(set()),
                       payload_type=None, poll_interval=0.1, drop_expired=True)
    with caplog.at_level(logging.WARNING, logger="prism.sdk"):
        for _ in range(3):
            assert asyncio.run(sub._accept(Fake())) is not None
    [line] = [r for r in caplog.records if getattr(r, "event", "") == "v2_deprecated"]
    text = line.getMessage()
    assert "2030-06-01T00:00:00Z" in text and "orders.created.v3" in text and "'billing'" in text
