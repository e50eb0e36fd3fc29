"""The console's back ends: the registry's REST API, the workers' management APIs and the
Kafka topics (DLQ, replay ledger, outputs).

Nothing here re-implements what the CLI does: the pipeline status and rates are
``prism status``'s (:func:`app.cli.ops.collect_status`), a DLQ row and a record's decoded,
redacted view are ``prism dlq list|show``'s (:func:`app.cli.ops.dlq_row`,
:func:`app.cli.ops.dlq_show_doc`), and a replay is ``prism dlq replay``'s
(:func:`app.cli.dlq.replay`, ledger included). What this module adds is the glue a browser
needs: which pipeline a DLQ belongs to (asked of the worker that runs it), counts by reason,
and finding a replayed record again on the pipeline's outputs.
"""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console

from app.console.settings import ConsoleSettings
from app.errors import PrismError
from app.topology import Dlq, DlqOverflow, NormalizeStage, Source, StageSpec, Topology


class BackendError(PrismError):
    """A back end did not answer as expected; shown on the page, never as a stack trace."""

    code = "backend_unavailable"


class NotFound(BackendError):
    """What the request names does not exist - a pipeline no worker runs, a source a pipeline
    does not have, a DLQ record or a subject that is not there (404): the page is wrong, not a
    back end (a 502 would send an operator looking for an outage)."""

    code = "not_found"


def _quiet() -> Console:
    """The CLI helpers draw progress bars; in a server they go nowhere."""
    return Console(file=io.StringIO(), stderr=False)


# --------------------------------------------------------------------------- registry


class RegistryClient:
    """The registry's ``/v1`` API with the console's own credentials."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.url = settings.registry_url
        self._client = httpx.AsyncClient(base_url=settings.registry_url or "http://registry.invalid",
                                         headers=dict(settings.registry_headers), timeout=15.0,
                                         verify=settings.registry_ssl or True)

    async def close(self) -> None:
        await self._client.aclose()

    async def get(self, path: str, **params: Any) -> Any:
        if self.url is None:
            raise BackendError("no schema registry configured", hint="start the console with --registry URL")
        try:
            r = await self._client.get(path, params={k: v for k, v in params.items() if v is not None})
        except httpx.HTTPError as exc:
            raise BackendError(f"registry {self.url} unreachable: {type(exc).__name__}",
                               hint="check --registry and that the registry runs") from None
        if r.status_code in (401, 403):
            raise BackendError(f"registry refused the console (HTTP {r.status_code}) for {path}",
                               hint="give the console registry credentials with the read role (admin for the "
                                    "audit log): PRISM_REGISTRY_USER / PRISM_REGISTRY_PASSWORD or PRISM_REGISTRY_TOKEN")
        if r.status_code in (400, 404, 422):  # what the page names is not there (or cannot be)
            raise NotFound(f"registry has no {path}", hint="check the subject name and version")
        if r.status_code >= 400:
            try:
                detail = r.json().get("message", "")
            except ValueError:
                detail = r.text[:200]
            raise BackendError(f"registry answered {r.status_code} for {path}: {detail}")
        return r.json()

    async def subjects(self) -> list[dict[str, Any]]:
        return list(await self.get("/v1/subjects"))

    async def policy(self, name: str) -> dict[str, Any]:
        return dict(await self.get(f"/v1/policies/{_seg(name)}"))


def _seg(value: str) -> str:
    """One path segment (subjects may contain '/': the registry reads it encoded)."""
    from urllib.parse import quote

    return quote(value, safe="")


# --------------------------------------------------------------------------- workers


@dataclass
class Pipeline:
    """One topology as the workers that run it report it."""

    name: str
    workers: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    dlq_reasons: Counter[str] = field(default_factory=Counter)

    @property
    def states(self) -> list[str]:
        return [w["status"]["connector"]["state"] for w in self.workers]

    @property
    def lag(self) -> int:
        """The group's lag (every worker of the group reports the same; the largest is the newest)."""
        return max((w["status"].get("lag") or 0 for w in self.workers), default=0)

    @property
    def dlq_depth(self) -> int | None:
        totals = [w["dlq"].get("total") for w in self.workers if w["dlq"].get("total") is not None]
        return max(totals) if totals else None

    def rate(self, key: str) -> float:
        return round(sum(w["rates_per_s"].get(key, 0.0) for w in self.workers), 1)

    def total(self, key: str) -> float:
        return sum(w["totals"].get(key, 0.0) for w in self.workers)


