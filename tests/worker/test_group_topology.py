"""One consumer group, one topology (app/worker/group_topology.py): a worker whose topology has
another digest than the group's live members refuses to join, with one line; the same topology,
a stopped member and `--replace-topology` (a rollout) do not block."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaConsumer
from hypothesis import given
from hypothesis import strategies as st

from app.broker.admin import ensure_topics
from app.errors import ConfigError
from app.topology import load_topology
from app.worker.group_topology import (
    Member,
    TopologyMismatch,
    check_group_topology,
    client_id_for,
    digest_of_client_id,
    digest_of_member,
    group_digests,
    group_members,
    judge_members,
    member_of,
    rollout_owner,
    topology_digest,
)
from tests.brokers import BrokerUnderTest
from tests.worker.conftest import ROOT

SHIPPED = ROOT / "topologies/orders-created.yaml"


def _copy(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "orders-created.yaml"
    path.write_text(text)
    (folder / "schemas").symlink_to(ROOT / "topologies/schemas")
    return path


def test_digest_is_the_policy_not_the_file(tmp_path: Path) -> None:
    text = SHIPPED.read_text()
    base = topology_digest(load_topology(SHIPPED))
    # a comment, and the same file under another folder: the same policy
    assert topology_digest(load_topology(_copy(tmp_path, "a", "# deployed copy\n" + text))) == base
    # one setting changed: another policy
    changed = _copy(tmp_path, "b", text.replace("window_s: 3600", "window_s: 60"))
    assert topology_digest(load_topology(changed)) != base
    assert len(base) == 12 and int(base, 16) >= 0


def test_client_id_round_trip_and_foreign_ids() -> None:
    assert digest_of_client_id(client_id_for("prism-orders", "0123456789ab")) == "0123456789ab"
    for foreign in ("", "faust-0.11", "prism-orders", "prism-orders.topology-XYZ", "prism-orders.topology-0123",
                    "prism-orders.topology-0123456789ab-offsets"):
        assert digest_of_client_id(foreign) is None


def test_member_id_carries_the_digest_when_the_client_id_is_empty() -> None:
    member = client_id_for("prism-orders", "0123456789ab") + "-c99234f5-4920-4bd8-ad45-8d455bce5392"
    assert digest_of_member("", member) == "0123456789ab"
    assert digest_of_member("", "prism-orders.topology-0123456789ab") is None  # not a broker-built id
    assert digest_of_member("", "other-c99234f5-4920-4bd8-ad45-8d455bce5392") is None


@given(st.text(max_size=300), st.text(max_size=300))
def test_any_member_gives_a_digest_or_none(client_id: str, member_id: str) -> None:
    got = digest_of_member(client_id, member_id)
    assert got is None or (len(got) == 12 and got in client_id + member_id)


@given(st.text(max_size=300))
def test_any_client_id_gives_a_digest_or_none(client_id: str) -> None:
    got = digest_of_client_id(client_id)
    assert got is None or (len(got) == 12 and client_id.endswith(got))


async def _member(bootstrap: str, group: str, topic: str, digest: str, owner: str | None = None) -> AIOKafkaConsumer:
    """A live group member that says it runs `digest` (as a worker's consumer does)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                client_id=client_id_for(group, digest, owner), session_timeout_ms=6000,
                                heartbeat_interval_ms=1000)
    await consumer.start()
    deadline = asyncio.get_running_loop().time() + 60
    while not consumer.assignment():  # joined and assigned: DescribeGroups lists it now
        await consumer.getmany(timeout_ms=200)
        assert asyncio.get_running_loop().time() < deadline, "the member never got its partitions"
    return consumer


# ---------------------------------------------------------------- rollouts (Kubernetes)

STS = {"PRISM_ROLLOUT_NAMESPACE": "prism", "PRISM_ROLLOUT_REVISION": "prism-worker-5d8f7c9b6"}


def test_the_rollout_owner_is_the_statefulset_not_its_revision() -> None:
    owner = rollout_owner(STS)
    assert owner is not None and len(owner) == 8
    # the next revision of the same StatefulSet: the same owner (its rolling update)
    assert rollout_owner({**STS, "PRISM_ROLLOUT_REVISION": "prism-worker-77c4d9f8b"}) == owner
    # a copy under another name, or in another namespace: another owner
    assert rollout_owner({**STS, "PRISM_ROLLOUT_REVISION": "prism-worker-2-5d8f7c9b6"}) != owner
    assert rollout_owner({**STS, "PRISM_ROLLOUT_NAMESPACE": "staging"}) != owner
    assert rollout_owner({}) is None and rollout_owner({"PRISM_ROLLOUT_REVISION": " "}) is None  # by hand
    explicit = rollout_owner({"PRISM_ROLLOUT_OWNER": "prism/Deployment/prism-worker"})
    assert explicit is not None and explicit != owner
    assert rollout_owner({**STS, "PRISM_ROLLOUT_OWNER": "prism/Deployment/prism-worker"}) == explicit  # it wins


