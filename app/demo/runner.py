"""Run the demo: broker (embedded unless PRISM_BROKER_URL is set) + worker + load, then
reconcile every published message with where it ended up.

Reconciliation is per message, by source offset: an emitted message must appear in the
archive tap (whose `prism-source` header names its input offset), a rejected one in the DLQ
(`prism.errors.offset`) with the expected reason, and expired/duplicate ones nowhere. The
`.v2`/`.v3` counts must both equal the emitted count.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.agents.publish import SOURCE_HEADER
from app.broker.admin import BrokerSettings, ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.cli.output import CliTable as Table  # headers break between words, ids fold
from app.demo.loadgen import MIX, LoadGenerator
from app.security.devkeys import ensure_dev_keys
from app.topology import Topology
from app.worker.faust_app import InProcessWorker, event_loop_name
from app.worker.pipeline import PipelineApp


@dataclass
class DemoReport:
    published: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    actual: dict[str, Counter[str]] = field(default_factory=dict)
    topic_counts: Counter[str] = field(default_factory=Counter)
    emitted_ids: set[str] = field(default_factory=set)  # message ids found in the reviewed output
    mismatches: list[str] = field(default_factory=list)
    worker: dict[str, Any] = field(default_factory=dict)
    lake: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    #: emitted messages whose payload did not match the schema (validation: warn forwards them,
    #: marked with the `prism-schema-validation` header)
    schema_warned: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatches


async def read_all(bootstrap: str, topics: dict[str, int], expected_total: int, timeout: float,
                   settings: BrokerSettings | None = None) -> dict[str, list[Any]]:
    """Read every record of `topics` (until `expected_total` records or quiet for 3 s).

    High watermarks come from fetch responses, not ListOffsets, which the embedded
    broker answers wrongly (docs/platform-notes.md)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False, **(settings.aiokafka_kwargs() if settings else {}))
    await consumer.start()
    out: dict[str, list[Any]] = {t: [] for t in topics}
    try:
        tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline, last_growth, total = time.monotonic() + timeout, time.monotonic(), 0
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=5000)
            n = 0
            for tp, recs in batch.items():
                out[tp.topic].extend(recs)
                n += len(recs)
            total += n
            if n:
                last_growth = time.monotonic()
            elif total >= expected_total or time.monotonic() - last_growth > 3.0:
                break
    finally:
        await consumer.stop()
    return out


def _header(rec: Any, name: str) -> bytes | None:
    for k, v in rec.headers or ():
        if k == name:
            return v
    return None


def _summary_table(report: DemoReport) -> Table:
    t = Table(title=f"Prism demo: {report.published} messages in {report.seconds:.1f}s", show_lines=False)
    t.add_column("input kind")
    t.add_column("sent", justify="right")
    t.add_column("expected")
    t.add_column("actual")
    for kind in MIX:
        sent = report.by_kind[kind]
        if not sent:
            continue
        act = report.actual.get(kind, Counter())
        actual = ", ".join(f"{k} {v}" for k, v in sorted(act.items()))
        ok = act == Counter({MIX[kind][1]: sent})
        t.add_row(kind, str(sent), MIX[kind][1], f"[{'green' if ok else 'red'}]{actual}[/]")
    return t


def _totals_table(report: DemoReport, topology: Topology) -> Table:
    t = Table(title="Where every message went")
    t.add_column("destination")
    t.add_column("messages", justify="right")
    for name, n in sorted(report.topic_counts.items()):
        t.add_row(name, str(n))
    w = report.worker
    t.add_row("dropped as expired (TTL)", str(w.get("expired", 0)))
    t.add_row("deduplicated", str(w.get("duplicate", 0)))
    for reason, n in sorted(w.get("dlq_reasons", {}).items()):
        t.add_row(f"  DLQ reason: {reason}", str(n))
    return t


