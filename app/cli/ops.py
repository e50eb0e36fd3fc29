"""Operator commands: `prism status` (from a worker's management API and /metrics) and
`prism dlq list|show` (read the DLQ topics through PRISM_BROKER_URL).

Mount with `register(app, dlq_app)` from app/cli/main.py. Everything has `--json` for scripts;
tables and progress bars (rich) for people.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from app.errors import ConfigError, PrismError

DEFAULT_URL = "http://127.0.0.1:6066"
DEFAULT_TOPOLOGY = Path("topologies/orders-created.yaml")
console = Console()


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class WorkerClient:
    """How `prism status` talks to a worker: credentials and, for HTTPS, whom to trust."""

    headers: Mapping[str, str] = field(default_factory=dict)
    context: ssl.SSLContext | None = None


class WorkerRefused(PrismError):
    """The worker (or supervisor) answered 401, 403 or 429: credentials, not the address."""

    code = "worker_refused"


def _get(url: str, timeout: float = 10.0, client: WorkerClient | None = None) -> Any:
    client = client or WorkerClient()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(client.headers)), timeout=timeout,
                                    context=client.context) as r:
            body = r.read()
            return json.loads(body) if "json" in r.headers.get("Content-Type", "") else body.decode()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise WorkerRefused(f"worker refused {url} (HTTP {exc.code})",
                                hint="pass --user/--password or --token (PRISM_ADMIN_USER / PRISM_ADMIN_PASSWORD / "
                                     "PRISM_ADMIN_TOKEN) for a user with the read role") from None
        if exc.code == 429:
            raise WorkerRefused(f"worker refused {url} (HTTP 429: too many failed authentication attempts)",
                                hint=f"wait {exc.headers.get('Retry-After', 'a minute')} s, then retry with the right "
                                     "credentials") from None
        raise PrismError(f"worker answered {exc.code} for {url}",
                         hint="check the topology name and that the worker is running") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PrismError(f"cannot reach the worker at {url}: {getattr(exc, 'reason', exc)}",
                         hint="start it with `prism run --web-port PORT` and pass --url http://HOST:PORT") from None


def metric_totals(text: str) -> dict[str, float]:
    """Sums of the counters `prism status` shows, from the Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"in": 0.0, "emitted": 0.0, "dlq": 0.0, "duplicates": 0.0, "expired": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "prism_messages_in_total" and s.labels.get("stage") == "normalize":
                out["in"] += s.value
            elif s.name == "prism_messages_in_total" and s.labels.get("stage") == "publish":
                out["emitted"] += s.value
            elif s.name == "prism_dlq_messages_total":
                out["dlq"] += s.value
            elif s.name == "prism_dedup_hits_total":
                out["duplicates"] += s.value
            elif s.name == "prism_expired_messages_total":
                out["expired"] += s.value
    return out


def _supervisor_doc(url: str, client: WorkerClient | None = None) -> dict[str, Any] | None:
    """The supervisor's `/workers` document when `url` is a `prism run --processes N` supervisor."""
    try:
        doc = _get(url + "/workers", client=client)
    except WorkerRefused:
        raise  # a guarded supervisor (or worker): say so, do not guess it is something else
    except PrismError:
        return None  # a single worker (Faust answers 404) - or nothing there, reported by the caller
    return doc if isinstance(doc, dict) and doc.get("kind") == "supervisor" else None


def collect_status(url: str, interval: float = 1.0, client: WorkerClient | None = None) -> dict[str, Any]:
    """Everything `prism status` prints: per topology its info, status, DLQ depth; rates from
    two /metrics scrapes `interval` seconds apart. `client` carries credentials and TLS trust.

    For a supervisor (`prism run --processes N --web-port P`): its children (state, restarts,
    last exit) and then the same for every child that is up."""
    url = url.rstrip("/")
    sup = _supervisor_doc(url, client)
    if sup is not None:
        workers = []
        for child in sup["children"]:
            entry: dict[str, Any] = {"index": child["index"], "url": child.get("web_url")}
            if child.get("web_url") and child.get("state") == "ready":
                try:
                    entry["status"] = collect_status(child["web_url"], interval, client)
                except PrismError as exc:
                    entry["error"] = str(exc)
            workers.append(entry)
        return {"url": url, "supervisor": sup, "workers": workers}
    return _collect_worker(url, interval, client)