@pytest.mark.parametrize("env", [{"PRISM_ROLLOUT_REVISION": "5d8f7c9b6"}, {"PRISM_ROLLOUT_REVISION": "Prism_Worker-1"},
                                 {"PRISM_ROLLOUT_REVISION": "x-" + "a" * 300},
                                 {**STS, "PRISM_ROLLOUT_NAMESPACE": "Not A Namespace"},
                                 {"PRISM_ROLLOUT_OWNER": "a\nb"}, {"PRISM_ROLLOUT_OWNER": "x" * 600}])
def test_a_malformed_rollout_identity_is_a_config_error(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        rollout_owner(env)
    assert "PRISM_ROLLOUT" in info.value.path and "\n" not in str(info.value)


def test_the_owner_travels_in_the_client_and_member_id() -> None:
    cid = client_id_for("prism-orders", "0123456789ab", "89abcdef")
    assert cid == "prism-orders.topology-0123456789ab-89abcdef"
    assert member_of(cid, "") == Member("0123456789ab", "89abcdef")
    assert member_of("", cid + "-c99234f5-4920-4bd8-ad45-8d455bce5392") == Member("0123456789ab", "89abcdef")
    plain = client_id_for("prism-orders", "0123456789ab", None)
    assert member_of("", plain + "-c99234f5-4920-4bd8-ad45-8d455bce5392") == Member("0123456789ab", None)
    assert digest_of_client_id(cid) == "0123456789ab"


def test_client_id_for_takes_the_owner_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRISM_ROLLOUT_NAMESPACE", STS["PRISM_ROLLOUT_NAMESPACE"])
    monkeypatch.setenv("PRISM_ROLLOUT_REVISION", STS["PRISM_ROLLOUT_REVISION"])
    assert client_id_for("g", "0123456789ab").endswith(f"-{rollout_owner(STS)}")
    monkeypatch.delenv("PRISM_ROLLOUT_REVISION")
    assert client_id_for("g", "0123456789ab") == "g.topology-0123456789ab"


OLD, NEW, MINE, THEIRS = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "11111111", "22222222"


@pytest.mark.parametrize(("members", "owner", "replace", "joins"), [
    ({"p0": Member(NEW, MINE)}, MINE, False, True),                          # same topology
    ({"p0": Member(OLD, MINE), "p1": Member(OLD, MINE)}, MINE, False, True),  # its StatefulSet's rollout
    ({"p0": Member(OLD, MINE), "p1": Member(NEW, MINE)}, MINE, False, True),  # mid-rollout, either way
    ({"p0": Member(OLD, THEIRS)}, MINE, False, False),   # a second deployment into the same group
    ({"p0": Member(OLD, MINE), "p1": Member(OLD, THEIRS)}, MINE, False, False),  # one stranger is enough
    ({"p0": Member(OLD, None)}, MINE, False, False),     # a worker started by hand is nobody's rollout
    ({"p0": Member(OLD, MINE)}, None, False, False),     # and a hand-started worker rolls nobody's
    ({"p0": Member(OLD, None)}, None, False, False),
    ({"p0": Member(OLD, THEIRS)}, MINE, True, True),     # --replace-topology: on purpose, by hand
    ({"p0": Member(NEW, THEIRS)}, MINE, False, True),    # another owner, same policy: no harm
])
def test_who_may_join(members: dict[str, Member], owner: str | None, replace: bool, joins: bool) -> None:
    if joins:
        others = judge_members(members, NEW, owner, replace=replace, group="g")
        assert set(others.values()) <= {OLD}
        return
    with pytest.raises(TopologyMismatch) as info:
        judge_members(members, NEW, owner, replace=replace, group="g", topology_path="t.yaml")
    text = str(info.value)
    assert OLD in text and NEW in text and "--replace-topology" in text and "\n" not in text
    assert ("another deployment" in text) == (owner is not None)


@pytest.mark.timeout(180)
def test_a_statefulset_rollout_joins_and_a_second_deployment_is_refused(any_broker: BrokerUnderTest) -> None:
    """On a real group: members of the old revision with this worker's owner let it join; a
    member of another owner (an accidental second deployment) keeps it out."""
    group, topic = f"prism-g-{uuid.uuid4().hex[:8]}", f"t.{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        await ensure_topics(any_broker.bootstrap, {topic: 2})
        mine = await _member(any_broker.bootstrap, group, topic, OLD, MINE)
        try:
            seen = await group_members(any_broker.bootstrap, group)
            assert list(seen.values()) == [Member(OLD, MINE)], seen
            others = await check_group_topology(any_broker.bootstrap, group, NEW, owner=MINE)
            assert set(others.values()) == {OLD}  # its own rolling update
            for stranger in (THEIRS, None):
                with pytest.raises(TopologyMismatch):
                    await check_group_topology(any_broker.bootstrap, group, NEW, owner=stranger)
        finally:
            await mine.stop()

    asyncio.run(scenario())


@pytest.mark.timeout(180)
def test_a_member_with_another_digest_refuses_the_start(any_broker: BrokerUnderTest) -> None:
    group, topic = f"prism-g-{uuid.uuid4().hex[:8]}", f"t.{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        await ensure_topics(any_broker.bootstrap, {topic: 2})
        assert await group_digests(any_broker.bootstrap, group) == {}  # no group yet: nothing to compare
        member = await _member(any_broker.bootstrap, group, topic, "aaaaaaaaaaaa")
        try:
            seen = await group_digests(any_broker.bootstrap, group)
            assert list(seen.values()) == ["aaaaaaaaaaaa"], seen
            assert await check_group_topology(any_broker.bootstrap, group, "aaaaaaaaaaaa") == {}  # same topology
            with pytest.raises(TopologyMismatch) as refused:
                await check_group_topology(any_broker.bootstrap, group, "bbbbbbbbbbbb", topology_path="new.yaml",
                                           owner=None)
            text = str(refused.value)
            assert refused.value.code == "topology_mismatch"
            assert "aaaaaaaaaaaa" in text and "bbbbbbbbbbbb" in text and "--replace-topology" in text
            assert "\n" not in text
            # a rollout: joins anyway, and says whom it replaces
            others = await check_group_topology(any_broker.bootstrap, group, "bbbbbbbbbbbb", replace=True)
            assert set(others.values()) == {"aaaaaaaaaaaa"}
        finally:
            await member.stop()  # leaves the group
        if any_broker.embedded:
            return  # the embedded broker lists a departed member until the group's next join (documented)
        # gone from the group (Kafka handles LeaveGroup): the new version starts without the flag
        deadline = asyncio.get_running_loop().time() + 30
        while await group_digests(any_broker.bootstrap, group):
            assert asyncio.get_running_loop().time() < deadline, "the stopped member stayed in the group"
            await asyncio.sleep(0.5)
        assert await check_group_topology(any_broker.bootstrap, group, "bbbbbbbbbbbb") == {}

    asyncio.run(scenario())


@pytest.mark.timeout(240)
def test_prism_run_refuses_with_one_line(kafka, tmp_path: Path) -> None:
    """`prism run` on a cluster whose group is held by a worker of another topology version: exit 2,
    one `error [topology_mismatch]` line, and nothing joined."""
    suffix = uuid.uuid4().hex[:8]
    doc = yaml.safe_load(SHIPPED.read_text())
    doc["name"] = f"mismatch-{suffix}"
    doc["sources"][0]["topic"] = f"orders.created.{suffix}"
    doc["archive"] = {"enabled": False}
    path = _copy(tmp_path, "topo", yaml.safe_dump(doc))
    group = f"prism-{doc['name']}"

    async def hold() -> AIOKafkaConsumer:
        await ensure_topics(kafka.bootstrap, {doc["sources"][0]["topic"]: 4})
        return await _member(kafka.bootstrap, group, doc["sources"][0]["topic"], "000000000000")

    async def prism_run() -> tuple[int | None, str, str]:
        """`prism run` awaited on the member's own loop, so the member keeps heartbeating while
        the worker starts: a blocking wait would let the member's 6 s session lapse on a slow
        start, and the worker would then find the group empty and run until the timeout."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRISM_")}
        env.update(PRISM_BROKER_URL=kafka.bootstrap, PYTHONPATH=str(ROOT))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.cli.main", "run", "--topology", str(path), "--dev-keys",
            "--data-dir", str(tmp_path / "data"), cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 180)
        except TimeoutError:
            proc.kill()
            stdout, stderr = await proc.communicate()
            raise AssertionError(f"prism run did not exit within 180 s:\n{stderr.decode(errors='replace')[-3000:]}") from None
        return proc.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace")

    loop = asyncio.new_event_loop()
    member = loop.run_until_complete(hold())
    try:
        code, stdout, stderr = loop.run_until_complete(prism_run())
        errors = [line for line in stderr.splitlines() if line.startswith("error")]
        assert code == 2, stderr[-3000:]
        assert len(errors) == 1 and errors[0].startswith("error [topology_mismatch]"), stderr[-3000:]
        assert "Traceback" not in stderr + stdout
    finally:
        loop.run_until_complete(member.stop())
        loop.close()
