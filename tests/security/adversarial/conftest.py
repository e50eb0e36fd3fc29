"""Shared fixtures for the adversarial suite: each attack runs through the REAL worker (the
shipped topology's stage chain, RocksDB tables, dual publish) on the embedded broker, and the
test asserts where every attack record ended up - never in `.v3`, always in the DLQ with its
specific reason.

Generic on purpose (other attack files use them too):

* `adversary.topology(edit=..., **overrides)` - the shipped topology with fresh topics and the
  test's dev keys (tests/worker/conftest.py `make_topology`), optionally edited as a YAML doc;
* `adversary.keyring(extra_keys)` - the dev keyring plus attacker/other-namespace keys;
* `await adversary.run(topology, [Attack(label, value, ...), ...])` - starts the worker,
  produces the raw bytes (to any source topic), waits until the worker read them all, and
  returns a `Landed`: `landed.where(label)` is "v3" | "dlq:<reason>" | "nowhere";
* `async with adversary.session(topology) as s: landed = await s.send([...])` - the same, in
  several rounds against one running worker.

Records are told apart by their Kafka key: `Attack.label` is sent as the key, and both the
outputs and the DLQ keep the key of the input record.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.demo.runner import read_all
from app.security.devkeys import DevKeys
from app.topology import Topology, load_topology
from tests.brokers import BrokerUnderTest
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401  (dev_keys: re-exported fixture)
from tests.worker.harness import RunningPipeline


@dataclass(frozen=True)
class Attack:
    """One raw record to produce. `topic=None`: the topology's first source."""

    label: str
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    topic: str | None = None


@dataclass(frozen=True)
class DlqEntry:
    label: str
    reason: str
    stage: str
    source_topic: str
    value: bytes
    headers: dict[str, bytes]


@dataclass
class Landed:
    """Every record of every source's outputs and DLQ after a run, by attack label."""

    summary: dict[str, Any]
    records: dict[str, list[Any]]           # output/DLQ topic -> consumer records
    dlq_suffix: str = ".dlq"

    def dlq(self) -> list[DlqEntry]:
        out = []
        for topic, recs in self.records.items():
            if not topic.endswith(self.dlq_suffix):
                continue
            for r in recs:
                h = {k: v for k, v in r.headers}
                out.append(DlqEntry((r.key or b"").decode(), h["prism.errors.reason"].decode(),
                                    h["prism.errors.stage"].decode(), h["prism.errors.topic"].decode(), r.value, h))
        return out

    def on(self, layout: str) -> list[Any]:
        """Output records of one layout (`v2`, `v3`) across every source."""
        return [r for t, recs in self.records.items() if t.endswith(f".{layout}") for r in recs]

    def where(self, label: str) -> str:
        """Where the record with this label went: `v3` (emitted), `dlq:<reason>`, or `nowhere`
        (expired/duplicate: counted by the worker, written nowhere)."""
        places = [f"dlq:{d.reason}" for d in self.dlq() if d.label == label]
        places += ["v3" for r in self.on("v3") if (r.key or b"").decode() == label]
        assert len(places) <= 1, f"{label} landed more than once: {places}"
        return places[0] if places else "nowhere"

    def dlq_entry(self, label: str) -> DlqEntry:
        return next(d for d in self.dlq() if d.label == label)


class Adversary:
    def __init__(self, broker: Any, tmp_path: Path, keys: DevKeys) -> None:
        self.broker = broker
        self.tmp_path = tmp_path
        self.keys = keys

    def topology(self, edit: Callable[[dict[str, Any]], None] | None = None, **overrides: Any) -> Topology:
        """The shipped topology with fresh topic names (one partition, so records are read in the
        order produced). `edit(doc)` may change anything; extra sources it adds are created too."""
        topo = make_topology(self.tmp_path, self.keys, partitions=1, **overrides)
        if edit is None:
            return topo
        path = self.tmp_path / "topology.yaml"  # where make_topology wrote it
        doc = yaml.safe_load(path.read_text())
        edit(doc)
        path.write_text(yaml.safe_dump(doc))
        return load_topology(path)

    def keyring(self, extra_keys: list[dict[str, Any]]) -> Path:
        """A keyring file: the dev keyring (producer key, worker key) plus `extra_keys` entries
        ({"id", "secret": bytes, "namespaces"?}: HMAC keys). Returns its path."""
        doc = json.loads(self.keys.signing_path.read_text())
        for k in extra_keys:
            entry = {"id": k["id"], "algorithm": "hmac-sha256", "secret_b64": base64.b64encode(k["secret"]).decode()}
            if "namespaces" in k:
                entry["namespaces"] = k["namespaces"]
            doc["keys"].append(entry)
        path = self.tmp_path / f"keyring-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(doc))
        return path

    def session(self, topology: Topology) -> Session:
        """`async with adversary.session(topo) as s:` - one running worker for several rounds
        (e.g. replay what the worker itself emitted in round one)."""
        return Session(self, topology)

    async def run(self, topology: Topology, attacks: list[Attack], timeout: float = 60) -> Landed:
        """One round: start the worker, produce `attacks`, collect where they landed, stop."""
        async with self.session(topology) as s:
            return await s.send(attacks, timeout=timeout)


class Session:
    def __init__(self, adversary: Adversary, topology: Topology) -> None:
        self.adversary = adversary
        self.topology = topology
        self.pipeline = RunningPipeline(topology, adversary.broker.bootstrap,
                                        adversary.tmp_path / f"w-{uuid.uuid4().hex[:6]}",
                                        embedded=adversary.broker.embedded)
        self.sent = 0
        self.labels: set[str] = set()

    async def __aenter__(self) -> Session:
        await self.pipeline.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.pipeline.__aexit__(*exc)

    async def send(self, attacks: list[Attack], timeout: float = 60) -> Landed:
        """Produce `attacks` (in order), wait until the worker has read them, and return where
        every record of this session so far landed."""
        labels = [a.label for a in attacks]
        assert len(set(labels)) == len(labels) and not self.labels & set(labels), \
            "attack labels must be unique within a session (they are the record keys)"
        self.labels.update(labels)
        p = self.pipeline
        assert p.producer is not None
        for a in attacks:
            await (await p.producer.send(a.topic or p.source, a.value, key=a.label.encode(), headers=a.headers))
        self.sent += len(attacks)
        await p.wait_read(self.sent, timeout=timeout)
        summary = p.pipeline.summary()
        t = self.topology
        names = {f"{s.topic}.{layout}": s.partitions for s in t.sources for layout in t.outputs.layouts}
        names.update({s.topic + t.dlq.topic_suffix: s.partitions for s in t.sources})
        expected = summary["emitted"] * len(t.outputs.layouts) + summary["dlq"]
        records = await read_all(self.adversary.broker.bootstrap, names, expected_total=expected, timeout=30)
        got = sum(len(r) for r in records.values())
        assert got == expected, f"read {got} output/DLQ records, the worker wrote {expected}: {summary}"
        return Landed(summary, records, t.dlq.topic_suffix)


@pytest.fixture
def adversary(any_broker: BrokerUnderTest, tmp_path: Path, dev_keys: DevKeys) -> Adversary:  # noqa: F811
    """Every attack runs on the embedded broker and on Apache Kafka (`any_broker`)."""
    return Adversary(any_broker, tmp_path, dev_keys)
