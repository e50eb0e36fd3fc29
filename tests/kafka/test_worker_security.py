"""The worker on a secured Apache Kafka (SASL_SSL/SCRAM-SHA-512, mutual TLS, StandardAuthorizer ACLs).

Why these tests: a wrong password, an untrusted certificate or a missing ACL used to make the
worker retry inside aiokafka forever (it looked like a hang). The start-up preflight
(app/broker/preflight.py) must stop it with one line naming the cause, and the ACL recipe of
docs/deploy.md must be exactly enough for the worker to run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from app.broker.admin import BrokerSettings, ensure_topics
from app.broker.preflight import BrokerPreflightError, plan_for, preflight
from app.envelope import new_envelope
from app.security.devkeys import DevKeys, ensure_dev_keys
from app.security.signing import SigningKey, sign
from app.topology import Topology
from tests.kafka.cluster import ApacheKafka, CertificateAuthority, prism_env
from tests.worker.conftest import ROOT, make_topology
from tests.worker.harness import RunningPipeline


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


def grant_recipe(kafka: ApacheKafka, principal: str, topo: Topology, app_id: str, *,
                 skip: tuple[str, str] | None = None) -> None:
    """The ACLs docs/deploy.md grants the worker's principal (``skip``: one (operation, topic) left out)."""
    source = topo.sources[0].topic
    grants = [("READ", source), ("DESCRIBE", source)]
    for topic in [f"{source}.{layout}" for layout in topo.outputs.layouts] + [source + topo.dlq.topic_suffix]:
        grants += [("WRITE", topic), ("DESCRIBE", topic)]
    for op, topic in grants:
        if (op, topic) != skip:
            kafka.add_acl(principal, op, topic=topic)
    for op in ("CREATE", "READ", "WRITE", "DESCRIBE"):
        kafka.add_acl(principal, op, topic=f"{app_id}-", pattern="PREFIXED")
    kafka.add_acl(principal, "READ", group=app_id)


async def create_topics(kafka: ApacheKafka, topo: Topology) -> None:
    await ensure_topics(kafka.bootstrap_for("SASL_SSL"), topo.topics(),
                        settings=BrokerSettings.from_env(prism_env(kafka.admin_config())))


def worker_env(tmp_path: Path, env: dict[str, str], app_id: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}, **env,
            "PRISM_TOPOLOGY": str(tmp_path / "topology.yaml"), "PRISM_BOOTSTRAP": env["PRISM_BROKER_URL"],
            "PRISM_DATA_DIR": str(tmp_path / "data"), "PRISM_APP_ID": app_id, "PRISM_EMBEDDED": "0"}


