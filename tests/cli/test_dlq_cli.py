"""`prism dlq list|show|replay` and `prism status` as an operator meets them: the real CLI in its
own process (stdout a pipe, so rich lays out for 80 columns), on a DLQ topic of the embedded
broker seeded with DLQ copies built by the worker's own DLQ writer.

What is held: selectors are checked with one clear error line before any broker is contacted;
no command prints rich markup literally (`[bold red]error[/]` was printed by `status` and `dlq`);
`dlq list` fits 80 columns and wraps the whole error with its fix hint; `dlq show` decodes the
envelope (token redacted), `--json` is one JSON document and `--export FILE` writes bytes that
`prism envelope inspect FILE` reads. The replay itself - ledger, selection, routing, refusing
records whose headers claim another topic - is held by `test_replay_ledger_selection_and_routing`
here and, with a worker, by tests/worker/test_dlq_replay_e2e.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from app.agents.base import Message
from app.agents.dlq import VALUE_TRUNCATED, build_dlq_record
from app.cli.dlq import (
    BadSelector,
    Selection,
    check_reason,
    ledger_topic,
    parse_selection,
    read_to_end,
    replay,
    topic_exists,
)
from app.demo.runner import read_all
from app.envelope import encode, new_envelope
from app.errors import NamespaceNotAllowedError
from app.topology import Topology
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - fixtures (broker: tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
#: long enough that the old `dlq list` cut it (at 120 characters of the error)
FIX_HINT = ("bind the principal 'svc-orders' to namespace 'billing' under `producers:` in the topology, or have "
            "the producer claim one of its own namespaces ('order-events')")


def prism(*args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """The real `prism` CLI; `env` values of None remove the variable."""
    full = {**os.environ, "COLUMNS": "80"}
    for k, v in (env or {}).items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env=full)


def assert_no_markup(text: str) -> None:
    assert "[/" not in text and "[bold" not in text and "[red" not in text, text


def assert_clean_error(res: subprocess.CompletedProcess[str], code: str, *fragments: str) -> None:
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    assert f"error [{code}] " in res.stderr, out
    assert "; fix: " in res.stderr, out
    assert_no_markup(out)
    for f in fragments:
        assert f in out, out


# --------------------------------------------------------------------------- selectors


def test_selection_parses_records_and_ranges() -> None:
    sel = parse_selection(["0@5", " 1@0 "], ["1@10-20", "0@7-7"], 2, "t.dlq")
    assert sel == Selection(frozenset({(0, 5), (1, 0)}), ((1, 10, 20), (0, 7, 7)))
    assert sel.matches(0, 5) and sel.matches(1, 10) and sel.matches(1, 20) and sel.matches(0, 7)
    assert not sel.matches(1, 21) and not sel.matches(0, 6) and not sel.matches(1, 5)
    assert parse_selection([], [], 2, "t.dlq").everything


@pytest.mark.parametrize(
    ("records", "ranges", "fragment"),
    [
        (["0-5"], [], "'0-5' is not PARTITION@OFFSET"),
        (["@5"], [], "is not PARTITION@OFFSET"),
        (["a@1"], [], "is not PARTITION@OFFSET"),
        (["-1@1"], [], "is not PARTITION@OFFSET"),
        (["2@1"], [], "has partitions 0..1, not 2"),
        (["0@99999999999999999999"], [], "is not PARTITION@OFFSET"),
        (["0@9999999999999999999"], [], "larger than Kafka's largest"),
        ([], ["0@5"], "is not PARTITION@FIRST-LAST"),
        ([], ["0@9-3"], "ends before it starts"),
        ([], ["5@1-3"], "not 5"),
    ],
)
def test_bad_selectors_are_refused(records: list[str], ranges: list[str], fragment: str) -> None:
    with pytest.raises(BadSelector) as e:
        parse_selection(records, ranges, 2, "t.dlq")
    assert fragment in str(e.value) and e.value.hint and e.value.path in ("--record", "--range")


def test_bad_selectors_through_the_cli(tmp_path: Path, dev_keys) -> None:  # noqa: F811
    """One error line each, exit 2, before any broker is contacted (the address is unreachable)."""
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    t = str(tmp_path / "topology.yaml")
    env = {"PRISM_BROKER_URL": "127.0.0.1:1"}
    assert_clean_error(prism("dlq", "replay", "-t", t, "--record", "0:5", env=env), "bad_selector",
                       "--record '0:5' is not PARTITION@OFFSET (at --record)", "0@42")
    assert_clean_error(prism("dlq", "replay", "-t", t, "--range", "1@9-3", env=env), "bad_selector",
                       "ends before it starts", "1@3-9")
    assert_clean_error(prism("dlq", "replay", "-t", t, "--record", "4@1", env=env), "bad_selector",
                       f"{topo.sources[0].topic}.dlq has partitions 0..1, not 4")
    assert_clean_error(prism("dlq", "replay", "-t", t, "--source", "payments.created", env=env), "bad_selector",
                       "'payments.created' is not a source", topo.sources[0].topic)
    assert_clean_error(prism("dlq", "show", "zero", "-t", t, env=env), "bad_selector",
                       "RECORD 'zero' is not PARTITION@OFFSET (at RECORD)")


def test_errors_are_one_line_without_markup(tmp_path: Path, dev_keys) -> None:  # noqa: F811
    """The class of bug: `prism status` and `prism dlq` printed `[bold red]error[/]` literally."""
    make_topology(tmp_path, dev_keys, partitions=2)
    t = str(tmp_path / "topology.yaml")
    # its own code (it was the generic prism_error), the URL it tried and where the URL comes from
    assert_clean_error(prism("status", "--url", "http://127.0.0.1:1", "--interval", "0.1"), "worker_unreachable",
                       "cannot reach the worker at http://127.0.0.1:1/", "is the worker running?", "--url",
                       "PRISM_WORKER_URL")
    assert_clean_error(prism("status", "--interval", "0.1", env={"PRISM_WORKER_URL": "http://127.0.0.1:2"}),
                       "worker_unreachable", "http://127.0.0.1:2/")
    no_broker = {"PRISM_BROKER_URL": None}
    for args in (("dlq", "list", "-t", t), ("dlq", "show", "0@1", "-t", t), ("dlq", "replay", "-t", t)):
        # its own code (it was the generic prism_error): a script can tell "start a broker" apart
        assert_clean_error(prism(*args, env=no_broker), "no_broker", "no broker configured", "PRISM_BROKER_URL")
    assert_clean_error(prism("dlq", "list", "-t", str(tmp_path / "missing.yaml")), "bad_config", "missing.yaml")
    assert_clean_error(prism("status", "--cafile", str(tmp_path / "none.pem")), "bad_config", "cannot load CA file")


# --------------------------------------------------------------------------- on a broker


def _dlq_copies(topo: Topology, keys: Any, n: int) -> tuple[list[Any], list[str]]:
    """`n` DLQ copies as the worker writes them (app.agents.dlq.build_dlq_record): envelopes whose
    token claimed a namespace its principal may not, every other one keyless. Record i was read
    from source partition i % 2 at offset 100 + i. Returns (copies, the tokens)."""
    src = topo.sources[0].topic
    out, tokens = [], []
    for i in range(n):
        token = keys.mint_token(f"svc-{i}")
        tokens.append(token)
        env = new_envelope(src, {"order_id": i, "note": "[bold]not markup[/]"}, namespace="billing",
                           message_id=f"m-{i}")
        env.ensure_security().auth_token = token
        msg = Message(topic=src, partition=i % 2, offset=100 + i, value=encode(env),
                      key=None if i % 2 else f"order-{i}".encode(),
                      headers=[("Authorization", f"Bearer {token}".encode()), ("trace", f"t-{i}".encode())],
                      timestamp_ms=1_700_000_000_000 + i, secrets=[token.encode()])
        err = NamespaceNotAllowedError(f"token of 'svc-{i}' may not claim namespace 'billing'",
                                       path="metadata.namespace", hint=FIX_HINT)
        out.append(build_dlq_record(msg, stage="authenticate", stage_class="Authenticate", error=err,
                                    dlq_topic=src + ".dlq"))
    return out, tokens


async def _seed(bootstrap: str, records: list[Any], partitions: list[int]) -> list[tuple[int, int]]:
    """Write DLQ copies to their DLQ topic, copy i to DLQ partition `partitions[i]` - on purpose not
    the source partition its headers name. Returns each copy's DLQ (partition, offset)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        where = []
        for rec, part in zip(records, partitions, strict=True):
            meta = await producer.send_and_wait(rec.topic, rec.value, key=rec.key, headers=rec.headers,
                                                partition=part, timestamp_ms=rec.timestamp_ms)
            where.append((meta.partition, meta.offset))
        return where
    finally:
        await producer.stop()