def _collect_worker(url: str, interval: float, client: WorkerClient | None) -> dict[str, Any]:
    before = metric_totals(_get(url + "/metrics", client=client))
    t0 = time.monotonic()
    out: dict[str, Any] = {"url": url, "topologies": []}
    for name in _get(url + "/connectors", client=client):
        info = _get(f"{url}/connectors/{name}", client=client)
        status = _get(f"{url}/connectors/{name}/status", client=client)
        try:
            dlq = _get(f"{url}/connectors/{name}/dlq", timeout=30, client=client)
        except PrismError:
            dlq = {"total": None, "partitions": []}
        out["topologies"].append({"name": name, "info": info, "status": status, "dlq": dlq})
    time.sleep(max(0.0, interval - (time.monotonic() - t0)))
    after = metric_totals(_get(url + "/metrics", client=client))
    dt = max(1e-3, time.monotonic() - t0)
    out["totals"] = after
    out["rates_per_s"] = {k: round((after[k] - before[k]) / dt, 2) for k in after}
    return out


def print_status(doc: dict[str, Any], con: Console) -> None:
    if "supervisor" in doc:
        _print_supervisor(doc, con)
        return
    rates, totals = doc["rates_per_s"], doc["totals"]
    for t in doc["topologies"]:
        st, info, dlq = t["status"], t["info"], t["dlq"]
        con.print(f"[bold]{t['name']}[/] {st['connector']['state']}  stages: {' -> '.join(info['stages'])}")
        con.print(f"  outputs: {', '.join(info['outputs'])}   dlq: {', '.join(info['dlq'])}")
        table = Table(title="source partitions")
        for col in ("topic", "partition", "committed", "highwater", "lag", "state"):
            table.add_column(col, justify="right" if col in ("partition", "committed", "highwater", "lag") else "left")
        for task in st["tasks"]:
            table.add_row(task["topic"], str(task["partition"]), str(task["committed"]), str(task["highwater"]),
                          str(task["lag"]), task["state"])
        con.print(table)
        depth = Table(title=f"DLQ depth (total {dlq.get('total')})")
        depth.add_column("topic")
        depth.add_column("partition", justify="right")
        depth.add_column("records", justify="right")
        for part in dlq.get("partitions", []):
            depth.add_row(part["topic"], str(part["partition"]), str(part["depth"]))
        con.print(depth)
        tables = Table(title="tables")
        tables.add_column("table")
        tables.add_column("keys", justify="right")
        for name, size in sorted(st.get("tables", {}).items()):
            tables.add_row(name, str(size))
        con.print(tables)
    rt = Table(title="throughput")
    rt.add_column("counter")
    rt.add_column("total", justify="right")
    rt.add_column("per second", justify="right")
    for k in ("in", "emitted", "dlq", "duplicates", "expired"):
        rt.add_row(k, f"{totals[k]:.0f}", f"{rates[k]:.1f}")
    con.print(rt)


def _print_supervisor(doc: dict[str, Any], con: Console) -> None:
    sup = doc["supervisor"]
    con.print(f"[bold]supervisor[/] pid {sup['pid']}  topology {sup['topology']}  {sup['processes']} processes  "
              f"{'[green]ready[/]' if sup['ready'] else '[red]not ready[/]'}  restarts {sup['restarts']}")
    table = Table(title="worker processes")
    for col in ("#", "pid", "state", "restarts", "last exit", "event loop", "web", "writer id"):
        table.add_column(col)
    for c in sup["children"]:
        table.add_row(str(c["index"]), str(c["pid"] or "-"), c["state"], str(c["restarts"]),
                      "-" if c["last_exit"] is None else str(c["last_exit"]), str(c.get("event_loop") or "-"),
                      str(c.get("web_url") or "-"), c["writer_id"])
    con.print(table)
    for w in doc["workers"]:
        if "status" in w:
            con.print(f"\n[bold]worker {w['index']}[/] ({w['url']})")
            print_status(w["status"], con)
        elif "error" in w:
            con.print(f"\n[bold]worker {w['index']}[/]: [red]{escape(w['error'])}[/]")