def start_fails(env: dict[str, str]) -> tuple[str, float]:
    """Run the worker entry point (as `prism run --processes` children do); it must exit 2 quickly."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "app.worker.faust_app", "app.worker.pipeline:app_from_env"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error [")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0], elapsed


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
async def test_worker_runs_with_only_the_recipe_acls(kafka_secure: ApacheKafka, tmp_path: Path, keys: DevKeys,
                                                     listener: str) -> None:
    topo = make_topology(tmp_path, keys, partitions=1)
    app_id = f"sec-{uuid.uuid4().hex[:8]}"
    user = "alice" if listener == "SASL_SSL" else f"cn-{uuid.uuid4().hex[:6]}"  # mTLS: principal = cert CN
    cfg = kafka_secure.client_config(listener, user=user)  # type: ignore[arg-type]
    settings = BrokerSettings.from_env(prism_env(cfg))
    assert (settings.ssl_certfile is not None) == (listener == "SSL")
    await create_topics(kafka_secure, topo)
    grant_recipe(kafka_secure, user, topo, app_id)
    source = topo.sources[0].topic
    real = keys.keyring.signing["dev-producer-1"]
    async with RunningPipeline(topo, cfg["bootstrap_servers"], tmp_path / "w", app_id=app_id, embedded=False,
                               settings=settings) as p:
        assert preflight(settings, plan_for(p.pipeline)) == []  # the recipe passes the start-up check
        # the table recovery's offset queries went through the offsets probe (app/worker/offsets.py),
        # a second connection with the worker's credentials: it connected over this listener and
        # the recipe's ACLs let it list and fetch the changelogs' offsets (else the start fails)
        probe = p.pipeline.app.consumer._thread.offsets_probe
        assert probe is not None and probe._client._security_protocol == listener
        kafka_secure.add_acl(user, "WRITE", topic=source)  # only the test's producer needs this
        await p.send(sign(new_envelope(source, {"amount": 1}, namespace="order-events"), real))
        forged = SigningKey.hmac_sha256("dev-producer-1", b"x" * 32)  # wrong secret: DLQ
        await p.send(sign(new_envelope(source, {"amount": 2}, namespace="order-events"), forged))
        await p.wait_read(2)
        # reading the outputs back is the admin's business, not the worker's
        admin = BrokerSettings.from_env(prism_env(kafka_secure.admin_config()))
        p.settings, p.bootstrap = admin, admin.bootstrap
        out = await p.outputs()
    assert len(out[f"{source}.v3"]) == 1
    assert len(out[source + topo.dlq.topic_suffix]) == 1
    assert probe._closed  # stopped with the worker


async def test_wrong_password_stops_the_worker_at_once(kafka_secure: ApacheKafka, tmp_path: Path,
                                                      keys: DevKeys) -> None:
    topo = make_topology(tmp_path, keys, partitions=1)
    env = prism_env(kafka_secure.client_config("SASL_SSL", user="alice", password="not-her-password"))
    line, elapsed = start_fails(worker_env(tmp_path, env, f"sec-{uuid.uuid4().hex[:8]}"))
    assert elapsed < 30
    assert line.startswith("error [kafka_auth_failed] SASL authentication failed for user 'alice' with "
                           "SCRAM-SHA-512"), line
    assert topo.sources  # the topology itself is fine: the failure is the password


async def test_untrusted_certificates_are_named(kafka_secure: ApacheKafka, tmp_path: Path) -> None:
    other = CertificateAuthority(tmp_path / "other-ca")
    mallory = other.issue("mallory")
    # a client certificate the broker does not trust (mutual TLS)
    cfg = kafka_secure.client_config("SSL", cert=mallory)
    with pytest.raises(BrokerPreflightError) as info:
        preflight(BrokerSettings.from_env(prism_env(cfg)), timeout=20)
    assert info.value.code == "kafka_tls_failed"
    assert f"rejected client certificate '{mallory.cert}'" in str(info.value)
    # a CA file that did not sign the broker's certificate
    env = {**prism_env(kafka_secure.client_config("SASL_SSL", user="alice")), "PRISM_SSL_CAFILE": str(other.cafile)}
    with pytest.raises(BrokerPreflightError) as info:
        preflight(BrokerSettings.from_env(env), timeout=20)
    assert info.value.code == "kafka_tls_failed"
    assert f"not trusted by {other.cafile}" in str(info.value)


async def test_a_missing_acl_is_named_with_its_command(kafka_secure: ApacheKafka, tmp_path: Path,
                                                      keys: DevKeys) -> None:
    topo = make_topology(tmp_path, keys, partitions=1)
    app_id = f"sec-{uuid.uuid4().hex[:8]}"
    user = f"u{uuid.uuid4().hex[:6]}"
    kafka_secure.add_scram_user(user, "pw-" + user)
    dlq = topo.sources[0].topic + topo.dlq.topic_suffix
    await create_topics(kafka_secure, topo)
    grant_recipe(kafka_secure, user, topo, app_id, skip=("WRITE", dlq))
    env = prism_env(kafka_secure.client_config("SASL_SSL", user=user))
    line, elapsed = start_fails(worker_env(tmp_path, env, app_id))
    assert elapsed < 30
    assert line.startswith(f"error [kafka_acl_missing] principal User:{user} lacks ACL(s): WRITE on topic '{dlq}' "), line
    assert f"--allow-principal 'User:{user}' --operation WRITE --topic '{dlq}'" in line


async def test_topics_create_and_the_sdk_over_sasl_ssl(kafka_secure: ApacheKafka, tmp_path: Path,
                                                      keys: DevKeys, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = make_topology(tmp_path, keys, partitions=1)
    source = topo.sources[0].topic
    env = prism_env(kafka_secure.client_config("SASL_SSL", user="bob"))
    kafka_secure.add_acl("bob", "ALL", topic=source, pattern="PREFIXED")  # the topics of this topology
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}, **env}
    proc = subprocess.run([sys.executable, "-m", "app.cli.main", "topics", "create", "-t",
                           str(tmp_path / "topology.yaml")], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"created  {source} " in proc.stdout and f"created  {source}.v3 " in proc.stdout, proc.stdout

    from app.sdk import PrismClient

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    async with PrismClient(f"kafka://{env['PRISM_BROKER_URL']}?security=env&create_topics=0",
                           namespace="order-events") as client:
        receipt = await client.publish(source, {"amount": 2})
    assert receipt is not None


async def test_the_archive_tap_and_prism_dlq_over_sasl_ssl(kafka_secure: ApacheKafka, tmp_path: Path,
                                                          keys: DevKeys) -> None:
    """The archive tap (inside the worker, the worker's principal) and `prism dlq list` (an
    operator's principal) cross the SASL_SSL wire like the worker does: the recipe plus READ on
    `.v3` for the tap (docs/deploy.md) is all the worker needs."""
    archive = tmp_path / "archive"
    topo = make_topology(tmp_path, keys, partitions=1, archive={"enabled": True, "path": str(archive)})
    source = topo.sources[0].topic
    app_id = f"sec-{uuid.uuid4().hex[:8]}"
    cfg = kafka_secure.client_config("SASL_SSL", user="alice")
    settings = BrokerSettings.from_env(prism_env(cfg))
    await create_topics(kafka_secure, topo)
    grant_recipe(kafka_secure, "alice", topo, app_id)
    kafka_secure.add_acl("alice", "READ", topic=f"{source}.v3")  # the archive tap reads what it archives
    kafka_secure.add_acl("alice", "WRITE", topic=source)  # only the test's producer needs this
    real = keys.keyring.signing["dev-producer-1"]
    async with RunningPipeline(topo, cfg["bootstrap_servers"], tmp_path / "w", app_id=app_id, embedded=False,
                               settings=settings, archive_location=str(archive)) as p:
        await p.send(sign(new_envelope(source, {"amount": 1}, namespace="order-events"), real))
        forged = SigningKey.hmac_sha256("dev-producer-1", b"x" * 32)
        await p.send(sign(new_envelope(source, {"amount": 2}, namespace="order-events"), forged))
        await p.wait_read(2)
        assert p.pipeline.archive is not None
        await asyncio.sleep(1.0)  # the tap polls .v3 every 200 ms; what it accepted is committed on stop
    # the tap read the one .v3 record over SASL_SSL and committed it when the worker stopped
    from app.lake.archive import Archive

    assert Archive(str(archive)).committed_offsets() == {(f"{source}.v3", 0): 0}, sorted(
        str(f) for f in archive.rglob("*"))

    operator = {**{k: v for k, v in os.environ.items() if not k.startswith("PRISM_")},
                **prism_env(kafka_secure.admin_config())}
    proc = subprocess.run([sys.executable, "-m", "app.cli.main", "dlq", "list", "-t", str(tmp_path / "topology.yaml"),
                           "--json"], cwd=ROOT, env=operator, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bad_signature" in proc.stdout, proc.stdout[-3000:]


async def test_cli_commands_name_a_wrong_password_not_the_network(kafka_secure: ApacheKafka, tmp_path: Path,
                                                                  keys: DevKeys) -> None:
    """`prism dlq list` with a wrong SASL password ended in aiokafka's "Unable to bootstrap", which
    points at the network; every broker command now says what `prism run` says, in one line."""
    make_topology(tmp_path, keys, partitions=1)
    env = prism_env(kafka_secure.client_config("SASL_SSL", user="alice", password="not-her-password"))
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}, **env}
    for args in (("dlq", "list", "-t", str(tmp_path / "topology.yaml")), ("status", "--group", "g1"),
                 ("dlq", "replay", "-t", str(tmp_path / "topology.yaml"))):
        proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "app.cli.main", *args], cwd=ROOT,
                                       env=full, capture_output=True, text=True, timeout=60)
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
        assert lines[0].startswith("error [kafka_auth_failed] SASL authentication failed for user 'alice'"), lines[0]
        assert "PRISM_SASL_PASSWORD" in lines[0] and "bootstrap" not in lines[0].lower()