def dlq_reasons(metrics_text: str) -> Counter[str]:
    """DLQ'd messages by reason since each worker started (``prism_dlq_messages_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Counter[str] = Counter()
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            if s.name == "prism_dlq_messages_total":
                out[s.labels.get("reason", "?")] += int(s.value)
    return out


def _flatten(doc: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """A worker's ``collect_status`` document, or each of a supervisor's children's - and, for
    every child that could not be read, why (shown on the page, never dropped)."""
    if "supervisor" not in doc:
        return [doc], []
    errors = [f"worker {w.get('url') or ('#' + str(w.get('index')))}: {w['error']}"
              for w in doc["workers"] if "error" in w]
    return [w["status"] for w in doc["workers"] if "status" in w], errors


class Workers:
    """The workers' management APIs, through ``prism status``'s reader."""

    def __init__(self, settings: ConsoleSettings) -> None:
        from app.cli.ops import WorkerClient

        self.urls = settings.worker_urls
        self.interval = settings.rate_interval_s
        self.client = WorkerClient(headers=dict(settings.worker_headers), context=settings.worker_ssl)

    def _collect(self, url: str) -> tuple[list[dict[str, Any]], Counter[str], list[str]]:
        from app.cli.ops import _get, collect_status

        docs, errors = _flatten(collect_status(url, self.interval, self.client))
        reasons: Counter[str] = Counter()
        for d in docs:
            reasons += dlq_reasons(_get(d["url"] + "/metrics", client=self.client))
        return docs, reasons, errors

    async def pipelines(self) -> tuple[list[Pipeline], list[str]]:
        """Every pipeline any worker runs (merged by name), and one line per worker that could not
        be read, saying why - ``worker URL: worker refused ... (HTTP 429: ...; locked out for 42 s,
        until ...)``, ``... (HTTP 401)``, ``cannot reach the worker ...`` - so a page never shows an
        empty pipeline list without a word. The workers are asked at once; each takes
        ``rate_interval_s`` (two scrapes)."""
        results = await asyncio.gather(*(asyncio.to_thread(self._collect, u) for u in self.urls),
                                       return_exceptions=True)
        by_name: dict[str, Pipeline] = {}
        errors: list[str] = []
        for url, res in zip(self.urls, results, strict=True):
            if isinstance(res, BaseException):
                why = res.message if isinstance(res, PrismError) else f"{type(res).__name__}: {res}"
                errors.append(f"worker {url}: {why}")
                continue
            docs, reasons, child_errors = res
            errors += child_errors
            for doc in docs:
                for t in doc["topologies"]:
                    p = by_name.setdefault(t["name"], Pipeline(t["name"], info=t["info"]))
                    p.workers.append({"url": doc["url"], "status": t["status"], "dlq": t["dlq"],
                                      "rates_per_s": doc["rates_per_s"], "totals": doc["totals"]})
                    if len(doc["topologies"]) == 1:  # the worker's metrics are this pipeline's
                        p.dlq_reasons += reasons
        return sorted(by_name.values(), key=lambda p: p.name), errors

    async def info(self, name: str) -> dict[str, Any]:
        """``GET /connectors/{name}`` from the first worker that runs it."""
        from app.cli.ops import _get

        last: Exception | None = None
        unknown = 0
        for url in self.urls:
            try:
                return dict(await asyncio.to_thread(_get, f"{url}/connectors/{_seg(name)}", 10.0, self.client))
            except PrismError as exc:
                last = exc
                unknown += getattr(exc, "http_status", None) == 404
        # every worker answered that it runs no such pipeline: the name is wrong, nothing is down
        kind = NotFound if self.urls and unknown == len(self.urls) else BackendError
        raise kind(f"no worker runs pipeline {name!r}" + (f" ({last})" if last else ""),
                   hint="check the --worker URLs and that the pipeline's worker is up")


def replay_topology(info: dict[str, Any]) -> Topology:
    """The part of a topology a DLQ read and a replay use - name, namespace, sources with their
    partitions, DLQ suffix - from the worker's ``GET /connectors/{name}`` (the worker runs it, so
    it is the topology the records came from; the console needs no copy of the file). Replays
    still write only to these sources, never to a topic a DLQ header names (app/cli/dlq.py)."""
    sources = [Source(topic=s["topic"], partitions=int(s["partitions"])) for s in info["sources"]]
    first_dlq, first_src = info["dlq"][0], sources[0].topic
    if not first_dlq.startswith(first_src):
        raise BackendError(f"pipeline {info.get('name')!r}: DLQ {first_dlq!r} is not named after its source")
    # the worker's dlq.overflow store: the one place a replay reads a truncated copy's whole value
    # from (a reference elsewhere is refused, app/worker/dlq_overflow.py); absent from older workers
    overflow = info.get("dlq_overflow")
    # stages: only the one every topology starts with (a replay runs none of them)
    return Topology(name=info["name"], namespace=info["namespace"], sources=sources,
                    stages=[StageSpec(name="normalize", settings=NormalizeStage())],
                    dlq=Dlq(topic_suffix=first_dlq[len(first_src):],
                            overflow=DlqOverflow(path=overflow) if isinstance(overflow, str) else None))


# --------------------------------------------------------------------------- Kafka


class Kafka:
    """DLQ records, replays and outputs, with the console's broker credentials."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.bootstrap = settings.bootstrap
        self.settings = settings.broker_settings
        self.window = settings.trace_window
        self.window_records = settings.dlq_window_records
        self.window_bytes = settings.dlq_window_bytes

    def _need(self) -> str:
        if not self.bootstrap:
            raise BackendError("no Kafka broker configured",
                               hint="start the console with --broker HOST:PORT (or PRISM_BROKER_URL)")
        return self.bootstrap

    async def dlq_window(self, topology: Topology, source: str | None = None,
                         before: dict[int, int] | None = None) -> list[Any]:
        """The newest DLQ records of the pipeline (or of one source), below `before` (a page's
        "older" cursor, with `source`): one `app.cli.dlq.Window` per DLQ topic, each bounded by
        ``dlq_window_records`` offsets and ``dlq_window_bytes`` (shared between the topics), so a
        page view costs the same whatever the DLQ holds."""
        from app.cli.dlq import read_window

        chosen = [s for s in topology.sources if source is None or s.topic == source]
        try:
            return [await read_window(self._need(), s.topic + topology.dlq.topic_suffix, s.partitions,
                                      settings=self.settings, before=before,
                                      max_records=max(1, self.window_records // len(chosen)),
                                      max_bytes=max(1, self.window_bytes // len(chosen)))
                    for s in chosen]
        except (TimeoutError, OSError) as exc:
            raise BackendError(f"cannot read the DLQ: {type(exc).__name__}: {exc}") from None

    async def dlq_record(self, topology: Topology, source: str, partition: int, offset: int) -> Any | None:
        """The DLQ record of `source` at `partition`@`offset` (None: not there), reading that offset
        alone (`prism dlq show`)."""
        from app.cli.dlq import read_record

        src = next(s for s in topology.sources if s.topic == source)
        try:
            return await read_record(self._need(), source + topology.dlq.topic_suffix, src.partitions, partition,
                                     offset, settings=self.settings)
        except (TimeoutError, OSError) as exc:
            raise BackendError(f"cannot read the DLQ: {type(exc).__name__}: {exc}") from None

    async def ledger(self, topology: Topology, warnings: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """``dlq topic -> {PARTITION@OFFSET: ledger entry}``: which records were replayed, by whom.
        Records of a ledger that are not valid entries are skipped; with `warnings`, one line per
        such ledger is added there (`prism dlq replay`'s warning), for the page to show."""
        from dataclasses import asdict

        from app.cli.dlq import ledger_topic, ledger_warning, read_ledger, read_to_end, topic_exists

        out: dict[str, dict[str, Any]] = {}
        for s in topology.sources:
            dlq = s.topic + topology.dlq.topic_suffix
            name = ledger_topic(dlq)
            if not await topic_exists(self._need(), name, settings=self.settings):
                out[dlq] = {}
                continue
            problems: list[str] = []
            entries = read_ledger(await read_to_end(self._need(), name, 1, settings=self.settings), problems)
            if problems and warnings is not None:
                warnings.append(ledger_warning(name, problems))
            out[dlq] = {k: asdict(v) for k, v in entries.items() if not v.pending}
        return out

    async def replay(self, topology: Topology, source: str, ref: str, *, force: bool, by: str) -> Any:
        """Replay one DLQ record (`prism dlq replay --source S --record P@O [--force]`)."""
        from app.cli.dlq import replay

        return await replay(topology, self._need(), settings=self.settings, records=[ref], source=source,
                            force=force, console=_quiet(), by=by)

    async def find_output(self, topic: str, partitions: int, marker: bytes) -> Any | None:
        """The record of output ``topic`` (``partitions``: its source's count, as Prism creates
        it) whose ``prism-source`` header is ``marker`` (``topic/partition/offset`` of the input it
        came from), looked for in the last ``trace_window`` records of each partition; None when
        it is not (yet) there."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from app.cli.dlq import topic_exists
        from app.worker.offsets import true_end_offsets

        if not await topic_exists(self._need(), topic, settings=self.settings):  # never create it by asking
            return None
        # read_committed, as every consumer of an exactly_once pipeline's outputs must read (the
        # trace would otherwise report the record of an aborted, retried batch)
        consumer = AIOKafkaConsumer(bootstrap_servers=self._need(), group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", isolation_level="read_committed",
                                    **(self.settings.aiokafka_kwargs() if self.settings else {}))
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            begin = await consumer.beginning_offsets(tps)
            ends = await true_end_offsets(consumer, tps)
            for tp in tps:
                consumer.seek(tp, max(begin.get(tp, 0), ends.get(tp, 0) - self.window))
            pending = {tp for tp in tps if await consumer.position(tp) < ends.get(tp, 0)}
            deadline = asyncio.get_running_loop().time() + 30
            while pending and asyncio.get_running_loop().time() < deadline:
                batch = await consumer.getmany(*pending, timeout_ms=500, max_records=5000)
                for recs in batch.values():
                    for rec in recs:
                        if any(k == "prism-source" and v == marker for k, v in rec.headers or ()):
                            return rec
                pending = {tp for tp in pending if await consumer.position(tp) < ends[tp]}
            return None
        finally:
            await consumer.stop()
