"""Plaintext that claims to be encrypted, through the real worker on the embedded broker
(issue 31 item 4; docs/encryption.md, "Claims of encryption").

The source has `classification_floor: confidential`. Anonymous producers send plaintext
labelled encrypted (every algorithm; the bare algorithm-and-key-id claim, and ones broken in a
single field, in both layouts); an authenticated producer does the same on data it states is
`public`. A plain consumer then reads every record of `.v2` and `.v3`, and no record carries
the plaintext: with `encrypt_unencrypted` the worker encrypted the fake claims (an SDK
consumer decrypts them to the originals), without it they are in the DLQ as
`encryption_claim_invalid`. Genuine producer ciphertext passes byte for byte either way.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from app.agents.policy import CLAIMED_ENCRYPTION
from app.envelope import Envelope, Layout, decode, encode, new_envelope
from app.security import keys as keymod
from app.security.algorithms import KEY_ML_KEM_1024, KEY_X25519_ML_KEM_1024
from app.security.devkeys import DevKeys
from app.security.encryption import AuditRecord, decrypt_envelope, encrypt_envelope
from app.security.signing import sign
from tests.agents.test_policy_claims import ALGORITHMS, fake_claim
from tests.brokers import BrokerUnderTest
from tests.security.adversarial.conftest import Adversary, Attack, Landed

NS = "order-events"


def no_audit(_record: AuditRecord) -> None:
    return None


@pytest.fixture
def adversary(broker: Any, tmp_path: Path, dev_keys: DevKeys) -> Adversary:
    """The embedded broker only (the issue's end-to-end case); the chain-level matrix is in
    tests/agents/test_policy_claims.py."""
    return Adversary(BrokerUnderTest("embedded", broker.bootstrap), tmp_path, dev_keys)


class Scenario:
    """The attacks and controls, each with its canary and its original payload."""

    def __init__(self, adversary: Adversary, topic: str) -> None:
        self.topic = topic
        self.keys = adversary.keys
        self.canaries: dict[str, bytes] = {}
        self.originals: dict[str, bytes] = {}
        self.genuine: dict[str, bytes] = {}   # label -> the producer's ciphertext
        self.attacks: list[Attack] = []
        self.recipient = keymod.FileKeyring([keymod.new_key_record("pq-1", KEY_ML_KEM_1024, namespace=NS)])

    def envelope(self, label: str, classification: str | None) -> Envelope:
        canary = f"canary-{label}-{uuid.uuid4().hex}".encode()
        env = new_envelope(self.topic, {"card": canary.decode()}, namespace=NS, data_classification=classification)
        self.canaries[label] = canary
        self.originals[label] = env.payload_bytes()
        return env

    def build(self) -> list[Attack]:
        for algorithm in sorted(ALGORITHMS):  # anonymous, stated public: the floor raises it
            env = self.envelope(f"fake-bare-{algorithm}", "public")
            fake_claim(env, algorithm, "bare")
            self.attacks.append(Attack(f"fake-bare-{algorithm}", encode(env, Layout.REVIEWED)))
        for kind, layout in (("short-iv", Layout.DRAFT), ("iv-in-key-field", Layout.REVIEWED)):
            env = self.envelope(f"fake-{kind}", None)  # no classification: the floor's
            fake_claim(env, "x25519-ml-kem-1024", kind)
            self.attacks.append(Attack(f"fake-{kind}", encode(env, layout)))
        env = self.envelope("fake-signed-confidential", "confidential")
        fake_claim(env, "rsa-oaep-4096", "short-iv")
        self.attacks.append(Attack("fake-signed-confidential", sign(env, self.keys.keyring.signing["dev-producer-1"])))
        env = self.envelope("fake-signed-public", "public")  # public: never encrypted by the worker
        fake_claim(env, "aes-256-gcm", "bare")
        self.attacks.append(Attack("fake-signed-public", sign(env, self.keys.keyring.signing["dev-producer-1"])))
        env = self.envelope("plain-anonymous", "public")
        self.attacks.append(Attack("plain-anonymous", encode(env, Layout.REVIEWED)))
        env = self.envelope("genuine-ml-kem", "public")
        encrypt_envelope(env, self.recipient.public_only(), key_id="pq-1", algorithm="ml-kem-1024", audit=no_audit)
        self.genuine["genuine-ml-kem"] = bytes(env.payload.value)
        self.attacks.append(Attack("genuine-ml-kem", encode(env, Layout.REVIEWED)))
        return self.attacks

    def assert_no_plaintext_leaves(self, landed: Landed) -> None:
        """What a plain consumer of `.v2` / `.v3` reads: no canary in any value or header."""
        outputs = landed.on("v2") + landed.on("v3")
        for rec in outputs:
            blob = rec.value + (rec.key or b"") + b"".join(k.encode() + (v or b"") for k, v in rec.headers)
            leaked = [label for label, c in self.canaries.items() if c in blob]
            assert not leaked, f"plaintext of {leaked} in {rec.topic}"
        assert len(landed.on("v2")) == len(landed.on("v3"))

    def outputs(self, landed: Landed, label: str) -> list[Envelope]:
        return [decode(r.value) for r in landed.on("v2") + landed.on("v3") if (r.key or b"").decode() == label]


async def test_the_worker_encrypts_fake_claims_and_no_plaintext_leaves(adversary: Adversary, tmp_path: Path) -> None:
    consumer = keymod.FileKeyring([keymod.new_key_record("hyb-1", KEY_X25519_ML_KEM_1024, namespace=NS)])
    consumer.public_only().save(tmp_path / "worker-keys.yaml")

    def edit(doc: dict[str, Any]) -> None:
        doc["sources"][0]["classification_floor"] = "confidential"
        doc["encryption"] = {"provider": "file", "path": str(tmp_path / "worker-keys.yaml"),
                             "encrypt_unencrypted": ["confidential", "restricted"], "algorithm": "x25519-ml-kem-1024"}

    topo = adversary.topology(edit)
    scenario = Scenario(adversary, topo.sources[0].topic)
    landed = await adversary.run(topo, scenario.build())
    scenario.assert_no_plaintext_leaves(landed)
    for attack in scenario.attacks:
        label = attack.label
        if label == "fake-signed-public":
            assert landed.where(label) == "dlq:encryption_claim_invalid"
            assert landed.dlq_entry(label).stage == "policy"
            continue
        assert landed.where(label) == "v3", label
        outs = scenario.outputs(landed, label)
        assert len(outs) == 2, label
        for env in outs:
            if label in scenario.genuine:  # producer ciphertext: passed through untouched
                assert bytes(env.payload.value) == scenario.genuine[label]
                assert decrypt_envelope(env, scenario.recipient, audit=no_audit) == scenario.originals[label]
                continue
            assert env.security.data_classification == "confidential"
            assert env.security.encryption.algorithm == "x25519-ml-kem-1024"
            assert (CLAIMED_ENCRYPTION in env.extensions) == label.startswith("fake-")
            assert decrypt_envelope(env, consumer, audit=no_audit) == scenario.originals[label], label
    assert landed.summary["dlq"] == 1 and landed.summary["emitted"] == len(scenario.attacks) - 1


async def test_without_the_encryption_block_fake_claims_go_to_the_dlq(adversary: Adversary) -> None:
    topo = adversary.topology(lambda doc: doc["sources"][0].__setitem__("classification_floor", "confidential"))
    scenario = Scenario(adversary, topo.sources[0].topic)
    landed = await adversary.run(topo, scenario.build())
    scenario.assert_no_plaintext_leaves(landed)
    for attack in scenario.attacks:
        label = attack.label
        if label.startswith("fake-"):
            assert landed.where(label) == "dlq:encryption_claim_invalid", label
            entry = landed.dlq_entry(label)
            assert entry.stage == "policy"
            assert entry.value == attack.value  # the record as received: nothing lost, replayable
        elif label == "plain-anonymous":  # raised to confidential by the floor, which requires encryption
            assert landed.where(label) == "dlq:policy_violation"
        else:
            assert landed.where(label) == "v3"
            assert all(bytes(e.payload.value) == scenario.genuine[label] for e in scenario.outputs(landed, label))
    assert landed.summary["emitted"] == 1 and landed.summary["dlq"] == len(scenario.attacks) - 1
