"""Messages of every size around the write limits through a running worker (subprocess).

The bug this guards: a message whose outputs exceeded the producer's `max_request_size` was
retried, its DLQ copy (just as large) was retried forever, the batch never finished, offsets
stopped on every partition, `/readyz` stayed 200 and SIGTERM did not end the worker. Now each
record's size is checked before it is sent (app/worker/limits.py): an input over the input
limit is dead-lettered as `too_large`, its DLQ copy cut down to the DLQ topic's limit.

Every oversized message is followed by a good one, which must come out on `.v3`; offsets must
keep advancing (the committed offsets reach the end), `/readyz` must stay 200, the worker's
RSS must stay bounded, and SIGTERM must end it promptly.

It runs on the embedded broker and on Apache Kafka (`any_broker`). On Kafka the limits come
from the broker (the output and DLQ topics keep Kafka's default `max.message.bytes`, ~1 MiB);
the source topic is made to accept 64 MiB, so that the oversized inputs can be produced at all.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from app.agents.dlq import VALUE_LENGTH, VALUE_SHA256, VALUE_TRUNCATED, error_context
from app.broker.admin import ensure_topics
from app.demo.runner import read_all
from app.worker.faust_app import WorkerProcess
from tests.brokers import BrokerUnderTest
from tests.support import committed_offsets
from tests.worker.conftest import make_topology

MIB = 1024 * 1024
#: the worker's producer limit in this test: small, so the sizes around it are quick to move
MAX_REQUEST = 1 * MIB
#: RSS the worker may grow by over the whole run (it starts at ~220 MB; a 50 MB input is read
#: once by the consumer and once by the worker, and must not be held after it was dead-lettered)
RSS_GROWTH_LIMIT_MB = 400


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _body(total: int, tag: str) -> bytes:
    """A JSON order of exactly `total` bytes (a raw input: no key, no headers)."""
    head = f'{{"order_id": "{tag}", "pad": "'.encode()
    tail = b'"}'
    assert total >= len(head) + len(tail)
    return head + b"x" * (total - len(head) - len(tail)) + tail



async def test_every_size_around_the_limits(any_broker: BrokerUnderTest, tmp_path: Path, dev_keys: Any) -> None:
    bootstrap = any_broker.bootstrap
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    source = topo.sources[0].topic
    await ensure_topics(bootstrap, topo.topics(), configs={source: {"max.message.bytes": str(64 * MIB)}})
    port = _free_port()
    group = f"size-{uuid.uuid4().hex[:8]}"
    env = {"PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": bootstrap,
           "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": group, **any_broker.worker_env(),
           "PRISM_WEB_PORT": str(port), "PRISM_MAX_REQUEST_BYTES": str(MAX_REQUEST)}
    worker = WorkerProcess("app.worker.pipeline:app_from_env", log_path=tmp_path / "w.log", env=env)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=64 * MIB, linger_ms=0)
    # (tag, input size, expected: "v3" or "dlq")
    worker.start(timeout=90)
    # the input limit the worker derived (its measured overhead under this producer limit), as it logs it
    deadline = time.monotonic() + 60
    while not (found := re.search(r"input limit (\d+) bytes", worker.log_tail(20_000))):
        assert time.monotonic() < deadline and worker.running, worker.log_tail()
        await asyncio.sleep(0.2)
    input_limit = int(found.group(1))
    assert MAX_REQUEST - 64 * 1024 < input_limit < MAX_REQUEST - 1024  # a few KiB of overhead, measured
    sizes = [("under-input", input_limit - 1, "v3"), ("at-input", input_limit, "v3"),
             ("over-input", input_limit + 1, "dlq"), ("at-request", MAX_REQUEST, "dlq"),
             ("4mb", 4 * MIB, "dlq"), ("16mb", 16 * MIB, "dlq"), ("50mb", 50 * MIB, "dlq")]
    await producer.start()
    rss: list[tuple[str, float]] = [("start", _rss_mb(worker.pid or 0))]
    try:
        for tag, size, _ in sizes:
            await (await producer.send(source, _body(size, tag)))
            await (await producer.send(source, _body(200, f"good-after-{tag}")))
        expected = {tag: where for tag, _, where in sizes} | {f"good-after-{tag}": "v3" for tag, _, _ in sizes}
        deadline = time.monotonic() + 180
        got: dict[str, str] = {}
        dlq_records: dict[str, Any] = {}
        while time.monotonic() < deadline:
            out = await read_all(bootstrap, {source + ".v3": 2, source + ".dlq": 2}, expected_total=len(expected),
                                 timeout=10)
            got, dlq_records = {}, {}
            for r in out[source + ".v3"]:
                tag = next((t for t in expected if f'"order_id": "{t}"'.encode() in r.value), None)
                if tag is not None:
                    got[tag] = "v3"
            for r in out[source + ".dlq"]:
                ctx = error_context(list(r.headers))
                head = r.value[:64]
                tag = next((t for t in expected if f'"order_id": "{t}"'.encode() in head), None)
                if tag is not None:
                    got[tag], dlq_records[tag] = "dlq", (r, ctx)
            rss.append(("read", _rss_mb(worker.pid or 0)))
            if got == expected:
                break
            assert worker.running, worker.log_tail()
            await asyncio.sleep(1)
        assert got == expected, (got, worker.diagnose())
        for tag, (r, ctx) in dlq_records.items():
            assert ctx["reason"] == "too_large", (tag, ctx)
            size = next(s for t, s, _ in sizes if t == tag)
            hdrs = dict(r.headers)
            # the DLQ copy keeps what fits: reason and context always, the value cut and described
            if len(r.value) == size:  # fits the DLQ whole (just over the input limit)
                assert VALUE_TRUNCATED not in hdrs and size < MAX_REQUEST, tag
            else:
                assert int(hdrs[VALUE_LENGTH]) == size and hdrs[VALUE_TRUNCATED] == b"true", tag
                assert len(hdrs[VALUE_SHA256]) == 64 and MAX_REQUEST - 4096 < len(r.value) < MAX_REQUEST, tag
        # offsets advance past every message: the committed offsets reach the end of the log
        total = 2 * len(sizes)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            committed = await committed_offsets(bootstrap, group, source, 2)
            if sum(committed.values()) == total:
                break
            await asyncio.sleep(0.5)
        assert sum(committed.values()) == total, committed
        status, body = _readyz(port)
        assert status == 200, body
        assert "write limits: producer max_request_size=1048576" in worker.log_tail(200_000)
        peak = max(v for _, v in rss)
        assert peak - rss[0][1] < RSS_GROWTH_LIMIT_MB, rss
        t0 = time.monotonic()
        code = worker.stop(timeout=60)
        assert code == 0 and time.monotonic() - t0 < 30, (code, worker.log_tail())
        print("rss MB:", [(k, round(v)) for k, v in rss[:1] + rss[-1:]], "peak", round(peak))
    finally:
        await producer.stop()
        worker.stop()
