"""Shared by the DLQ replay tests: a realistic, curable DLQ reason and the real replay CLI.

The curable reason: the shipped topology requires end-to-end encryption for `confidential`
data (policy stage). Producers of a namespace whose data the data owner re-classified send
`confidential` messages in plain text; they go to the DLQ with `policy_violation` after
their tokens were verified. The fix is the policy change (encryption required for
`restricted` only), rolled out by restarting the worker with the same consumer group; then
`prism dlq replay` puts the dead-lettered records back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from app.envelope import encode, new_envelope
from app.security.attestation import HEADER
from app.security.devkeys import DevKeys
from app.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[2]


def fixed_topology(topo: Topology, folder: Path) -> Topology:
    """The same topology (same topics) with the policy fixed: encryption only for `restricted`."""
    doc = yaml.safe_load((topo.base_dir / "topology.yaml").read_text())
    for stage in doc["stages"]:
        if "policy" in stage:
            stage["policy"]["require_encryption_for"] = ["restricted"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


def publishers(n: int) -> list[tuple[str, str]]:
    """(subject, team) of the token behind message i: a few publishers of several teams."""
    return [(f"publisher-{i % 4}", ("commerce", "payments")[i % 2]) for i in range(n)]


def authenticated_messages(topic: str, keys: DevKeys, n: int) -> list[tuple[bytes, list[tuple[str, bytes]], str]]:
    """`n` confidential, unencrypted messages with valid tokens: half Prism envelopes (token in
    security.auth_token, a false claimed publisher id), half legacy Kafka-header records (token in
    an Authorization header, no message id: the worker generates one). (value, headers, subject)."""
    out = []
    for i, (sub, team) in enumerate(publishers(n)):
        token = keys.mint_token(sub, team=team)
        if i % 2 == 0:
            env = new_envelope(topic, {"order_id": f"o-{i}", "total": i}, namespace="order-events",
                               message_id=f"replay-{i}-{os.urandom(4).hex()}")
            sec = env.ensure_security()
            sec.auth_token, sec.data_classification, sec.publisher_id = token, "confidential", "claimed-by-producer"
            out.append((encode(env), [], sub))
        else:
            out.append((json.dumps({"order_id": f"o-{i}", "total": i}).encode(),
                        [("content-type", b"application/json"), ("data-classification", b"confidential"),
                         ("correlation-id", f"corr-{i}".encode()), ("Authorization", f"Bearer {token}".encode())],
                        sub))
    return out


def attestation_doc(rec: Any) -> dict[str, Any]:
    """The (unverified) body of a DLQ record's attestation header."""
    raw = dict(rec.headers)[HEADER]
    body = raw.split(b".")[0]
    return json.loads(base64.urlsafe_b64decode(body + b"=" * (-len(body) % 4)))


async def cli_replay(topology: Topology, bootstrap: str, *extra: str) -> str:
    """`prism dlq replay` as an operator runs it: the real CLI in its own process."""
    env = {**os.environ, "PRISM_BROKER_URL": bootstrap}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli.main", "dlq", "replay", "-t", str(topology.base_dir / "topology.yaml"),
        *extra, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    return text
