"""`sinks:` in topology files: defaults, per-backend keys, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.errors import ConfigError
from app.sinks.runner import SinkAgent, build_sink
from app.sinks.s3 import S3Sink
from app.topology import NatsSinkSpec, PostgresSinkSpec, load_topology
from app.worker.faust_app import make_app

BASE = {"name": "t", "namespace": "ns", "sources": [{"topic": "orders.created", "partitions": 2}],
        "stages": ["normalize"], "outputs": {"sign": False, "layouts": ["v3"]}}


def _load(tmp_path: Path, sinks: list) -> object:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({**BASE, "sinks": sinks}))
    return load_topology(path)


def test_defaults_and_backend_specific_keys(tmp_path: Path) -> None:
    topo = _load(tmp_path, [{"type": "postgres", "name": "events-db", "schema": "prism"},
                            {"type": "nats", "name": "js", "stream": "ORDERS", "on_outage": "dlq", "max_attempts": 7}])
    pg, js = topo.sinks
    assert isinstance(pg, PostgresSinkSpec) and pg.db_schema == "prism" and pg.input == "v3"
    assert (pg.batch_size, pg.linger_ms, pg.on_outage) == (500, 50, "wait")
    assert isinstance(js, NatsSinkSpec) and js.max_attempts == 7 and js.duplicate_window_s == 120
    sink = build_sink(js, topo)
    assert sink.stream_subjects == ["orders.created"]  # default: the topology's source topics


def test_no_sinks_is_the_default(tmp_path: Path) -> None:
    assert _load(tmp_path, []).sinks == []


@pytest.mark.parametrize(("sinks", "expected"), [
    ([{"type": "nats", "name": "n", "stream": "S", "bucket": "x"}], "sinks[0].nats.bucket: unknown key"),
    ([{"type": "s3", "name": "s"}], "sinks[0].s3.bucket: required, and missing"),
    ([{"type": "kafka", "name": "k"}], "sinks[0]"),
    ([{"type": "postgres", "name": "a"}, {"type": "postgres", "name": "a"}], "sink names must be unique"),
    ([{"type": "postgres", "name": "Bad Name"}], "sinks[0].postgres.name"),
    ([{"type": "postgres", "name": "p", "on_outage": "drop"}], "sinks[0].postgres.on_outage"),
    ([{"type": "postgres", "name": "p", "schema": "x; DROP"}], "sinks[0].postgres.schema"),
    # what failed only at the sink's first connect or write, after the worker had started
    ([{"type": "redis-stream", "name": "r", "url": "http://h:6379"}],
     "sinks[0].redis-stream.url: 'http://h:6379' is not a redis:// / rediss:// / unix:// URL"),
    ([{"type": "nats", "name": "n", "stream": "S", "url": "ftp://x"}], "sinks[0].nats.url: 'ftp://x' is not"),
    ([{"type": "postgres", "name": "p", "dsn": "mysql://u:secret@h/db"}], "sinks[0].postgres.dsn: 'h/db' is not"),
    ([{"type": "s3", "name": "s", "bucket": "Upper_Case"}], "sinks[0].s3.bucket"),
    ([{"type": "s3", "name": "s", "bucket": "b-1", "endpoint": "minio:9000"}], "sinks[0].s3.endpoint"),
    ([{"type": "postgres", "name": "p", "backoff_initial_ms": 9000, "backoff_max_ms": 100}],
     "sinks[0].postgres: backoff_initial_ms 9000 is larger than backoff_max_ms 100"),
    # Redis refuses such an expire time at every write ("ERR invalid expire time"): the sink never delivered
    ([{"type": "redis-stream", "name": "r", "dedup_ttl_s": 10**20}], "sinks[0].redis-stream.dedup_ttl_s"),
    ([{"type": "redis-pubsub", "name": "r", "dedup_ttl_s": 10 * 365 * 86_400 + 1}], "sinks[0].redis-pubsub.dedup_ttl_s"),
    # a typo in `type:` names the type meant
    ([{"type": "postgress", "name": "p"}], "sinks[0]: type 'postgress' is not a sink type - did you mean 'postgres'?"),
])
def test_invalid_sink_config_is_a_config_error_naming_the_key(tmp_path: Path, sinks: list, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, sinks)
    assert expected in str(info.value)


def test_connection_strings_of_every_accepted_form_load(tmp_path: Path) -> None:
    topo = _load(tmp_path, [{"type": "redis-stream", "name": "a", "url": "rediss://cache:6380/1"},
                            {"type": "redis-pubsub", "name": "b", "url": "unix:///run/redis.sock"},
                            {"type": "postgres", "name": "c", "dsn": "host=db dbname=events"},  # libpq keywords
                            {"type": "postgres", "name": "d", "dsn": "postgres://db/events"},
                            {"type": "nats", "name": "e", "stream": "S", "url": "tls://nats:4222"},
                            {"type": "s3", "name": "f", "bucket": "prism.archive-1", "endpoint": "https://s3.local"}])
    assert len(topo.sinks) == 6


def test_a_sink_cannot_read_a_layout_the_topology_does_not_publish(tmp_path: Path) -> None:
    topo = _load(tmp_path, [{"type": "s3", "name": "s", "bucket": "archive", "input": "v2"}])
    app = make_app("sink-config-test", "127.0.0.1:1", tmp_path / "data")
    with pytest.raises(ConfigError, match="reads the v2 output"):
        SinkAgent(app, topo, topo.sinks[0])
    assert isinstance(build_sink(topo.sinks[0]), S3Sink)
