"""The replay ledger as an attacker and a crash meet it (app/cli/dlq.py, "Exactly one send").

Whoever can write `<dlq>.replayed` can write anything to it: a forged `"replays": "2"` crashed
`prism dlq replay` (after a forced send, before the ledger write, so every retry sent the record
again) and one deeply nested value broke every replay and the console's DLQ list. Entries are now
validated field by field, an invalid one is skipped with one warning, and a replay writes a
`pending` entry before its send, so a run killed between send and ledger write never sends the
record a second time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli.dlq import LedgerEntry, LedgerEntryError, ledger_topic, read_ledger, read_to_end, replay
from app.demo.runner import read_all
from tests.cli.test_dlq_cli import _cli, _dlq_copies, _seed
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - fixtures (broker: tests/conftest.py)


class Killed(Exception):
    """The replay process dying at one point of its protocol."""


GOOD = {"dlq_topic": "o.dlq", "dlq_partition": 0, "dlq_offset": 3, "value_sha256": "a" * 64, "source_topic": "o",
        "source_partition": 1, "source_offset": 101, "replayed_partition": 1, "replayed_offset": 9,
        "replayed_at_ms": 1_700_000_000_000, "by": "ops@host", "forced": False, "replays": 1, "v": 1}


def test_a_valid_entry_reads_back_and_old_entries_are_done() -> None:
    entry = LedgerEntry.parse(json.dumps(GOOD).encode())
    assert entry.key == "0@3" and entry.state == "done" and not entry.pending
    assert LedgerEntry.parse(entry.encode()) == entry


@pytest.mark.parametrize(("change", "why"), [
    ({"replays": "2"}, "replays must be a whole number"),
    ({"replays": 0}, "replays must be a whole number"),
    ({"replays": True}, "replays must be a whole number"),
    ({"dlq_offset": -1}, "dlq_offset"),
    ({"dlq_offset": 2**63}, "dlq_offset"),
    ({"replayed_offset": 1.5}, "replayed_offset"),
    ({"forced": "yes"}, "forced must be true or false"),
    ({"by": "x" * 10_000}, "by must be"),
    ({"by": "evil\x1b[31m"}, "by must be"),
    ({"value_sha256": "A" * 64}, "value_sha256"),
    ({"state": "maybe"}, "state must be"),
    ({"state": "pending", "replayed_offset": -1, "pending_from": 4}, "needs sent_sha256"),
    ({"extra": 1}, "unknown field"),
    ({"v": 2}, "version"),
    ({"source_offset": None, "replays": [[[1]]]}, "nested too deeply"),
])
def test_each_forged_field_is_refused_naming_it(change: dict[str, Any], why: str) -> None:
    with pytest.raises(LedgerEntryError, match=why):
        LedgerEntry.parse(json.dumps({**GOOD, **change}).encode())


def test_deep_nesting_and_non_objects_are_refused() -> None:
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"[]", b"7", b"\xff"):
        with pytest.raises(LedgerEntryError):
            LedgerEntry.parse(raw)


@given(st.binary(max_size=400))
@settings(max_examples=300)
def test_any_bytes_are_an_entry_or_a_ledger_entry_error(raw: bytes) -> None:
    try:
        entry = LedgerEntry.parse(raw)
    except LedgerEntryError:
        return
    assert isinstance(entry, LedgerEntry)


@given(st.dictionaries(st.sampled_from(sorted(GOOD)), st.none() | st.booleans() | st.integers() | st.text(max_size=8)
                       | st.lists(st.integers(), max_size=2), max_size=6))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a loaded CI machine
def test_any_field_values_are_an_entry_or_a_ledger_entry_error(change: dict[str, Any]) -> None:
    try:
        entry = LedgerEntry.parse(json.dumps({**GOOD, **change}).encode())
    except LedgerEntryError:
        return
    assert entry.replays >= 1 and isinstance(entry.forced, bool) and entry.dlq_offset >= 0


def test_read_ledger_skips_bad_records_and_says_why() -> None:
    from types import SimpleNamespace

    good = LedgerEntry.parse(json.dumps(GOOD).encode())
    recs = [SimpleNamespace(offset=0, key=b"0@3", value=json.dumps({**GOOD, "replays": "2"}).encode()),
            SimpleNamespace(offset=1, key=b"0@4", value=good.encode()),  # key is not the entry's
            SimpleNamespace(offset=2, key=b"0@3", value=None),  # a tombstone
            SimpleNamespace(offset=3, key=b"0@3", value=good.encode())]
    problems: list[str] = []
    assert read_ledger(recs, problems) == {"0@3": good}
    assert len(problems) == 2 and "offset 0" in problems[0] and "replays" in problems[0]
    assert "offset 1" in problems[1] and "not the entry's" in problems[1]


async def _write_ledger(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    from app.broker.admin import ensure_topics

    await ensure_topics(bootstrap, {topic: 1}, configs={topic: {"cleanup.policy": "compact"}})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


async def test_forged_ledger_records_are_skipped_with_one_warning(broker, tmp_path, dev_keys) -> None:  # noqa: F811
    from app.broker.admin import ensure_topics

    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics())
    copies, _ = _dlq_copies(topo, dev_keys, 2)
    where = await _seed(broker.bootstrap, copies, [0, 0])
    refs = [f"{p}@{o}" for p, o in where]
    forged = {**GOOD, "dlq_topic": src + ".dlq", "dlq_partition": where[0][0], "dlq_offset": where[0][1],
              "replays": "2", "forced": True}
    await _write_ledger(broker.bootstrap, ledger_topic(src + ".dlq"), [
        (refs[0].encode(), json.dumps(forged).encode()),
        (refs[1].encode(), b"[" * 200_000 + b"]" * 200_000)])
    res = await _cli("dlq", "replay", "-t", str(tmp_path / "topology.yaml"), "--force", bootstrap=broker.bootstrap)
    assert res.returncode == 0, res.stderr
    assert "replayed 2 record(s)" in res.stdout
    warnings = [line for line in res.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "2 record(s)" in warnings[0] and "replays must be" in warnings[0], res.stdout
    assert "Traceback" not in res.stdout + res.stderr
    again = await replay(topo, broker.bootstrap)  # the real entries written now win over the forged ones
    assert again.skipped_by_why() == {"already_replayed": 2} and len(again.warnings) == 1


async def test_a_replay_killed_between_send_and_ledger_never_sends_twice(broker, tmp_path, dev_keys,  # noqa: F811
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from app.broker.admin import ensure_topics

    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    ledger = ledger_topic(src + ".dlq")
    await ensure_topics(broker.bootstrap, topo.topics())
    copies, _ = _dlq_copies(topo, dev_keys, 2)
    where = await _seed(broker.bootstrap, copies, [0, 0])
    refs = [f"{p}@{o}" for p, o in where]
    assert (await replay(topo, broker.bootstrap, records=[refs[0]])).count("replayed") == 1

    real_send = AIOKafkaProducer.send

    async def dies_at_the_done_write(self: AIOKafkaProducer, topic: str, value: Any = None, **kw: Any) -> Any:
        if topic == ledger and value is not None and b'"state":"done"' in value:
            raise Killed()  # a crash (the forged entry's TypeError was one) between send and ledger write
        return await real_send(self, topic, value, **kw)

    monkeypatch.setattr(AIOKafkaProducer, "send", dies_at_the_done_write)
    for _ in range(2):  # the forced replay of the replayed one, and a first replay of the other
        with pytest.raises(Killed):
            await replay(topo, broker.bootstrap, records=[refs[0]], force=True)
    with pytest.raises(Killed):
        await replay(topo, broker.bootstrap, records=[refs[1]])
    monkeypatch.setattr(AIOKafkaProducer, "send", real_send)
    entries = read_ledger(await read_to_end(broker.bootstrap, ledger, 1))
    assert entries[refs[0]].pending and entries[refs[1]].pending
    # sent: the first once, then once more by the first forced run - never by the second (it
    # found the pending send, so it only had the ledger to write, and died doing that); the other once
    out = (await read_all(broker.bootstrap, {src: 2}, expected_total=3, timeout=20))[src]
    assert sorted(r.value == copies[0].value for r in out) == [False, True, True], len(out)

    retry = await replay(topo, broker.bootstrap, force=True)
    by_ref = {f"{o.dlq_partition}@{o.dlq_offset}": o for o in retry.outcomes}
    assert (by_ref[refs[0]].action, by_ref[refs[0]].why) == ("replayed", "recovered")
    assert (by_ref[refs[1]].action, by_ref[refs[1]].why) == ("replayed", "recovered")
    await asyncio.sleep(0)
    out = (await read_all(broker.bootstrap, {src: 2}, expected_total=3, timeout=20))[src]
    assert len(out) == 3  # nothing sent again
    entries = read_ledger(await read_to_end(broker.bootstrap, ledger, 1))
    assert not entries[refs[0]].pending and entries[refs[0]].replays == 2 and entries[refs[0]].forced
    assert not entries[refs[1]].pending and entries[refs[1]].replays == 1
    final = await replay(topo, broker.bootstrap)
    assert final.skipped_by_why() == {"already_replayed": 2}


async def test_a_replay_killed_before_its_send_sends_once_later(broker, tmp_path, dev_keys,  # noqa: F811
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from app.broker.admin import ensure_topics

    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics())
    copies, _ = _dlq_copies(topo, dev_keys, 1)
    (where,) = await _seed(broker.bootstrap, copies, [0])
    real_send = AIOKafkaProducer.send

    async def dies_at_the_source_send(self: AIOKafkaProducer, topic: str, value: Any = None, **kw: Any) -> Any:
        if topic == src:
            raise Killed()
        return await real_send(self, topic, value, **kw)

    monkeypatch.setattr(AIOKafkaProducer, "send", dies_at_the_source_send)
    with pytest.raises(Killed):
        await replay(topo, broker.bootstrap)
    monkeypatch.setattr(AIOKafkaProducer, "send", real_send)
    dry = await replay(topo, broker.bootstrap, dry_run=True)
    assert dry.count("would_replay") == 1 and "interrupted before its send" in dry.outcomes[0].detail
    done = await replay(topo, broker.bootstrap)
    assert done.count("replayed") == 1
    out = (await read_all(broker.bootstrap, {src: 2}, expected_total=1, timeout=20))[src]
    assert [r.value for r in out] == [copies[0].value]
    assert where is not None