async def run_demo(topology: Topology, *, messages: int, rate: float, data_dir: Path, keys_dir: Path,
                   console: Console, seed: int = 7, timeout: float = 300.0, lake: bool = False) -> DemoReport:
    keys = ensure_dev_keys(keys_dir)
    # validation: warn logs each payload that does not match the schema; the demo mixes shapes on
    # purpose, so it reports how many were marked instead of printing a line for each
    quiet = _DropSchemaWarnings()
    logging.getLogger("prism.worker").addFilter(quiet)
    try:
        return await _run_demo(topology, keys, messages=messages, rate=rate, data_dir=data_dir, console=console,
                               seed=seed, timeout=timeout, lake=lake)
    finally:
        logging.getLogger("prism.worker").removeFilter(quiet)


class _DropSchemaWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("schema_validation_failed")


async def _run_demo(topology: Topology, keys: Any, *, messages: int, rate: float, data_dir: Path, console: Console,
                    seed: int, timeout: float, lake: bool) -> DemoReport:
    # data_dir is the demo's scratch space: each run starts from an empty archive and table
    # so that the reconciliation compares this run's messages only.
    for old in [data_dir / "archive", data_dir / "lake", *data_dir.glob("worker-*"), data_dir / "broker"]:
        shutil.rmtree(old, ignore_errors=True)
    settings = BrokerSettings.from_env()
    broker: EmbeddedBroker | None = None
    if settings.embedded:
        broker = EmbeddedBroker(log_dir=data_dir / "broker")
        await broker.astart()
        bootstrap = broker.bootstrap
        console.print(f"[dim]embedded Kafka-protocol broker (Tansu) on {bootstrap}[/]")
    else:
        bootstrap = settings.bootstrap
        console.print(f"[dim]using the Kafka cluster at {bootstrap}[/]")
    try:
        report = await _run(topology, keys, bootstrap, broker is not None, settings if broker is None else None,
                            messages=messages, rate=rate, data_dir=data_dir, console=console, seed=seed,
                            timeout=timeout, lake=lake)
    finally:
        if broker is not None:
            broker.stop()
    if lake:
        report.lake = await asyncio.to_thread(_compact, data_dir, console)
        rows, emitted = report.lake["table_rows"], report.worker["emitted"]
        if rows != emitted:
            report.mismatches.append(f"the Delta table holds {rows} rows but {emitted} messages were emitted")
    return report


def _compact(data_dir: Path, console: Console) -> dict[str, Any]:
    """Archive -> Delta with local Spark: the lakehouse half of the main job."""
    from app.lake.compact import compact
    from app.lake.maintenance import stats
    from app.lake.spark import get_spark

    console.print("[dim]compacting the archive into Delta Lake with local Spark ...[/]")
    t0 = time.monotonic()
    spark = get_spark(app_name="prism-demo")
    table = str(data_dir / "lake" / "envelopes")
    summary = compact(spark, str(data_dir / "archive"), table)
    st = stats(table)
    return {"table": table, "table_rows": st.rows, "files": st.files, "partitions": st.partitions,
            "version": st.version, "writer": summary.writer, "rows_written": summary.total("rows_written"),
            "duplicates_dropped": summary.total("duplicates"), "seconds": round(time.monotonic() - t0, 1)}


