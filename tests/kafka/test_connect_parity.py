"""Prism's management API next to Apache Kafka Connect's REST API, on the same Apache Kafka.

Why: Prism says its management API has Kafka Connect's shape, so that operators and tools that
speak Connect's REST read it unchanged.  A claim like that drifts unless it is checked against the
real thing: a distributed Connect worker (connect-runtime of the broker's version,
tests/kafka/connect.py) and a Prism worker run side by side on one Kafka, every route both have is
called on both, and the status codes, key sets and value types, and error bodies are compared.
Where Prism differs on purpose (authentication, the ``pipeline`` type, its extra keys, a failure
reported on the connector rather than a task) the difference is asserted exactly, so that a new one
fails here; docs/operations.md, "Prism vs Kafka Connect REST", lists them all with the reasons.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from app.broker.admin import ensure_topics
from app.broker.embedded import find_free_port
from app.security.devkeys import DevKeys, ensure_dev_keys
from app.worker.faust_app import InProcessWorker
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from app.worker.pipeline import PipelineApp
from tests.kafka.cluster import ApacheKafka, KafkaUnavailable
from tests.kafka.connect import ConnectWorker, compile_plugin, fetch_connect, parity_config
from tests.support import auth_headers, require, write_users_file
from tests.worker.conftest import make_topology

#: Connect's connector and task states (ConnectorStatus / TaskStatus, AbstractStatus.State).
STATES = {"UNASSIGNED", "RUNNING", "PAUSED", "FAILED", "RESTARTING", "STOPPED"}

#: Keys Prism adds to Connect's answers (flattened paths, ``[]`` = every list element). Deliberate:
#: a Connect client ignores keys it does not know, and these are what `prism status` shows.
PRISM_EXTRA_STATUS = {"lag", "batches", "in_flight_batches", "tables", "readiness", "tasks[].topic",
                      "tasks[].partition", "tasks[].committed", "tasks[].highwater", "tasks[].lag",
                      "tasks[].paused"}
#: Further Prism-only status keys a worker includes when it has them (the consumer group's lag, the
#: .v2 sunset's phase): extra too, not required.
PRISM_OPTIONAL_STATUS = {"group_lag", "migration"}
PRISM_EXTRA_INFO = {"namespace", "stages", "sources", "outputs", "dlq", "dlq_overflow", "sinks"}
#: Objects whose keys are names (config entries, table names), not part of the shape.
MAPS = {"config", "tables"}


def flat(value: Any, prefix: str = "") -> dict[str, set[str]]:
    """Path -> JSON types seen there (``a.b``, ``a[]`` for list elements); the entries of a name-keyed
    object (:data:`MAPS`) are not paths: which config keys exist is the connector's business."""
    out: dict[str, set[str]] = {}

    def walk(v: Any, path: str) -> None:
        kind = ("null" if v is None else "bool" if isinstance(v, bool) else "number" if isinstance(v, int | float)
                else "string" if isinstance(v, str) else "array" if isinstance(v, list) else "object")
        if path:
            out.setdefault(path, set()).add(kind)
        if isinstance(v, dict) and path not in MAPS:
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else k)
        elif isinstance(v, list):
            for x in v:
                walk(x, f"{path}[]")

    walk(value, prefix)
    return out