# --------------------------------------------------------------------------- dlq list / show


_REL = re.compile(r"^(\d+)([smhd])$")


def parse_since(value: str | None, now: float | None = None) -> float | None:
    """`--since`: `30s`, `10m`, `2h`, `7d` ago, or an ISO-8601 timestamp. Returns epoch seconds."""
    if not value:
        return None
    now = time.time() if now is None else now
    m = _REL.match(value.strip())
    if m:
        return now - int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--since {value!r} is neither a duration nor an ISO-8601 time", path="--since",
                          hint="use e.g. 10m, 2h, 7d or 2026-11-21T20:00:00Z") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def dlq_row(rec: Any) -> dict[str, Any]:
    from app.agents.dlq import error_context
    from app.security.attestation import HEADER, describe

    ctx = error_context(list(rec.headers or []))
    raw = next((v for k, v in rec.headers or [] if k == HEADER and v), None)
    att = describe(raw) if raw is not None else None
    # what a replay would authenticate as; unverified here (the worker verifies it on replay)
    identity = "" if att is None else f"{att.get('publisher_id')}" + (
        f" ({att.get('publisher_team')})" if att.get("publisher_team") else "")
    return {"attested_identity": identity,"dlq_topic": rec.topic, "dlq_partition": rec.partition, "dlq_offset": rec.offset,
            "timestamp": datetime.fromtimestamp(rec.timestamp / 1000, UTC).isoformat() if rec.timestamp else None,
            "source": f"{ctx.get('topic', '?')}/{ctx.get('partition', '?')}@{ctx.get('offset', '?')}",
            "stage": ctx.get("stage", ""), "reason": ctx.get("reason", ""), "attempts": ctx.get("attempts", ""),
            "error": ctx.get("exception.message", ""), "exception": ctx.get("exception.class.name", "")}


async def read_dlq(topology: Any, bootstrap: str, *, settings: Any = None, reason: str | None = None,
                   since: float | None = None, limit: int = 0, con: Console | None = None) -> list[Any]:
    """DLQ records of every source of `topology`, filtered, oldest first."""
    from app.demo.runner import read_all

    topics = {s.topic + topology.dlq.topic_suffix: s.partitions for s in topology.sources}
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=con or console, transient=True) as progress:
        progress.add_task(f"reading {', '.join(topics)}", total=None)
        records = await read_all(bootstrap, topics, expected_total=0, timeout=60, settings=settings)
    out = []
    for recs in records.values():
        for r in recs:
            row = dlq_row(r)
            if reason is not None and row["reason"] != reason:
                continue
            if since is not None and (r.timestamp or 0) / 1000 < since:
                continue
            out.append(r)
    out.sort(key=lambda r: (r.timestamp or 0, r.topic, r.partition, r.offset))
    return out[:limit] if limit else out


def _bootstrap() -> tuple[str, Any]:
    from app.broker.admin import BrokerSettings

    settings = BrokerSettings.from_env()
    if settings.embedded:
        raise PrismError("no broker configured", hint="set PRISM_BROKER_URL=host:port of your Kafka cluster")
    return settings.bootstrap, settings


def _friendly(fn: Any) -> Any:
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PrismError as exc:
            Console(stderr=True).print(f"[bold red]error[/] [{exc.code}] {exc}", soft_wrap=True, markup=False)
            raise typer.Exit(2) from None
    return wrapper


