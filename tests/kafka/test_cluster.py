"""The Apache Kafka test helper against real brokers: clients, security, ACLs, failover, versions.

Why these tests: every other test that relies on ``tests/kafka`` trusts that the helper really
starts Kafka with the security it claims (a SASL listener that accepts any password, or a TLS
listener that does not require a client certificate, would make those tests meaningless) and
that a 3-node cluster really survives losing a leader.  Brokers are shared within this file
where a test does not change them (session broker, one secure broker, one 3-node cluster).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from tests.kafka.cluster import (
    FETCH_SCRIPT,
    LEGACY_VERSION,
    ApacheKafka,
    CertificateAuthority,
    ClientConfig,
    KafkaStartError,
    aiokafka_kwargs,
    kcat_args,
    prism_env,
)
from tests.kafka.fixtures import KafkaFactory, require_kafka_libs
from tests.support import require

pytestmark = pytest.mark.integration


def fresh(prefix: str) -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def produce(cfg: ClientConfig, topic: str, values: Sequence[bytes], **kwargs: object) -> None:
    """Send ``values`` to partition 0 of ``topic`` and wait for every acknowledgement."""
    producer = AIOKafkaProducer(**aiokafka_kwargs(cfg), request_timeout_ms=15000, **kwargs)  # type: ignore[arg-type]
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def consume(cfg: ClientConfig, topic: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """The first ``count`` values of partition 0 of ``topic`` (assigned, no consumer group)."""
    consumer = AIOKafkaConsumer(**aiokafka_kwargs(cfg), enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        async with asyncio.timeout(timeout):
            while len(values) < count:
                msg = await consumer.getone()
                assert msg.value is not None
                values.append(msg.value)
        return values
    finally:
        await consumer.stop()


def log_contains(cluster: ApacheKafka, text: str, timeout: float = 10.0) -> bool:
    """True once any node's broker log contains ``text`` (polled: a broker logs a failed
    authentication only when it closes the connection, after ``connection.failed.authentication.delay.ms``)."""
    deadline = time.monotonic() + timeout
    while True:
        if any(text in n.log_file.read_text(encoding="utf-8", errors="replace") for n in cluster.nodes.values()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


# --------------------------------------------------------------------------- the session broker (PLAINTEXT)


async def test_plaintext_roundtrip_with_a_consumer_group(kafka: ApacheKafka, kafka_topic: str,
                                                         record_property: pytest.RecordProperty) -> None:
    record_property("kafka_startup_seconds_1_node", kafka.startup_seconds)
    assert kafka.version and kafka.bootstrap.startswith("127.0.0.1:")
    assert kafka.client_config() == {"bootstrap_servers": kafka.bootstrap, "security_protocol": "PLAINTEXT"}
    values = [f"m{i}".encode() for i in range(20)]
    await produce(kafka.client_config(), kafka_topic, values, acks="all")

    consumer = AIOKafkaConsumer(kafka_topic, **aiokafka_kwargs(kafka.client_config()), group_id=fresh("g"),
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        got: list[bytes] = []
        async with asyncio.timeout(30):
            while len(got) < len(values):
                batch = await consumer.getmany(timeout_ms=1000)
                got += [m.value for msgs in batch.values() for m in msgs if m.value is not None]
        await consumer.commit()
        committed = await consumer.committed(TopicPartition(kafka_topic, 0))
    finally:
        await consumer.stop()
    assert got == values
    assert committed == len(values)
    assert kafka.nodes[1].log_file.is_file() and kafka.nodes[1].log_file.parent == kafka.nodes[1].data_dir.parent


async def test_kcat_is_an_independent_client_of_the_same_broker(kafka: ApacheKafka, kafka_topic: str) -> None:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    require(kcat is not None, "kcat is not installed (apt-get install kcat)")
    assert kcat is not None
    base = [kcat, *kcat_args(kafka.client_config())]
    subprocess.run([*base, "-P", "-t", kafka_topic, "-p", "0"], input=b"from-kcat-1\nfrom-kcat-2\n",
                   check=True, timeout=30)
    await produce(kafka.client_config(), kafka_topic, [b"from-aiokafka"])
    assert await consume(kafka.client_config(), kafka_topic, 3) == [b"from-kcat-1", b"from-kcat-2", b"from-aiokafka"]
    out = subprocess.run([*base, "-C", "-t", kafka_topic, "-o", "beginning", "-c", "3", "-e", "-q"],
                         capture_output=True, check=True, timeout=30)
    assert out.stdout.splitlines() == [b"from-kcat-1", b"from-kcat-2", b"from-aiokafka"]


def test_a_broker_that_fails_to_start_reports_its_log_and_leaves_no_process(kafka_factory: KafkaFactory) -> None:
    # authorizer.class.name is a plain string to the storage tool (formatting passes); the broker
    # itself fails to load the class at start-up.
    with pytest.raises(KafkaStartError) as failure:
        kafka_factory(broker_config={"authorizer.class.name": "com.example.NoSuchAuthorizer"})
    message = str(failure.value)
    assert "com.example.NoSuchAuthorizer" in message
    assert "server.log (last" in message
    assert "did not start" in message


def test_stop_leaves_no_process_behind(kafka_factory: KafkaFactory) -> None:
    cluster = kafka_factory()
    node = cluster.nodes[1]
    pid = node.pid
    assert pid is not None and Path(f"/proc/{pid}").exists()
    cluster.stop()
    assert not node.running and not Path(f"/proc/{pid}").exists()
    assert "shut down completely" in node.log_file.read_text(encoding="utf-8")  # SIGTERM: a clean shutdown


# --------------------------------------------------------------------------- SASL_SSL + SCRAM, mutual TLS, ACLs


async def test_scram_sha_512_right_password_works(kafka_secure: ApacheKafka) -> None:
    topic = kafka_secure.create_topic(fresh("scram"))
    cfg = kafka_secure.client_config("SASL_SSL", user="alice")
    assert cfg["security_protocol"] == "SASL_SSL" and cfg["sasl_mechanism"] == "SCRAM-SHA-512"
    assert prism_env(cfg)["PRISM_SASL_USERNAME"] == "alice"
    kafka_secure.add_acl("alice", "WRITE", topic=topic)
    kafka_secure.add_acl("alice", "READ", topic=topic)
    await produce(cfg, topic, [b"as-alice"], acks="all")
    assert await consume(cfg, topic, 1) == [b"as-alice"]


async def test_scram_sha_512_wrong_password_fails_authentication(kafka_secure: ApacheKafka,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    cfg = kafka_secure.client_config("SASL_SSL", user="alice", password="not-alices-password")
    producer = AIOKafkaProducer(**aiokafka_kwargs(cfg), request_timeout_ms=5000)
    # aiokafka reports a failed bootstrap and logs why: the broker's SaslAuthenticationFailed.
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    assert "SaslAuthenticationFailed" in caplog.text
    assert log_contains(kafka_secure, "invalid credentials with SASL mechanism SCRAM-SHA-512")


async def test_scram_user_added_at_run_time(kafka_secure: ApacheKafka) -> None:
    kafka_secure.add_scram_user("dave", "dave-secret-1")
    topic = kafka_secure.create_topic(fresh("dave"))
    kafka_secure.add_acl("dave", "ALL", topic=topic)
    cfg = kafka_secure.client_config("SASL_SSL", user="dave")
    await produce(cfg, topic, [b"as-dave"])
    assert await consume(cfg, topic, 1) == [b"as-dave"]


async def test_mutual_tls_with_a_certificate_from_the_ca_works(kafka_secure: ApacheKafka) -> None:
    topic = kafka_secure.create_topic(fresh("mtls"))
    cfg = kafka_secure.client_config("SSL", user="carol")
    assert {"ssl_cafile", "ssl_certfile", "ssl_keyfile"} <= cfg.keys()
    kafka_secure.add_acl("carol", "ALL", topic=topic)  # the principal is the certificate's CN
    await produce(cfg, topic, [b"as-carol"])
    assert await consume(cfg, topic, 1) == [b"as-carol"]
    assert prism_env(cfg)["PRISM_SSL_CERTFILE"] == cfg["ssl_certfile"]  # a worker can use mutual TLS


@pytest.mark.parametrize("cert", ["untrusted", "none"])
async def test_mutual_tls_without_a_trusted_client_certificate_fails(kafka_secure: ApacheKafka, tmp_path: Path,
                                                                      cert: str) -> None:
    cfg = kafka_secure.client_config("SSL", user="carol")
    if cert == "untrusted":  # same CN, but signed by a CA the broker does not trust
        other = CertificateAuthority(tmp_path / "other-ca", name="Someone Else's CA").issue("carol")
        cfg.update(ssl_certfile=str(other.cert), ssl_keyfile=str(other.key))
    else:
        del cfg["ssl_certfile"], cfg["ssl_keyfile"]
    producer = AIOKafkaProducer(**aiokafka_kwargs(cfg), request_timeout_ms=5000)
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    assert log_contains(kafka_secure, "(SSL handshake failed)")


async def test_acls_deny_read_until_granted(kafka_secure: ApacheKafka) -> None:
    topic = kafka_secure.create_topic(fresh("acl"))
    await produce(kafka_secure.admin_config(), topic, [b"secret"])  # admin: super user
    bob = kafka_secure.client_config("SASL_SSL", user="bob")
    kafka_secure.add_acl("bob", "DESCRIBE", topic=topic)  # may see the topic, not read it
    with pytest.raises(TopicAuthorizationFailedError):
        await consume(bob, topic, 1, timeout=20)
    with pytest.raises(TopicAuthorizationFailedError):
        await produce(bob, topic, [b"not allowed"])
    kafka_secure.add_acl("bob", "READ", topic=topic)
    assert await consume(bob, topic, 1) == [b"secret"]


# --------------------------------------------------------------------------- three nodes


async def test_three_nodes_survive_kill_9_of_a_leader(kafka_cluster: ApacheKafka,
                                                      record_property: pytest.RecordProperty) -> None:
    record_property("kafka_startup_seconds_3_nodes", kafka_cluster.startup_seconds)
    meta = kafka_cluster.metadata()
    assert sorted(meta.brokers) == [1, 2, 3]
    topic = kafka_cluster.create_topic(fresh("failover"))
    part = kafka_cluster.metadata(topic).topics[topic].partitions[0]
    assert sorted(part.replicas) == [1, 2, 3]  # default.replication.factor=3
    cfg = kafka_cluster.client_config()
    await produce(cfg, topic, [b"before"], acks="all")

    old = kafka_cluster.leader(topic)
    kafka_cluster.kill(old)
    try:
        new = kafka_cluster.wait_leader(topic, not_on=old)
        assert new != old
        # acks=all with min.insync.replicas=2: two replicas left are enough.
        await produce(kafka_cluster.client_config(), topic, [b"after"], acks="all")
        assert await consume(kafka_cluster.client_config(), topic, 2) == [b"before", b"after"]
    finally:
        kafka_cluster.start_node(old)
    kafka_cluster.wait_in_sync()
    assert sorted(kafka_cluster.metadata().brokers) == [1, 2, 3]
    assert kafka_cluster.nodes[old].starts == 2


async def test_three_nodes_rolling_restart_keeps_the_data(kafka_cluster: ApacheKafka) -> None:
    topic = kafka_cluster.create_topic(fresh("rolling"))
    await produce(kafka_cluster.client_config(), topic, [b"one"], acks="all")
    pids = {n.node_id: n.pid for n in kafka_cluster.nodes.values()}
    kafka_cluster.rolling_restart()
    assert all(n.pid not in (None, pids[n.node_id]) for n in kafka_cluster.nodes.values())
    await produce(kafka_cluster.client_config(), topic, [b"two"], acks="all")
    assert await consume(kafka_cluster.client_config(), topic, 2) == [b"one", b"two"]


# --------------------------------------------------------------------------- versions and the fetch script


async def test_kafka_3_9_smoke(kafka_factory: KafkaFactory) -> None:
    libs = require_kafka_libs(LEGACY_VERSION)
    cluster = kafka_factory(libs=libs)
    assert cluster.version == LEGACY_VERSION
    assert log_contains(cluster, f"Kafka version: {LEGACY_VERSION}")
    topic = cluster.create_topic(fresh("legacy"))
    await produce(cluster.client_config(), topic, [b"on-3.9"], acks="all")
    assert await consume(cluster.client_config(), topic, 1) == [b"on-3.9"]


def test_fetch_script_verifies_the_cache_and_repairs_it_from_maven_central(tmp_path: Path) -> None:
    require(shutil.which("mvn") is not None, "Maven is not installed (apt-get install maven)")
    version = LEGACY_VERSION
    cached = require_kafka_libs(version).parent  # the real cache: <cache>/kafka/<version>
    cache = tmp_path / "cache"
    shutil.copytree(cached, cache / "kafka" / version)  # libs + SHA256SUMS, but no Maven repository
    libs = cache / "kafka" / version / "libs"
    env = {**os.environ, "PRISM_CACHE_DIR": str(cache)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(FETCH_SCRIPT), *args], env=env, capture_output=True, text=True,
                              timeout=600, check=False)

    cached_run = run(version)  # verified against the manifest: quiet, the path only
    assert (cached_run.returncode, cached_run.stdout, cached_run.stderr) == (0, f"{libs}\n", "")
    sums = (libs.parent / "SHA256SUMS").read_text().splitlines()
    assert f"kafka_2.13-{version}.jar" in {line.split()[1] for line in sums}
    assert len(sums) == len(list(libs.glob("*.jar")))

    jar = libs / f"kafka-clients-{version}.jar"
    jar.write_bytes(jar.read_bytes()[:-1] + b"!")  # a damaged jar: fetched again, from an empty Maven repository
    repaired = run(version)
    require(repaired.returncode != 4, f"fetch-kafka.sh could not reach Maven Central: {repaired.stderr[-1000:]}")
    assert repaired.returncode == 0, repaired.stderr
    assert "failed verification" in repaired.stderr
    assert repaired.stdout.splitlines()[-1] == str(libs)
    assert (cache / "kafka" / "m2" / "org" / "apache" / "kafka").is_dir()  # its own repository, not ~/.m2
    subprocess.run(["sha256sum", "--quiet", "--strict", "-c", str(libs.parent / "SHA256SUMS")], cwd=libs,
                   check=True)
    assert (libs.parent / "SHA256SUMS").read_text().splitlines() == sums  # the same jars as before

    bad = run("latest")
    assert bad.returncode == 2 and "version must look like" in bad.stderr