async def _cli(*args: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(prism, *args, env={"PRISM_BROKER_URL": bootstrap})


async def test_dlq_list_show_and_export(broker, tmp_path: Path, dev_keys) -> None:  # noqa: F811
    from app.broker.admin import ensure_topics

    topo = make_topology(tmp_path, dev_keys, partitions=2)
    await ensure_topics(broker.bootstrap, topo.topics())
    copies, tokens = _dlq_copies(topo, dev_keys, 3)
    where = await _seed(broker.bootstrap, copies, [1, 1, 0])
    t = str(tmp_path / "topology.yaml")

    res = await _cli("dlq", "list", "-t", t, bootstrap=broker.bootstrap)
    assert res.returncode == 0, res.stderr
    assert_no_markup(res.stdout)
    lines = res.stdout.splitlines()
    assert "3 DLQ record(s)" in res.stdout and max(len(line) for line in lines) <= 80, res.stdout
    # the error column (the last) holds the whole message with its fix hint, wrapped, not cut
    column = "".join(line.split("│")[-2] for line in lines if line.count("│") >= 4)
    squeeze = "".join
    assert squeeze(FIX_HINT.split()) in squeeze(column.split()), res.stdout
    assert column.count("fix:") == 3
    assert not any(tok in res.stdout for tok in tokens)

    ref = f"{where[0][0]}@{where[0][1]}"
    res = await _cli("dlq", "show", ref, "-t", t, bootstrap=broker.bootstrap)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert_no_markup(out.replace("[bold]not markup[/]", ""))  # the payload's own text is data
    assert "namespace_not_allowed at stage authenticate" in out and FIX_HINT in out
    assert '"layout": "reviewed"' in out and '"message_id": "m-0"' in out and '"order_id": 0' in out
    assert '"auth_token": "<redacted>"' in out and "Authorization: <redacted>" in out
    assert "\ufffd" not in out and not any(tok in out for tok in tokens)

    res = await _cli("dlq", "show", ref, "-t", t, "--json", "--export", str(tmp_path / "v.bin"),
                     bootstrap=broker.bootstrap)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # the whole of stdout is one JSON document
    assert (doc["dlq_partition"], doc["dlq_offset"], doc["reason"]) == (*where[0], "namespace_not_allowed")
    assert doc["value"]["kind"] == "envelope" and doc["value"]["envelope"]["security"]["auth_token"] == "<redacted>"
    assert doc["key"] == "order-0" and doc["headers"]["prism.errors.partition"] == "0"
    assert doc["value_bytes"] == len(copies[0].value) and doc["exported_to"] == str(tmp_path / "v.bin")
    assert (tmp_path / "v.bin").read_bytes() == copies[0].value
    res = await asyncio.to_thread(prism, "envelope", "inspect", str(tmp_path / "v.bin"), "--payload")
    assert res.returncode == 0, res.stderr
    inspected = json.loads(res.stdout)
    assert inspected["metadata"]["message_id"] == "m-0" and inspected["payload"]["json"]["order_id"] == 0
    assert inspected == doc["value"]["envelope"]  # one view of one record

    res = await _cli("dlq", "show", ref, "-t", t, "--export", str(tmp_path / "w.bin"), bootstrap=broker.bootstrap)
    assert res.returncode == 0 and "prism envelope inspect" in res.stdout and (tmp_path / "w.bin").exists()
    res = await _cli("dlq", "show", "0@999", "-t", t, bootstrap=broker.bootstrap)
    assert_clean_error(res, "prism_error", "no record at 0@999")

    res = await _cli("dlq", "replay", "-t", t, "--dry-run", bootstrap=broker.bootstrap)
    assert res.returncode == 0, res.stderr
    assert_no_markup(res.stdout + res.stderr)
    assert "would replay 3 record(s)" in res.stdout
    assert not await topic_exists(broker.bootstrap, ledger_topic(topo.sources[0].topic + ".dlq"))  # wrote nothing


async def test_replay_ledger_selection_and_routing(broker, tmp_path: Path, dev_keys) -> None:  # noqa: F811
    """Each record goes back to the partition its headers name with its key; the ledger makes a
    repeat a no-op unless forced; `--record` and `--range` select; and records whose headers
    claim another topic, a partition the source lacks, or that were cut, are never replayed."""
    from dataclasses import replace

    from app.broker.admin import ensure_topics

    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics())
    good, _ = _dlq_copies(topo, dev_keys, 6)

    def forge(rec: Any, **headers: bytes) -> Any:
        names = {"prism.errors." + k.replace("_", "."): v for k, v in headers.items()}
        return replace(rec, headers=[(k, names.get(k, v)) for k, v in rec.headers])

    victim = f"payments.created.{src.rsplit('.', 1)[-1]}"
    bad = [forge(good[0], topic=victim.encode()),  # an attacker with DLQ write access aims at another topic
           forge(good[1], partition=b"7"),  # a partition the source does not have
           forge(good[2], partition=b"-1"),
           replace(good[3], headers=[*good[3].headers, (VALUE_TRUNCATED, b"true")])]  # cut to fit the DLQ
    where = await _seed(broker.bootstrap, good + bad, [(i + 1) % 2 for i in range(len(good) + len(bad))])
    refs = [f"{p}@{o}" for p, o in where]

    async def run(**kw: Any) -> Any:
        return await replay(topo, broker.bootstrap, **kw)

    first = await run(records=[refs[0]])
    assert [(o.action, o.dlq_partition, o.dlq_offset) for o in first.outcomes] == [("replayed", *where[0])]
    assert first.outcomes[0].target_partition == 0  # from the header; it sat on DLQ partition 1
    part, lo = where[0]
    in_range = [i for i, w in enumerate(where[:6]) if w[0] == part]
    second = await run(ranges=[f"{part}@{lo}-{where[in_range[-1]][1]}"])
    assert second.skipped_by_why() == {"already_replayed": 1}
    assert second.count("replayed") == len(in_range) - 1
    rest = await run()
    assert rest.count("replayed") == 6 - len(in_range)
    assert rest.skipped_by_why() == {"already_replayed": len(in_range), "foreign_source": 1,
                                     "bad_coordinates": 2, "truncated": 1}
    foreign = next(o for o in rest.outcomes if o.why == "foreign_source")
    assert victim in foreign.detail and "never replayed" in foreign.detail
    again = await run()
    assert again.count("replayed") == 0 and again.skipped_by_why()["already_replayed"] == 6
    dry = await run(dry_run=True, force=True)
    assert dry.count("would_replay") == 6 and dry.count("replayed") == 0
    forced = await run(records=[refs[1]], force=True)
    (o,) = forced.outcomes
    assert (o.action, o.why, o.replays_before) == ("replayed", "forced", 1) and "--force" in o.detail

    # what the source topic holds: each good record once (the forced one twice), on the partition
    # it was read from, with its key, without the DLQ context headers; nothing reached `victim`
    out = (await read_all(broker.bootstrap, {src: 2}, expected_total=7, timeout=20))[src]
    assert len(out) == 7
    seen: dict[bytes, list[Any]] = {}
    for r in out:
        seen.setdefault(r.value, []).append(r)
    for i, rec in enumerate(good):
        copies = seen[rec.value]
        assert len(copies) == (2 if i == 1 else 1)
        for c in copies:
            assert c.partition == i % 2 and c.key == rec.key and c.timestamp == rec.timestamp_ms
            assert not any(k.startswith("prism.errors.") for k, _ in c.headers)
            assert dict(c.headers)["Authorization"] == dict(rec.headers)["Authorization"]  # masked, as in the DLQ
    assert not await topic_exists(broker.bootstrap, victim)

    # the ledger: compacted-topic entries keyed by DLQ PARTITION@OFFSET, the forced one counted twice
    ledger = await read_to_end(broker.bootstrap, ledger_topic(src + ".dlq"), 1)
    latest = {r.key.decode(): json.loads(r.value) for r in ledger}
    assert set(latest) == set(refs[:6])
    entry = latest[refs[1]]
    assert (entry["replays"], entry["forced"], entry["source_partition"], entry["source_offset"]) == (2, True, 1, 101)
    assert entry["dlq_topic"] == src + ".dlq" and len(entry["value_sha256"]) == 64 and "@" in entry["by"]


