"""A broker's per-batch size limit never dead-letters a record that fits, nor stops the worker (issue 31).

Kafka checks a topic's ``max.message.bytes`` against the whole record batch a producer sends,
not against each record. Before, the worker built 256 KiB batches whatever the topic allowed:
under a 100 KB limit a burst of 20 kB records went to the DLQ as ``too_large`` (at_least_once)
or crash-looped on ``OutOfOrderSequenceNumber`` (exactly_once), and one refused DLQ batch halved
the DLQ limit for good. Under limits of 64 KiB or less the input limit ("smallest output limit
minus 64 KiB") was 1 byte and every message went to the DLQ.

Here one worker per guarantee reads four sources whose `.v2`, `.v3` and DLQ topics are limited to
16 KiB, 60 KB, 100 KB and 1 MiB, and gets a burst of records of every size that fits - each must
reach `.v3` once, byte for byte, as with no limit - plus records over the room, which must reach
the DLQ as ``too_large``. Nothing is lost, the worker keeps running, and a limit that leaves no
room at all stops the start with one ``error [no_room]`` line.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaProducer

from app.bindings import kafka as kafka_binding
from app.broker.admin import ensure_topics
from app.demo.runner import read_all
from app.topology import load_topology
from app.worker.faust_app import WorkerProcess
from tests.worker import independent
from tests.worker.conftest import ROOT, make_topology

LIMITS = {"16k": 16 * 1024, "60k": 60_000, "100k": 100_000, "1m": 1 << 20}
#: what the worker adds to an input is measured at start-up (a few KiB); inputs up to the limit
#: minus this always fit, inputs over the limit never do
SAFE_OVERHEAD = 8 * 1024
BURST = 120


def _topology(tmp_path: Path, dev_keys: object, guarantee: str) -> tuple[Path, dict[str, int]]:
    base = make_topology(tmp_path, dev_keys, partitions=2)
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    suffix = uuid.uuid4().hex[:6]
    first = doc["sources"][0]
    doc["sources"] = [{**first, "topic": f"limits.{name}.{suffix}"} for name in LIMITS]
    doc["processing_guarantee"] = guarantee
    path = tmp_path / "limits.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert base.sources  # the shipped topology, keys and all
    return path, {f"limits.{name}.{suffix}": limit for name, limit in LIMITS.items()}


class _Rec:
    """A record as `app.bindings.kafka.decode` reads it."""

    def __init__(self, value: bytes, headers: list) -> None:
        self.value, self.headers, self.key = value, headers, None


def _tag(topic: str, value: bytes) -> str | None:
    """The order id an input (or its DLQ copy, whose value starts with the input) carries."""
    head = bytes(value[:300])
    if topic.endswith(".v3"):
        from app.bindings import kafka as kafka_binding

        try:
            head = kafka_binding.decode(_Rec(bytes(value), [])).payload_bytes()[:300]
        except Exception:
            return None
    start = head.find(b'"order_id": "')
    if start < 0:
        return None
    start += len(b'"order_id": "')
    return head[start:head.index(b'"', start)].decode()


def _body(size: int, tag: str) -> bytes:
    head = json.dumps({"order_id": tag, "pad": ""}).encode()[:-2]
    return head + b"x" * max(0, size - len(head) - 2) + b'"}'


@pytest.mark.timeout(600)
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_every_record_that_fits_reaches_v3_under_every_topic_limit(kafka, tmp_path: Path, dev_keys,
                                                                        guarantee: str) -> None:
    path, sources = _topology(tmp_path, dev_keys, guarantee)
    topo = load_topology(path)
    configs = {f"{src}.{suffix}": {"max.message.bytes": str(limit)}
               for src, limit in sources.items() for suffix in ("v2", "v3", "dlq")}
    configs |= {src: {"max.message.bytes": str(4 << 20)} for src in sources}  # inputs over every output limit
    await ensure_topics(kafka.bootstrap, topo.topics(), configs=configs)
    rng = random.Random(20261128)
    expected: dict[str, tuple[str, bytes]] = {}  # tag -> (where, value)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, max_request_size=4 << 20, linger_ms=50,
                                max_batch_size=1 << 20)
    await producer.start()
    try:
        for src, limit in sources.items():
            futs = []
            for i in range(BURST):
                fits = i % 10 != 9
                size = rng.randint(200, limit - SAFE_OVERHEAD) if fits else rng.randint(limit + 1, limit + 20_000)
                tag = f"{src}-{i}"
                value = _body(size, tag)
                expected[tag] = ("v3" if fits else "dlq", value)
                futs.append(await producer.send(src, value, key=str(i).encode()))
            await asyncio.gather(*futs)  # one burst per source
    finally:
        await producer.stop()
    env = {"PRISM_TOPOLOGY": str(path), "PRISM_BOOTSTRAP": kafka.bootstrap, "PRISM_DATA_DIR": str(tmp_path / "data"),
           "PRISM_APP_ID": f"limits-{uuid.uuid4().hex[:8]}", "PRISM_BROKER_URL": kafka.bootstrap,
           "PRISM_PROCESSING_GUARANTEE": guarantee}
    worker = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "w.log", env=env)
    topics = {f"{src}.{s}": 2 for src in sources for s in ("v3", "dlq")}
    try:
        worker.start(timeout=120)
        deadline = time.monotonic() + 300
        seen = 0
        while time.monotonic() < deadline:  # progress: every input has an output somewhere
            out = await read_all(kafka.bootstrap, topics, expected_total=len(expected), timeout=10)
            seen = len({tag for records in out.values() for r in records if (tag := _tag(r.topic, r.value))})
            if seen >= len(expected):
                break
            assert worker.running, worker.log_tail()
            await asyncio.sleep(1)
        assert worker.running, worker.log_tail()
    finally:
        worker.stop(timeout=60)
    got: dict[str, list[tuple[str, bytes, str]]] = {}
    # What a consumer reads: read_committed where the pipeline is exactly_once. Each topic to the end
    # of its partitions (`expected=0`): the worker has stopped; the count of all topics together as
    # `expected` was never reached by one topic, so every read waited out 3 s of quiet (8 topics).
    for topic, n in topics.items():
        for m in await asyncio.to_thread(independent.consume_all, kafka.bootstrap, topic, n, expected=0,
                                         timeout=60, read_committed=guarantee == "exactly_once"):
            where = "dlq" if topic.endswith(".dlq") else "v3"
            if where == "v3":
                payload = kafka_binding.decode(_Rec(m.value(), list(m.headers() or []))).payload_bytes()
                got.setdefault(_tag("payload", payload), []).append((where, payload, ""))
            else:
                reason = dict(m.headers() or []).get("prism.errors.reason", b"").decode()
                got.setdefault(_tag(topic, m.value()), []).append((where, m.value(), reason))
    missing = sorted(set(expected) - set(got))
    assert not missing, (f"{len(missing)} inputs never arrived: {missing[:5]}", worker.log_tail(6000))
    for tag, (where, value) in expected.items():
        copies = got[tag]
        if guarantee == "at_least_once" and where == "dlq":
            # at_least_once: a batch read again after a rebalance whose commit never landed
            # (seen under load: "member_id was not recognized; re-joining") writes its DLQ
            # copies again - dedup covers .v3 only. Every copy must be the same record.
            assert len({(c[0], c[1], c[2]) for c in copies}) == 1, (tag, [c[0] for c in copies])
        else:
            assert len(copies) == 1, (tag, [c[0] for c in copies])  # once each (read_committed under exactly_once)
        got_where, got_value, reason = copies[0]
        assert got_where == where, (tag, len(value), got_where, reason, worker.log_tail(4000))
        if where == "v3":
            assert got_value == value  # exactly as sent
        else:
            assert reason == "too_large", (tag, reason)
    log = worker.log_tail(200_000)
    assert "Traceback" not in log and "OutOfOrderSequence" not in log


async def test_limits_that_leave_no_room_stop_the_start_with_one_line(kafka, tmp_path: Path, dev_keys) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    src = topo.sources[0].topic
    await ensure_topics(kafka.bootstrap, topo.topics(), configs={f"{src}.v3": {"max.message.bytes": "4096"}})
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": kafka.bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": f"noroom-{uuid.uuid4().hex[:8]}",
           "PRISM_BROKER_URL": kafka.bootstrap}
    res = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "app.worker.faust_app",
                                                   "app.worker.pipeline:app_from_env"],
                                  cwd=ROOT, env={**__import__("os").environ, **env}, capture_output=True, text=True,
                                  timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error [no_room] ") and f"{src}.v3" in lines[-1] and "max.message.bytes" in lines[-1]
    assert "fix:" in lines[-1] and "Traceback" not in res.stderr