async def _run(topology: Topology, keys: Any, bootstrap: str, embedded: bool, settings: BrokerSettings | None, *,
               messages: int, rate: float, data_dir: Path, console: Console, seed: int,
               timeout: float, lake: bool = False) -> DemoReport:
    # source topics with their short retention, as `prism topics create` makes them (they hold tokens)
    await ensure_topics(bootstrap, topology.topics(), settings=settings, configs=topology.topic_configs())
    source = topology.sources[0].topic
    run_id = uuid.uuid4().hex[:8]
    pipeline = PipelineApp(topology, bootstrap=bootstrap, data_dir=data_dir / f"worker-{run_id}",
                           app_id=f"prism-demo-{run_id}", embedded=embedded, broker_settings=settings,
                           archive_location=data_dir / "archive" if lake else None)
    gen = LoadGenerator(keys, topic=source, namespace=topology.namespace, seed=seed)
    report = DemoReport()
    expected_at: dict[tuple[int, int], tuple[str, str]] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=256 * 1024,
                                **(settings.aiokafka_kwargs() if settings else {}))
    await producer.start()
    t0 = time.monotonic()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    sent_task = progress.add_task("published", total=messages)
    done_task = progress.add_task("processed", total=messages)
    try:
        async with InProcessWorker(pipeline.app):
            with Live(progress, console=console, refresh_per_second=8, transient=False):
                pending: list[tuple[Any, str, str]] = []
                for i in range(messages):
                    s = gen.next()
                    fut = await producer.send(source, s.value, key=s.key, headers=s.headers)
                    pending.append((fut, s.kind, s.expect))
                    report.by_kind[s.kind] += 1
                    if len(pending) >= 500 or i == messages - 1:
                        for f, kind, expect in pending:
                            md = await f
                            expected_at[(md.partition, md.offset)] = (kind, expect)
                        pending.clear()
                        progress.update(sent_task, completed=i + 1)
                        progress.update(done_task, completed=pipeline.stats.read)
                        if rate > 0:
                            await asyncio.sleep(max(0.0, (i + 1) / rate - (time.monotonic() - t0)))
                report.published = messages
                deadline = time.monotonic() + timeout
                while pipeline.stats.read < messages and time.monotonic() < deadline:
                    progress.update(done_task, completed=pipeline.stats.read)
                    await asyncio.sleep(0.1)
                progress.update(done_task, completed=pipeline.stats.read)
            report.seconds = time.monotonic() - t0
            report.worker = pipeline.summary()
            report.worker["event_loop"] = event_loop_name()  # uvloop under `prism demo` (use_uvloop first)
    finally:
        await producer.stop()

    outputs = [f"{source}.{x}" for x in topology.outputs.layouts]
    dlq = source + topology.dlq.topic_suffix
    all_topics = topology.topics()
    extra = [topology.archive.topic] if topology.archive.enabled and topology.archive.topic else []
    read_topics = {t: all_topics[t] for t in [*outputs, dlq, *extra]}
    w = report.worker
    records = await read_all(bootstrap, read_topics, expected_total=w["emitted"] * (len(outputs) + len(extra)) +
                             w["dlq"], timeout=60, settings=settings)
    for name, recs in records.items():
        report.topic_counts[name] = len(recs)
    _reconcile(report, expected_at, records, topology, source)
    return report


def _reconcile(report: DemoReport, expected_at: dict[tuple[int, int], tuple[str, str]],
               records: dict[str, list[Any]], topology: Topology, source: str) -> None:
    where: dict[tuple[int, int], str] = {}
    for rec in records[f"{source}.{topology.outputs.layouts[-1]}"]:
        report.emitted_ids.add((_header(rec, "prism-message-id") or b"").decode())
        if (_header(rec, "prism-schema-validation") or b"").startswith(b"failed"):
            report.schema_warned += 1
        src = (_header(rec, SOURCE_HEADER) or b"").decode()
        topic, part, off = src.rsplit("/", 2)
        if topic == source:
            where[(int(part), int(off))] = "emitted"
    for rec in records[source + topology.dlq.topic_suffix]:
        part = int((_header(rec, "prism.errors.partition") or b"-1").decode())
        off = int((_header(rec, "prism.errors.offset") or b"-1").decode())
        reason = (_header(rec, "prism.errors.reason") or b"?").decode()
        if (part, off) in where:
            report.mismatches.append(f"offset {part}/{off} is both emitted and in the DLQ")
        where[(part, off)] = f"dlq:{reason}"
    for pos, (kind, expect) in expected_at.items():
        actual = where.get(pos)
        if actual is None:
            actual = expect if expect in ("expired", "duplicate") else "missing"
        report.actual.setdefault(kind, Counter())[actual] += 1
        if actual != expect:
            report.mismatches.append(f"{kind} at {pos[0]}/{pos[1]}: expected {expect}, got {actual}")
    w = report.worker
    silent = report.published - (w["emitted"] + w["dlq"] + w["expired"] + w["duplicate"])
    if silent:
        report.mismatches.append(f"{silent} message(s) not accounted for by the worker")
    for out in topology.outputs.layouts:
        n = report.topic_counts[f"{source}.{out}"]
        if n != w["emitted"]:
            report.mismatches.append(f"{source}.{out} holds {n} records but {w['emitted']} were emitted")
    dropped_expected = sum(1 for _, e in expected_at.values() if e in ("expired", "duplicate"))
    if w["expired"] + w["duplicate"] != dropped_expected:
        report.mismatches.append(f"worker dropped {w['expired'] + w['duplicate']} as expired/duplicate, "
                                 f"{dropped_expected} expected")