async def test_a_reason_no_record_has_is_an_error_listing_the_reasons_there_are(broker, tmp_path: Path,
                                                                                 dev_keys) -> None:  # noqa: F811
    """`prism dlq replay --reason typo` said "would replay 0" and exited 0; now one error line
    naming the reasons the DLQ does hold - or that it holds nothing - and nothing is written."""
    from app.broker.admin import ensure_topics

    topo = make_topology(tmp_path, dev_keys, partitions=2)
    t = str(tmp_path / "topology.yaml")
    dlq = topo.sources[0].topic + ".dlq"
    await ensure_topics(broker.bootstrap, topo.topics())
    res = await _cli("dlq", "replay", "-t", t, "--reason", "typo", "--dry-run", bootstrap=broker.bootstrap)
    assert_clean_error(res, "bad_selector", "no DLQ record has reason 'typo'", f"{dlq} has no records")
    res = await _cli("dlq", "list", "-t", t, "--reason", "typo", bootstrap=broker.bootstrap)
    assert_clean_error(res, "bad_selector", "no DLQ record has reason 'typo'", f"{dlq} has no records")
    copies, _ = _dlq_copies(topo, dev_keys, 2)
    await _seed(broker.bootstrap, copies, [0, 1])
    for cmd in (("replay", "--dry-run"), ("replay",), ("list",), ("list", "--json"), ("list", "--since", "1m")):
        res = await _cli("dlq", *cmd, "-t", t, "--reason", "typo", bootstrap=broker.bootstrap)
        assert_clean_error(res, "bad_selector", "no DLQ record has reason 'typo'",
                           f"the reasons in {dlq} are 'namespace_not_allowed' (2)")
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not await topic_exists(broker.bootstrap, ledger_topic(dlq))  # nothing was replayed or recorded
    res = await _cli("dlq", "replay", "-t", t, "--reason", "namespace_not_allowed", "--dry-run",
                     bootstrap=broker.bootstrap)
    assert res.returncode == 0 and "2" in res.stdout, res.stdout + res.stderr
    # a reason the DLQ holds, with --since excluding every record: an empty list is the answer
    res = await _cli("dlq", "list", "-t", t, "--reason", "namespace_not_allowed", "--since", "1m", "--json",
                     bootstrap=broker.bootstrap)
    assert res.returncode == 0 and json.loads(res.stdout) == [], res.stdout + res.stderr