def compare(connect: Any, prism: Any, *, ignore: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
    """Assert every path of Connect's answer is in Prism's with a type Connect uses there (null
    matches anything: Connect answers null for a value it does not know yet); return the roots of
    Prism's extra paths (``lag``, not also everything under it)."""
    c, p = flat(connect), flat(prism)
    for path, kinds in c.items():
        if path in ignore:
            continue
        assert path in p, f"{path} is in Connect's answer, not in Prism's: {connect!r} vs {prism!r}"
        assert "null" in kinds or p[path] - {"null"} <= kinds, f"{path}: Connect {kinds}, Prism {p[path]}"
    extra = {path for path in p if path not in c}
    return {path for path in extra if _parent(path) not in extra}


def _parent(path: str) -> str:
    return path[:-2] if path.endswith("[]") else path.rsplit(".", 1)[0] if "." in path else ""


def status_extras_are_prisms(extras: set[str], also: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """The status keys Prism adds are exactly the deliberate ones (and ``also``)."""
    required = PRISM_EXTRA_STATUS | also
    assert required <= extras <= required | PRISM_OPTIONAL_STATUS, sorted(extras ^ required)


def states_are_connects(status: dict[str, Any]) -> None:
    assert status["connector"]["state"] in STATES and all(t["state"] in STATES for t in status["tasks"])


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


@pytest.fixture(scope="module")
def connect(kafka: ApacheKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    """A distributed Connect worker with ``parity`` (running) and ``parity-failed`` (its task FAILED)."""
    try:
        libs = fetch_connect()
        plugin = compile_plugin(libs, tmp_path_factory.mktemp("connect-plugin"))
    except KafkaUnavailable as exc:
        require(False, str(exc))
        raise
    worker = ConnectWorker(libs, tmp_path_factory.mktemp("connect"), kafka.bootstrap, plugin=plugin)
    with worker:
        # the test broker creates no topic on first use: without it the task's one send blocks,
        # and a task blocked in a send cannot pause
        topic = kafka.create_topic(f"parity-{uuid.uuid4().hex[:8]}")
        worker.put_connector("parity", parity_config(topic))
        worker.request("PUT", "/connectors/parity-failed/config", parity_config(topic, mode="fail-task"))
        _wait_task_failed(worker, "parity-failed")
        yield worker


def _wait_task_failed(worker: ConnectWorker, name: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status, body = worker.request("GET", f"/connectors/{name}/status")
        if status == 200 and body["tasks"] and body["tasks"][0]["state"] == "FAILED":
            return body  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, (status, body)
        time.sleep(0.3)


class PrismWorker:
    """A Prism worker on the same Kafka with its management API (admin/reader credentials)."""

    def __init__(self, url: str, name: str, observer: Observer, http: aiohttp.ClientSession) -> None:
        self.url, self.name, self.observer, self.http = url, name, observer, http

    async def request(self, method: str, path: str, user: str | None = "admin") -> tuple[int, Any]:
        headers = auth_headers(user) if user else {}
        async with self.http.request(method, self.url + path, headers=headers) as r:
            raw = await r.read()
            return r.status, (json.loads(raw) if raw.strip() else None)


@asynccontextmanager
async def prism_worker(kafka: ApacheKafka, tmp_path: Path, keys: DevKeys) -> AsyncIterator[PrismWorker]:
    topo = make_topology(tmp_path, keys, partitions=1)
    users = write_users_file(tmp_path / "users.yaml")
    observer = Observer(management=ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(users)}))
    port = find_free_port()
    pipeline = PipelineApp(topo, bootstrap=kafka.bootstrap, data_dir=tmp_path / "data", embedded=False,
                           app_id=f"parity-{uuid.uuid4().hex[:8]}", web_port=port, observe=observer)
    await ensure_topics(kafka.bootstrap, topo.topics())
    worker = InProcessWorker(pipeline.app)
    await worker.start()
    try:
        async with aiohttp.ClientSession() as http:
            prism = PrismWorker(f"http://127.0.0.1:{port}", topo.name, observer, http)
            deadline = time.monotonic() + 60
            while True:  # running, with its one source partition assigned
                status, body = await prism.request("GET", f"/connectors/{topo.name}/status")
                if status == 200 and body["connector"]["state"] == "RUNNING" and len(body["tasks"]) == 1:
                    break
                assert time.monotonic() < deadline, (status, body)
                await asyncio.sleep(0.2)
            yield prism
    finally:
        await worker.stop()


async def test_prism_answers_like_kafka_connect(connect: ConnectWorker, kafka: ApacheKafka, tmp_path: Path,
                                                keys: DevKeys) -> None:
    async with prism_worker(kafka, tmp_path, keys) as prism:
        name = prism.name

        async def both(method: str, path: str, connect_name: str = "parity") -> tuple[Any, Any]:
            """Call the route on both; the status codes must be equal; returns (Connect's, Prism's) body."""
            cs, cb = await asyncio.to_thread(connect.request, method, path.format(name=connect_name))
            ps, pb = await prism.request(method, path.format(name=name))
            assert cs == ps, f"{method} {path}: Connect {cs} {cb!r}, Prism {ps} {pb!r}"
            return cb, pb

        # GET /connectors and ?expand=
        cb, pb = await both("GET", "/connectors")
        assert "parity" in cb and pb == [name]
        cb, pb = await both("GET", "/connectors?expand=status&expand=info")
        assert set(cb["parity"]) == set(pb[name]) == {"status", "info"}
        status_extras_are_prisms(compare(cb["parity"]["status"], pb[name]["status"]))
        assert compare(cb["parity"]["info"], pb[name]["info"]) == PRISM_EXTRA_INFO
        for expand, keys_ in (("status", {"status"}), ("info", {"info"}), ("bogus", set())):
            cb, pb = await both("GET", f"/connectors?expand={expand}")
            assert set(cb["parity"]) == set(pb[name]) == keys_, expand

        # GET /connectors/{name}: Connect's four keys; "type" is Prism's own value on purpose
        cb, pb = await both("GET", "/connectors/{name}")
        assert compare(cb, pb) == PRISM_EXTRA_INFO
        assert cb["type"] == "source" and pb["type"] == "pipeline"
        assert pb["tasks"] == [{"connector": name, "task": 0}] and pb["config"]["name"] == name

        # GET /connectors/{name}/config: a flat map of strings
        cb, pb = await both("GET", "/connectors/{name}/config")
        assert all(isinstance(v, str) for v in [*cb.values(), *pb.values()]) and cb["name"] == "parity"
        assert pb["name"] == name and set(json.loads(pb["sources"])[0]) >= {"topic", "partitions"}

        # GET /connectors/{name}/topics: {name: {"topics": [...]}}
        cb, pb = await both("GET", "/connectors/{name}/topics")
        assert set(cb) == {"parity"} and set(cb["parity"]) == {"topics"} and isinstance(cb["parity"]["topics"], list)
        assert set(pb) == {name} and set(pb[name]) == {"topics"}
        source = json.loads((await prism.request("GET", f"/connectors/{name}/config"))[1]["sources"])[0]["topic"]
        assert {source, f"{source}.v3", f"{source}.dlq"} <= set(pb[name]["topics"])

        # GET /connectors/{name}/status
        cb, pb = await both("GET", "/connectors/{name}/status")
        status_extras_are_prisms(compare(cb, pb))
        states_are_connects(pb)
        assert cb["type"] == "source" and pb["type"] == "pipeline"
        assert pb["connector"]["worker_id"] == prism.url.removeprefix("http://")  # host:port, as Connect

        # unknown connector: the same 404 and the same error body, route by route
        for method, path in (("GET", "/connectors/{name}"), ("GET", "/connectors/{name}/status"),
                             ("GET", "/connectors/{name}/config"), ("PUT", "/connectors/{name}/pause"),
                             ("PUT", "/connectors/{name}/resume"), ("POST", "/connectors/{name}/restart")):
            cb, pb = await both(method, path.replace("{name}", "no-such-connector"))
            assert cb == pb and set(pb) == {"error_code", "message"} and pb["error_code"] == 404, (path, cb, pb)
        # ... except /topics: Connect answers 200 with no topics for any name, Prism 404
        cs, cb = await asyncio.to_thread(connect.request, "GET", "/connectors/no-such-connector/topics")
        ps, pb = await prism.request("GET", "/connectors/no-such-connector/topics")
        assert (cs, cb) == (200, {"no-such-connector": {"topics": []}})
        assert (ps, pb) == (404, {"error_code": 404, "message": "Connector no-such-connector not found"})

        # a route that does not exist, a method a route does not have: Connect's 404/405 bodies
        for method, path in (("GET", "/no/such/route"), ("DELETE", "/connectors/{name}/status"),
                             ("POST", "/connectors/{name}/pause"), ("GET", "/connectors/{name}/pause"),
                             ("GET", "/connectors/{name}/restart")):
            cb, pb = await both(method, path)
            assert cb == pb and pb["message"].startswith(f"HTTP {pb['error_code']} "), (method, path, cb, pb)

        # pause / resume: 202 without a body
        for action, state in (("pause", "PAUSED"), ("resume", "RUNNING")):
            cb, pb = await both("PUT", f"/connectors/{{name}}/{action}")
            assert cb is None and pb is None, (action, cb, pb)
            connect.wait_state("parity", state)
            assert (await prism.request("GET", f"/connectors/{name}/status"))[1]["connector"]["state"] == state
            cb, pb = await both("PUT", f"/connectors/{{name}}/{action}")  # again: the same answer
            assert cb is None and pb is None

        # restart: 204 plain (and for a value that is not "true"), 202 + status with includeTasks/onlyFailed
        for query in ("", "?includeTasks=false", "?includeTasks=yes"):
            cb, pb = await both("POST", f"/connectors/{{name}}/restart{query}")
            assert cb is None and pb is None, query
        for query in ("?includeTasks=true", "?onlyFailed=true", "?includeTasks=true&onlyFailed=true"):
            connect.wait_state("parity", "RUNNING")
            cb, pb = await both("POST", f"/connectors/{{name}}/restart{query}")
            status_extras_are_prisms(compare(cb, pb))
            states_are_connects(pb)
            # Connect answers before it restarts ("RESTARTING"); Prism's restart is done when it answers
            want = "RESTARTING" if "includeTasks" in query and "onlyFailed" not in query else "RUNNING"
            # Connect's own task state can lag its restart of the previous round by a moment (seen
            # once in a full run: RESTARTING where RUNNING was expected); Prism's must not
            assert cb["tasks"][0]["state"] in {want, "RESTARTING"} and pb["connector"]["state"] == "RUNNING", (
                query, cb, pb)
        connect.wait_state("parity", "RUNNING")

        # a failed connector, restarted with onlyFailed: Connect fails per task, Prism per worker, so
        # Connect's "trace" is on the task and Prism's on the connector
        prism.observer.health.mark_failed("parity test: failed on purpose")
        cb, pb = await both("GET", "/connectors/{name}/status", "parity-failed")
        assert pb["connector"]["state"] == "FAILED" and cb["tasks"][0]["state"] == "FAILED"
        status_extras_are_prisms(compare(cb, pb, ignore={"tasks[].trace"}), {"connector.trace"})
        assert isinstance(cb["tasks"][0]["trace"], str) and "failed on purpose" in pb["connector"]["trace"]
        cb, pb = await both("POST", "/connectors/{name}/restart?onlyFailed=true&includeTasks=true", "parity-failed")
        assert cb["tasks"][0]["state"] == "RESTARTING" and pb["connector"]["state"] == "RUNNING", (cb, pb)
        assert "trace" not in pb["connector"]

        # Prism asks for credentials where Connect (without a REST extension) asks none
        cs, _ = await asyncio.to_thread(connect.request, "PUT", "/connectors/parity/pause")
        ps, pb = await prism.request("PUT", f"/connectors/{name}/pause", user=None)
        assert cs == 202 and ps == 401 and set(pb) == {"error_code", "message"} and pb["error_code"] == 401
        ps, pb = await prism.request("PUT", f"/connectors/{name}/pause", user="reader")
        assert ps == 403 and pb["error_code"] == 403
        assert (await asyncio.to_thread(connect.request, "PUT", "/connectors/parity/resume"))[0] == 202