def print_report(report: DemoReport, topology: Topology, console: Console) -> None:
    console.print(_summary_table(report))
    console.print(_totals_table(report, topology))
    if report.lake:
        lk = report.lake
        console.print(f"Delta table {lk['table']}: {lk['table_rows']} rows in {lk['files']} files, "
                      f"{lk['partitions']} partitions, version {lk['version']} ({lk['writer']} writer, {lk['seconds']}s)")
    w = report.worker
    if report.schema_warned:
        mode = topology.validation
        console.print(f"schema validation ({mode}): {report.schema_warned} emitted payload(s) did not match the "
                      "schema and were forwarded with the header prism-schema-validation: failed (the demo sends raw "
                      "bytes and LNMP on purpose; `validation: strict` would send them to the DLQ)", soft_wrap=True)
    console.print(f"published {report.published} = emitted {w['emitted']} + DLQ {w['dlq']} + expired "
                  f"{w['expired']} + deduplicated {w['duplicate']}")
    if report.ok:
        console.print("[bold green]every published message is accounted for[/]")
    else:
        console.print(f"[bold red]{len(report.mismatches)} mismatch(es):[/]")
        for m in report.mismatches[:20]:
            console.print(f"  {m}")
    print_next_steps(topology, console)


def print_next_steps(topology: Topology, console: Console) -> None:
    """The demo's closing "what next": from the demo's private, throwaway broker and keys to a
    worker whose DLQ outlives it - the order that makes "fix, restart the worker, replay" work."""
    from rich.markup import escape

    from app.broker.local import find_running
    from app.security.devkeys import display_path

    guess = topology.base_dir / f"{topology.name}.yaml"  # the shipped topologies are named after themselves
    src = escape(str(display_path(guess))) if guess.exists() else "TOPOLOGY.yaml"
    running = find_running()
    broker = (f"prism broker status                   # {escape(running.describe())}: running" if running is not None
              else "prism broker start                    # a local broker on 127.0.0.1:9092 that outlives workers")
    console.print("[bold]what next[/] (the demo's broker and topics are gone; its keys were throwaway):")
    from app.security.devkeys import is_throwaway, topology_key_files

    files = topology_key_files(topology).values()
    demo_keys = bool(files) and all(f.exists() and is_throwaway(f.parent) for f in files)
    keys = ("prism keys init                       # replaces the demo's throwaway keys: the set your workers share"
            if demo_keys else "prism keys init                       # the key set your workers share (once)")
    for line in (keys,
                 broker,
                 f"prism run -t {src} --web-port 6066   # the worker, on that broker",
                 "prism status                          # lag, rates, DLQ depth (the worker's --web-port)",
                 "prism dlq list                        # why records failed; fix, restart the worker, then",
                 "prism dlq replay                      # each DLQ record back to its source, once"):
        console.print(f"  {line}", highlight=False, soft_wrap=True)  # commands are copied: never wrapped