def test_the_reason_check_is_shared_and_names_the_reasons_there_are() -> None:
    """One check for `dlq list` and `dlq replay`: quiet for a reason some record has or no
    --reason; otherwise the reasons there are, most frequent first, or that there are none."""
    check_reason(None, {}, ["a.dlq"])
    check_reason("x", {"x": 1}, ["a.dlq"])
    with pytest.raises(BadSelector, match=r"the reasons in a.dlq, b.dlq are 'y' \(3\), 'x' \(1\)"):
        check_reason("typo", {"x": 1, "y": 3}, ["a.dlq", "b.dlq"])
    with pytest.raises(BadSelector, match=r"a\.dlq has no records"):
        check_reason("typo", {}, ["a.dlq"])


async def test_the_dlq_is_read_committed(kafka) -> None:  # Apache Kafka (tests/kafka/fixtures.py)
    """An exactly_once worker writes DLQ records inside its batch's transaction; a batch cut
    short is aborted and done again. Read uncommitted, `prism dlq list`/`replay` and the
    console's DLQ pages saw the aborted copy next to the committed one (a replay put the record
    back twice). Now only committed records are read - and without transactions, all of them."""
    import uuid

    topic = kafka.create_topic(f"orders-{uuid.uuid4().hex[:8]}.dlq")
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=f"tx-{uuid.uuid4().hex}")
    plain = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    await producer.start()
    await plain.start()
    try:
        for value, commit in ((b"aborted copy", False), (b"committed copy", True)):
            await producer.begin_transaction()
            await producer.send_and_wait(topic, value, partition=0)
            await (producer.commit_transaction() if commit else producer.abort_transaction())
        await plain.send_and_wait(topic, b"written without a transaction", partition=0)
    finally:
        await producer.stop()
        await plain.stop()
    records = await read_to_end(kafka.bootstrap, topic, 1)
    assert [r.value for r in records] == [b"committed copy", b"written without a transaction"]


