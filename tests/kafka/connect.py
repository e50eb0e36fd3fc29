"""Apache Kafka Connect for the tests: a distributed Connect worker as a JVM subprocess on a test Kafka.

Why: Prism's management API says it has Kafka Connect's shape (``/connectors``, ``.../status``,
pause, resume, restart, Connect's error bodies).  The only way to know it does is to ask the real
Connect the same questions (tests/kafka/test_connect_parity.py).  Distributed mode, not standalone:
it is the mode whose REST API has everything (pause, resume, restart with ``includeTasks`` /
``onlyFailed``, ``?expand=``) and the one operators run.

``scripts/fetch-kafka.sh --connect`` resolves the jars from Maven Central (connect-runtime of the
broker's version and log4j2; checksums verified, cached under
``${PRISM_CACHE_DIR:-~/.cache/prism}/kafka/<version>/connect-libs``).  Connect 4.x ships no connector
and connect-file 4.4.0 is not on Maven Central, so :func:`compile_plugin` builds the one source
connector the tests use (``tests/kafka/connect_plugin/ParityTestConnector.java``, connect-api only)
with ``javac`` against those very jars.  The worker keeps its
``worker.properties``, ``log4j2.xml`` and ``connect.log`` in its own directory, listens on a free
loopback port, and is stopped like the brokers of :mod:`tests.kafka.cluster`: SIGTERM, SIGKILL after
a bound, an ``atexit`` hook, and ``setpriv --pdeathsig KILL`` so no JVM outlives the test process.

Usage::

    libs = fetch_connect()
    with ConnectWorker(libs, tmp_path, kafka.bootstrap, plugin=compile_plugin(libs, tmp_path / "plugin")) as c:
        c.put_connector("one", parity_config("some-topic"))
        status, body = c.request("GET", "/connectors/one/status")
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.kafka.cluster import (
    DEFAULT_VERSION,
    KafkaStartError,
    KafkaUnavailable,
    _free_ports,
    _poll,
    _tail,
    _terminate,
    _with_parent_death_signal,
    java_binary,
    light_jvm,
    run_fetch_script,
    spawn,
    write_log4j2_config,
)

#: The source connector the parity tests run (compiled by :func:`compile_plugin`).
PARITY_CONNECTOR = "prism.test.ParityTestConnector"
PLUGIN_SOURCE = Path(__file__).resolve().parent / "connect_plugin" / "ParityTestConnector.java"

_libs_cache: dict[str, Path] = {}
_libs_lock = threading.Lock()


def fetch_connect(version: str = DEFAULT_VERSION) -> Path:
    """The verified Connect classpath directory of Kafka ``version`` (``fetch-kafka.sh --connect``),
    fetched once per process; :class:`KafkaUnavailable` with the script's reason when it cannot be had."""
    with _libs_lock:
        if version in _libs_cache:
            return _libs_cache[version]
        if java_binary() is None:
            raise KafkaUnavailable("Kafka Connect tests need Java 17+ (apt-get install openjdk-17-jre-headless)")
        libs = run_fetch_script(["--connect", version], f"Kafka Connect {version}", f"connect-runtime-{version}.jar",
                                "connect-runtime")
        _libs_cache[version] = libs
        return libs


def javac_binary() -> str | None:
    """``$JAVA_HOME/bin/javac``, else the one on PATH (a JDK, not only a JRE)."""
    java = java_binary()
    sibling = Path(java).resolve().parent / "javac" if java else None
    return str(sibling) if sibling is not None and sibling.is_file() else shutil.which("javac")