def register(app: typer.Typer, dlq_app: typer.Typer) -> None:
    """Add `status` to `app` and `list`/`show` to `dlq_app`."""

    @app.command("status")
    @_friendly
    def status(
        url: Annotated[str, typer.Option(help="the worker's web address (prism run --web-port)")] = DEFAULT_URL,
        json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
        interval: Annotated[float, typer.Option(min=0.1, help="seconds between the two scrapes for rates")] = 1.0,
        user: Annotated[str | None, typer.Option(envvar="PRISM_ADMIN_USER",
                                                 help="management API user (HTTP basic)")] = None,
        password: Annotated[str | None, typer.Option(envvar="PRISM_ADMIN_PASSWORD",
                                                     help="its password (prefer the env var)")] = None,
        token: Annotated[str | None, typer.Option(envvar="PRISM_ADMIN_TOKEN",
                                                  help="bearer JWT (wins over --user)")] = None,
        cafile: Annotated[Path | None, typer.Option(envvar="PRISM_ADMIN_CAFILE",
                                                    help="PEM CA(s) to trust for an https:// --url")] = None,
    ) -> None:
        """Topology, per-partition lag, rates, DLQ depth and table sizes of a running worker."""
        from app.security.http_auth import client_auth_header

        try:
            context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load CA file: {exc}", path=str(cafile),
                              hint="pass the PEM certificate (or CA) the worker serves") from None
        client = WorkerClient(client_auth_header(user=user, password=password, token=token), context)
        doc = collect_status(url, interval, client)
        if json_out:
            typer.echo(json.dumps(doc, indent=2, sort_keys=True))
        else:
            print_status(doc, console)

    @dlq_app.command("list")
    @_friendly
    def dlq_list(
        topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
        reason: Annotated[str | None, typer.Option(help="only this prism.errors.reason")] = None,
        since: Annotated[str | None, typer.Option(help="only newer: 10m, 2h, 7d or ISO-8601")] = None,
        limit: Annotated[int, typer.Option(min=0, help="at most this many (0: all)")] = 50,
        json_out: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Dead-lettered records with why they failed (oldest first)."""
        from app.topology import load_topology

        topo = load_topology(topology)
        bootstrap, settings = _bootstrap()
        recs = asyncio.run(read_dlq(topo, bootstrap, settings=settings, reason=reason, since=parse_since(since),
                                    limit=limit))
        rows = [dlq_row(r) for r in recs]
        if json_out:
            typer.echo(json.dumps(rows, indent=2))
            return
        table = Table(title=f"{len(rows)} DLQ record(s)")
        for col in ("dlq_offset", "timestamp", "source", "stage", "reason", "error", "attested identity"):
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(f"{row['dlq_partition']}@{row['dlq_offset']}", row["timestamp"] or "", row["source"],
                          row["stage"], row["reason"], row["error"][:120], row["attested_identity"])
        console.print(table)

    @dlq_app.command("show")
    @_friendly
    def dlq_show(
        ref: Annotated[str, typer.Argument(help="PARTITION@OFFSET in the DLQ topic (as `prism dlq list` prints)")],
        topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
        json_out: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """One DLQ record in full: error context, headers (secrets already masked), value preview."""
        from app.topology import load_topology

        try:
            part, off = (int(x) for x in ref.split("@", 1))
        except ValueError:
            raise ConfigError(f"{ref!r} is not PARTITION@OFFSET", hint="e.g. 0@42, as `prism dlq list` prints") \
                from None
        topo = load_topology(topology)
        bootstrap, settings = _bootstrap()
        recs = asyncio.run(read_dlq(topo, bootstrap, settings=settings))
        match = [r for r in recs if r.partition == part and r.offset == off]
        if not match:
            raise PrismError(f"no DLQ record at partition {part} offset {off}", hint="list them with `prism dlq list`")
        rec = match[0]
        doc = {**dlq_row(rec), "key": (rec.key or b"").decode(errors="replace"),
               "headers": {k: (v or b"").decode(errors="replace") for k, v in rec.headers or []},
               "value_bytes": len(rec.value or b""),
               "value_preview": (rec.value or b"")[:512].decode(errors="replace")}
        if json_out:
            typer.echo(json.dumps(doc, indent=2))
        else:
            console.print_json(json.dumps(doc))