async def test_replay_refuses_a_forged_value_ref_from_before_the_header_fix(broker, tmp_path: Path,
                                                                           dev_keys) -> None:  # noqa: F811
    """A DLQ record written before the worker dropped producers' `prism.errors.*` headers may name
    any file in `prism.errors.value.ref`; `prism dlq replay` read it and - its forged digest
    matching - put the file's bytes on the source topic. Now each forged reference (another
    file, `..`, a link in the store, no store configured) is skipped as `ref_refused` with its
    fix, never opened; the genuine one is replayed whole."""
    import hashlib
    from dataclasses import replace as replaced

    import yaml

    from app.agents.dlq import VALUE_REF, fit_dlq_record
    from app.broker.admin import ensure_topics
    from app.worker.dlq_overflow import build_overflow

    topo = make_topology(tmp_path, dev_keys, partitions=1, dlq={"overflow": {"path": f"file://{tmp_path}/overflow"}})
    src = topo.sources[0].topic
    await ensure_topics(broker.bootstrap, topo.topics())
    store = build_overflow(topo)
    assert store is not None
    whole = b'{"order_id": "genuine", "pad": "' + b"x" * (20 * 1024) + b'"}'
    secret = b'{"order_id": "secret", "pad": "' + b"s" * (20 * 1024) + b'"}'
    digest = hashlib.sha256(secret).hexdigest()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / digest).write_bytes(secret)  # what a forger wants replayed (its digest matches)

    def copy(value: bytes, offset: int) -> Any:
        msg = Message(topic=src, partition=0, offset=offset, value=value, key=b"k", headers=[], timestamp_ms=1)
        from app.errors import SizeLimitError

        rec = build_dlq_record(msg, stage="normalize", stage_class="Normalize",
                               error=SizeLimitError("too big", path="value"), dlq_topic=src + ".dlq")
        return fit_dlq_record(rec, 8 * 1024, store.put)

    def forged(offset: int, ref: str) -> Any:
        rec = copy(secret, offset)
        return replaced(rec, headers=[(k, ref.encode() if k == VALUE_REF else v) for k, v in rec.headers])

    link = Path(store.store.root) / store.rel(digest)
    records = [copy(whole, 0),
               forged(1, f"file://{tmp_path}/outside/{digest}"),
               forged(2, f"{store.base}/sha256/../../outside/{digest}"),
               forged(3, store.ref(digest))]  # the store's own name for it - a link to outside
    link.unlink()
    link.symlink_to(tmp_path / "outside" / digest)
    await _seed(broker.bootstrap, records, [0] * len(records))
    t = str(tmp_path / "topology.yaml")

    res = await _cli("dlq", "replay", "-t", t, "--json", bootstrap=broker.bootstrap)
    assert res.returncode == 0, res.stderr
    by_offset = {o["dlq_offset"]: o for o in json.loads(res.stdout)["records"]}
    assert by_offset[0]["action"] == "replayed" and "SHA-256 verified" in by_offset[0]["detail"]
    for off in (1, 2):
        assert (by_offset[off]["action"], by_offset[off]["why"]) == ("skipped", "ref_refused"), by_offset[off]
        assert "is not a file of the dlq.overflow store" in by_offset[off]["detail"]
        assert "fix: if the record is genuine, move the file into the store" in by_offset[off]["detail"]
    assert by_offset[3]["why"] == "ref_refused" and "is a symbolic link" in by_offset[3]["detail"]
    out = (await read_all(broker.bootstrap, {src: 1}, expected_total=1, timeout=20))[src]
    assert [r.value for r in out] == [whole]  # never the file a reference named

    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    del doc["dlq"]["overflow"]
    (tmp_path / "no-store.yaml").write_text(yaml.safe_dump(doc))
    res = await _cli("dlq", "replay", "-t", str(tmp_path / "no-store.yaml"), "--dry-run", "--force",
                     bootstrap=broker.bootstrap)
    assert res.returncode == 0, res.stderr
    assert "ref_refused: reference" in res.stdout and "no dlq.overflow store is configured" in res.stdout
    assert "set dlq.overflow.path in the topology" in res.stdout and "skipped 4: ref_refused 4" in res.stdout
