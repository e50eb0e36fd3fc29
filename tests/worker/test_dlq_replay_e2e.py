"""DLQ replay end to end on the real embedded broker: authenticated messages fail for a curable
reason (tests/worker/replay.py), the cause is fixed, `prism dlq replay` re-injects them, and
every message reaches `.v3` exactly once with the identity its token proved - although the DLQ
never held the token. Replaying twice is a no-op (the ledger); `--force` sends again, to the
records' original partitions, where dedup keeps `.v3` at one copy each."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from types import SimpleNamespace

from app.cli.ops import attestation_reader_for, dlq_row
from app.demo.runner import read_all
from app.envelope import decode
from app.security.attestation import HEADER
from tests.brokers import BrokerUnderTest
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline
from tests.worker.replay import attestation_doc, authenticated_messages, cli_replay, fixed_topology

N = 24


async def test_replayed_dlq_records_keep_their_verified_identity(any_broker: BrokerUnderTest, tmp_path: Path,
                                                                dev_keys) -> None:
    broker = any_broker  # the embedded broker and Apache Kafka
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    group = f"test-replay-{uuid.uuid4().hex[:8]}"
    messages = authenticated_messages(src, dev_keys, N)
    tokens = [dict(h).get("Authorization", b"")[7:] for _, h, _ in messages if h]

    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w", app_id=group, embedded=broker.embedded) as p:
        for value, headers, _ in messages:
            await p.send(value, headers=headers)
        await p.wait_read(N)
    s = p.pipeline.summary()
    assert s["dlq"] == N and s["dlq_reasons"] == {"policy_violation": N}, s
    dlq = (await read_all(broker.bootstrap, {src + ".dlq": 2}, expected_total=N, timeout=30))[src + ".dlq"]
    assert len(dlq) == N
    for rec in dlq:
        assert HEADER in dict(rec.headers)
        blob = rec.value + b"".join(v for _, v in rec.headers)
        assert not any(t in blob for t in tokens)  # the DLQ keeps the identity, never the token
    attested = {attestation_doc(r)["message_id"]: attestation_doc(r) for r in dlq}
    assert len(attested) == N
    # `prism dlq list|show` tell the operator which identity a replay will carry
    reader, _ = attestation_reader_for(topo)
    rows = [dlq_row(r, reader) for r in dlq]
    assert sorted(r["attested_identity"] for r in rows) == sorted(
        f"{d['publisher_id']} ({d['publisher_team']})" for d in attested.values())
    assert {r["attestation"] for r in rows} == {"verified"}
    # The header is one anyone who writes the topic can set: moved onto another payload, the
    # same claim is listed as not verified.
    moved = SimpleNamespace(**{k: getattr(dlq[0], k) for k in ("topic", "partition", "offset", "timestamp", "key",
                                                                "headers")}, value=dlq[1].value)
    assert dlq_row(moved, reader)["attestation"].startswith("NOT verified: attestation is for another payload")

    # The fix: the policy change, rolled out by restarting the worker on the same consumer group.
    fixed = fixed_topology(topo, tmp_path / "fixed")
    async with RunningPipeline(fixed, broker.bootstrap, tmp_path / "w", app_id=group, embedded=broker.embedded) as p2:
        out = await cli_replay(fixed, broker.bootstrap, "--reason", "policy_violation")
        assert f"replayed {N} record(s)" in out, out
        await p2.wait_read(N)
        # The same command again - a user's second try: the ledger makes it a no-op that says why.
        again = await cli_replay(fixed, broker.bootstrap, "--reason", "policy_violation")
        assert f"replayed 0 record(s); skipped {N}: already_replayed {N}" in again, again
        assert again.count("--force replays it again") == N
        await asyncio.sleep(1.0)
        assert p2.pipeline.stats.read == N  # nothing was sent
        s2 = p2.pipeline.summary()
        assert s2["emitted"] == N and s2["dlq"] == 0, s2["dlq_reasons"]
        # --force sends every record again, each to the partition it was first read from with its
        # key, so the worker's per-partition dedup window meets its id: still nothing twice on .v3
        # (before, keyless replays were spread over partitions and emitted a second time).
        forced = await cli_replay(fixed, broker.bootstrap, "--force")
        assert f"replayed {N} record(s) ({N} again, forced)" in forced, forced
        await p2.wait_read(2 * N)
        v3 = (await read_all(broker.bootstrap, {src + ".v3": 2}, expected_total=N, timeout=30))[src + ".v3"]
    s3 = p2.pipeline.summary()
    assert p2.pipeline.stats.read == 2 * N, s3  # only the replays: the originals were not read again
    assert s3["emitted"] == N and s3["duplicate"] == N and s3["dlq"] == 0, s3
    originals = {(attestation_doc(r)["message_id"], attestation_doc(r)["partition"]) for r in dlq}
    # each emitted from the source partition it was first read from (prism-source: topic/partition/offset)
    assert {(decode(r.value).message_id, int(dict(r.headers)["prism-source"].split(b"/")[-2])) for r in v3} == originals

    assert len(v3) == N  # each message exactly once
    assert all(HEADER not in dict(r.headers) for r in v3)  # a DLQ artifact, not forwarded
    envs = [decode(r.value) for r in v3]
    assert {e.message_id for e in envs} == set(attested)
    expected = {(sub, team) for sub, team in ((d["publisher_id"], d["publisher_team"]) for d in attested.values())}
    assert expected == {(f"publisher-{i}", ("commerce", "payments")[i % 2]) for i in range(4)}
    for e in envs:
        d = attested[e.message_id]
        assert (e.security.publisher_id, e.security.publisher_team) == (d["publisher_id"], d["publisher_team"])
        assert e.security.publisher_id != "claimed-by-producer" and not e.security.auth_token
    subs_sent = sorted(sub for _, _, sub in messages)
    assert sorted(e.security.publisher_id for e in envs) == subs_sent