def compile_plugin(libs: Path, directory: Path, source: Path = PLUGIN_SOURCE) -> Path:
    """Compile ``source`` (default :data:`PLUGIN_SOURCE`) against ``libs`` into ``directory``; returns the
    classes directory (a classpath entry).  :class:`KafkaUnavailable` without a JDK.  ``source`` is for
    bench/bench_peers.py, whose Connect contender is a connector of its own."""
    javac = javac_binary()
    if javac is None:
        raise KafkaUnavailable("the Kafka Connect parity tests compile a connector: they need a JDK's javac "
                               "(apt-get install openjdk-17-jdk-headless)")
    classes = directory / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([javac, "-nowarn", "-d", str(classes), "-cp", f"{libs}/*", str(source)],
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise KafkaStartError(f"javac {source.name} failed: {proc.stdout}{proc.stderr}")
    return classes


def parity_config(topic: str, **extra: str) -> dict[str, str]:
    """A :data:`PARITY_CONNECTOR` writing one record to ``topic`` with one task
    (``mode="fail-task"``: the task fails on start)."""
    return {"connector.class": PARITY_CONNECTOR, "tasks.max": "1", "topic": topic, **extra}


class ConnectWorker:
    """One distributed Kafka Connect worker (its own group and storage topics) on ``bootstrap``."""

    def __init__(self, libs: Path, directory: Path, bootstrap: str, *, plugin: Path | None = None,
                 heap: str = "256m", start_timeout: float = 90.0, stop_timeout: float = 15.0,
                 extra_jvm_args: Sequence[str] = ()) -> None:
        """``plugin``: a classpath entry with connector classes (:func:`compile_plugin`).
        ``extra_jvm_args`` come after the light test flags, so they override them (a benchmark asks
        for the JIT's top tier: ``-XX:TieredStopAtLevel=4``)."""
        self.libs, self.directory, self.bootstrap, self.plugin = libs, directory, bootstrap, plugin
        self.extra_jvm_args = tuple(extra_jvm_args)
        self.heap, self.start_timeout, self.stop_timeout = heap, start_timeout, stop_timeout
        self.group = f"connect-{uuid.uuid4().hex[:8]}"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ConnectWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.directory / "connect.log"

    def _properties(self) -> dict[str, str]:
        """Connect's distributed worker settings, sized for one test worker on a one-node Kafka."""
        g = self.group
        return {
            "bootstrap.servers": self.bootstrap, "group.id": g,
            "config.storage.topic": f"{g}-configs", "offset.storage.topic": f"{g}-offsets",
            "status.storage.topic": f"{g}-status",
            "config.storage.replication.factor": "1", "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1", "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "listeners": f"http://127.0.0.1:{self.port}", "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": str(self.port),
            # one worker: no reason to wait for a departed one before reassigning its work
            "scheduled.rebalance.max.delay.ms": "0", "offset.flush.interval.ms": "1000",
            # the test plugin is on the classpath without a ServiceLoader manifest: scan for it
            "plugin.discovery": "only_scan",
        }

    def start(self) -> ConnectWorker:
        """Write the configuration, start the JVM, return once ``GET /connectors`` answers 200
        (the REST server answers earlier, but only a worker that joined its group can list)."""
        java = java_binary()
        if java is None:
            raise KafkaUnavailable("Kafka Connect tests need Java 17+")
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        (self.port,) = _free_ports(1)
        props = self.directory / "worker.properties"
        props.write_text("".join(f"{k}={v}\n" for k, v in self._properties().items()), encoding="utf-8")
        cmd = _with_parent_death_signal([
            *light_jvm(java, self.heap), write_log4j2_config(self.directory / "log4j2.xml", self.log_file),
            f"-Dkafka.logs.dir={self.directory}", *self.extra_jvm_args, "-cp",
            f"{self.libs}/*" + (f":{self.plugin}" if self.plugin is not None else ""),
            "org.apache.kafka.connect.cli.ConnectDistributed", str(props)])
        self.process = spawn(cmd, self.directory / "console.log", self.directory)
        try:
            _poll("Kafka Connect answers GET /connectors", self._listed, self.start_timeout, interval=0.5)
        except (TimeoutError, KafkaStartError) as exc:
            self.stop()
            raise KafkaStartError(f"Kafka Connect did not start: {exc}\n{_tail(self.log_file)}\n"
                                  f"{_tail(self.directory / 'console.log')}") from exc
        return self

    def _listed(self) -> bool | None:
        if self.process is not None and self.process.poll() is not None:
            raise KafkaStartError(f"the Connect JVM exited with {self.process.returncode}")
        status, _ = self.request("GET", "/connectors", timeout=5)
        return True if status == 200 else None

    def stop(self) -> None:
        """SIGTERM, SIGKILL after ``stop_timeout``; idempotent."""
        if self.process is not None:
            _terminate([self.process], self.stop_timeout)
            self.process = None

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> tuple[int, Any]:
        """(status, JSON body or None) of one REST call; HTTP errors are answers, not exceptions."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw, status = resp.read(), resp.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        return status, (json.loads(raw) if raw.strip() else None)

    def put_connector(self, name: str, config: dict[str, str], *, timeout: float = 60.0) -> dict[str, Any]:
        """Create (or reconfigure) ``name`` and wait until it and all its tasks are RUNNING;
        returns that status."""
        status, body = self.request("PUT", f"/connectors/{name}/config", config)
        if status not in (200, 201):
            raise AssertionError(f"PUT /connectors/{name}/config: {status} {body}")
        return self.wait_state(name, "RUNNING", timeout=timeout)

    def wait_state(self, name: str, state: str, *, tasks: int = 1, timeout: float = 60.0) -> dict[str, Any]:
        """Poll ``GET /connectors/{name}/status`` until the connector and ``tasks`` tasks are ``state``."""
        def reached() -> dict[str, Any] | None:
            status, body = self.request("GET", f"/connectors/{name}/status", timeout=5)
            if status != 200 or body["connector"]["state"] != state:
                return None
            return body if len(body["tasks"]) == tasks and all(t["state"] == state for t in body["tasks"]) else None

        deadline = time.monotonic() + timeout
        try:
            return _poll(f"connector {name} {state}", reached, max(0.0, deadline - time.monotonic()))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}: {self.request('GET', f'/connectors/{name}/status')}\n"
                                 f"{_tail(self.log_file)}") from exc
