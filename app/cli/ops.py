"""Operator commands: `prism status` (from a worker's management API and /metrics) and
`prism dlq list|show` (read the DLQ topics through PRISM_BROKER_URL).

Mount with `register(app, dlq_app)` from app/cli/main.py. Everything has `--json` for scripts;
tables and progress bars (rich) for people.
"""

from __future__ import annotations

import asyncio
import http.client
import json
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
from rich.text import Text

from app.cli.output import CliTable as Table  # headers break between words, ids fold
from app.cli.output import friendly
from app.decimal_text import decimal
from app.errors import ConfigError, JsonInputError, PrismError
from app.untrusted_json import read_json_response

DEFAULT_URL = "http://127.0.0.1:6066"
DEFAULT_TOPOLOGY = Path("topologies/orders-created.yaml")
console = Console(emoji=False)


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class WorkerClient:
    """How `prism status` talks to a worker: credentials and, for HTTPS, whom to trust."""

    headers: Mapping[str, str] = field(default_factory=dict)
    context: ssl.SSLContext | None = None


class WorkerRefused(PrismError):
    """The worker (or supervisor) answered 401, 403 or 429: credentials, not the address."""

    code = "worker_refused"


class WorkerUnreachable(PrismError):
    """Nothing answered at the worker URL (refused, no route, DNS, timeout): the address or the
    worker, not its credentials or its answer - a script tells "start it / fix --url" apart."""

    code = "worker_unreachable"


#: where `prism status` looks for the worker when --url is not given
URL_ENV = "PRISM_WORKER_URL"

#: A worker's /metrics text: ~100 KiB with many partitions; far above, it is not a worker.
_MAX_TEXT_BODY = 16 * 1024 * 1024


def _get(url: str, timeout: float = 10.0, client: WorkerClient | None = None) -> Any:
    client = client or WorkerClient()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(client.headers)), timeout=timeout,
                                    context=client.context) as r:
            if "json" in r.headers.get("Content-Type", ""):
                return read_json_response(r, what=url)
            body = r.read(_MAX_TEXT_BODY + 1)  # the /metrics text of a worker: bounded like JSON
            if len(body) > _MAX_TEXT_BODY:
                raise PrismError(f"{url} answered with more than {_MAX_TEXT_BODY} bytes",
                                 hint="check that the address is a Prism worker's web port")
            return body.decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise WorkerRefused(f"worker refused {url} (HTTP {exc.code})",
                                hint="pass --user/--password or --token (PRISM_ADMIN_USER / PRISM_ADMIN_PASSWORD / "
                                     "PRISM_ADMIN_TOKEN) for a user with the read role") from None
        if exc.code == 429:
            raise WorkerRefused(f"worker refused {url} (HTTP 429: too many failed authentication attempts; "
                                f"{_locked_until(exc.headers.get('Retry-After'))})",
                                hint="wait, then retry with the right credentials; failures count per user name "
                                     "and client address, so someone guessing this user's password from this "
                                     "host locks it out") from None
        err = PrismError(f"worker answered {exc.code} for {url}",
                         hint="check the topology name and that the worker is running")
        err.http_status = exc.code  # type: ignore[attr-defined]  # the console tells 404 from an outage
        raise err from None
    except (urllib.error.URLError, OSError) as exc:
        raise WorkerUnreachable(f"cannot reach the worker at {url} (unreachable: {getattr(exc, 'reason', exc)})",
                                hint="is the worker running? start it with `prism run --web-port PORT`, "
                                f"then point --url (or {URL_ENV}) at http://HOST:PORT") from None
    except JsonInputError:
        raise  # the worker's answer (a ValueError too), not the URL
    except (ValueError, http.client.InvalidURL) as exc:  # "Invalid IPv6 URL", a space in the host
        raise ConfigError(f"the worker URL {url!r} is not usable: {exc}", path="--url",
                          hint="pass --url http://HOST:PORT of the worker's --web-port, e.g. http://127.0.0.1:6066"
                          ) from None


def _locked_until(retry_after: str | None) -> str:
    """``Retry-After`` (seconds, as Prism's servers send it) as a person reads it: "locked out
    for 42 s, until 12:00:42 UTC"; anything else the server sent is shown as it is (bounded)."""
    from datetime import UTC, datetime, timedelta

    text = (retry_after or "").strip()
    seconds = decimal(text, most_digits=9)
    if seconds is not None:
        until = datetime.now(UTC) + timedelta(seconds=seconds)
        return f"locked out for {seconds} s, until {until:%H:%M:%S} UTC"
    return f"locked out; Retry-After {text[:64]!r}" if text else "locked out for a while (no Retry-After)"


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


def _cells(*values: Any) -> list[Text]:
    """Table cells from data: rich reads a `str` cell as markup, so a `[` in a topic, state or
    error would vanish (or `[/x]` crash the command); a `Text` is shown as it is."""
    return [Text(str(v)) for v in values]


def print_status(doc: dict[str, Any], con: Console) -> None:
    """`prism status` for people (`--json` prints `doc` itself). Data is escaped: see app/cli/output.py."""
    if "supervisor" in doc:
        _print_supervisor(doc, con)
        return
    rates, totals = doc["rates_per_s"], doc["totals"]
    for t in doc["topologies"]:
        st, info, dlq = t["status"], t["info"], t["dlq"]
        con.print(f"[bold]{escape(str(t['name']))}[/] {escape(str(st['connector']['state']))}  "
                  f"stages: {escape(' -> '.join(map(str, info['stages'])))}")
        con.print(f"  outputs: {', '.join(map(str, info['outputs']))}   dlq: {', '.join(map(str, info['dlq']))}",
                  markup=False, highlight=False)
        table = Table(title="source partitions")
        for col in ("topic", "partition", "committed", "highwater", "lag", "state"):
            table.add_column(col, justify="right" if col in ("partition", "committed", "highwater", "lag") else "left")
        for task in st["tasks"]:
            table.add_row(*_cells(task["topic"], task["partition"], task["committed"], task["highwater"],
                                  task["lag"], task["state"]))
        con.print(table)
        depth = Table(title=escape(f"DLQ depth (total {dlq.get('total')})"))
        depth.add_column("topic")
        depth.add_column("partition", justify="right")
        depth.add_column("records", justify="right")
        for part in dlq.get("partitions", []):
            depth.add_row(*_cells(part["topic"], part["partition"], part["depth"]))
        con.print(depth)
        tables = Table(title="tables")
        tables.add_column("table")
        tables.add_column("keys", justify="right")
        for name, size in sorted(st.get("tables", {}).items()):
            tables.add_row(*_cells(name, size))
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
    con.print(f"[bold]supervisor[/] pid {sup['pid']}  topology {escape(str(sup['topology']))}  {sup['processes']} processes  "
              f"{'[green]ready[/]' if sup['ready'] else '[red]not ready[/]'}  restarts {sup['restarts']}")
    table = Table(title="worker processes")
    for col in ("#", "pid", "state", "restarts", "last exit", "event loop", "web", "writer id"):
        table.add_column(col)
    for c in sup["children"]:
        table.add_row(*_cells(c["index"], c["pid"] or "-", c["state"], c["restarts"],
                              "-" if c["last_exit"] is None else c["last_exit"], c.get("event_loop") or "-",
                              c.get("web_url") or "-", c["writer_id"]))
    con.print(table)
    for w in doc["workers"]:
        if "status" in w:
            con.print(f"\n[bold]worker {w['index']}[/] ({escape(str(w['url']))})")
            print_status(w["status"], con)
        elif "error" in w:
            con.print(f"\n[bold]worker {w['index']}[/]: [red]{escape(w['error'])}[/]")


# --------------------------------------------------------------------------- dlq list / show


def record_time(ms: Any) -> str | None:
    """A Kafka record's timestamp (epoch ms) as ISO 8601 UTC, or None when there is none (0, or
    -1) or no calendar time fits it. Why: the producer of the source topic sets it (CreateTime,
    copied onto the DLQ record), and one record stamped 2**62 made ``datetime`` raise - the
    console's DLQ page of that pipeline answered 500 for every record, ``prism dlq list`` a
    traceback."""
    if not isinstance(ms, int) or isinstance(ms, bool) or ms <= 0:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat()
    except (ValueError, OverflowError, OSError):
        return None


def attestation_reader_for(topology: Any) -> tuple[Any, str]:
    """The verifier of `topology`'s DLQ attestations (public keys only), or None and why not -
    a listing still works without keys, it just cannot vouch for an identity."""
    from app.security.topology_keys import attestation_reader

    try:
        reader = attestation_reader(topology)
    except PrismError as exc:
        return None, f"the topology's keyring could not be read ({exc.message})"
    return reader, "" if reader is not None else "the topology names no Ed25519 worker key or has attestations off"


def dlq_row(rec: Any, attestations: Any = None, *, unchecked: str = "no worker key here",
            ) -> dict[str, Any]:
    """One DLQ record as the list shows it. `attestations` (an `AttestationVerifier`, from
    `topology_keys.attestation_reader`) checks the attested identity, which the header alone
    only claims; without one the row says it was not checked and why (`unchecked`)."""
    from app.agents.dlq import error_context, mask_secrets
    from app.observability.redaction import redact_patterns
    from app.security.attestation import HEADER, describe, verdict

    ctx = error_context(list(rec.headers or []))
    raw = next((v for k, v in rec.headers or [] if k == HEADER and v), None)
    att = describe(raw) if raw is not None else None
    # what a replay would authenticate as, and whether that claim holds for this record
    identity = "" if att is None else f"{att.get('publisher_id')}" + (
        f" ({att.get('publisher_team')})" if att.get("publisher_team") else "")
    checked = "" if raw is None else verdict(raw, attestations, topic=str(ctx.get("topic", "")), key=rec.key,
                                             value=rec.value or b"", headers=list(rec.headers or []),
                                             unchecked=unchecked)
    return {"attested_identity": identity, "attestation": checked, "dlq_topic": rec.topic, "dlq_partition": rec.partition, "dlq_offset": rec.offset,
            "timestamp": record_time(rec.timestamp),
            "source": f"{ctx.get('topic', '?')}/{ctx.get('partition', '?')}@{ctx.get('offset', '?')}",
            "stage": ctx.get("stage", ""), "reason": ctx.get("reason", ""), "attempts": ctx.get("attempts", ""),
            # masked as the headers are (dlq_show_doc): the worker masks what it writes, but a
            # DLQ topic may hold records other writers put there, and the list shows this text
            "error": redact_patterns(mask_secrets(ctx.get("exception.message", "").encode()).decode(errors="replace")),
            "exception": ctx.get("exception.class.name", "")}


async def read_dlq(topology: Any, bootstrap: str, *, settings: Any = None, reason: str | None = None,
                   since: float | None = None, limit: int = 0, con: Console | None = None,
                   sources: list[str] | None = None) -> list[Any]:
    """DLQ records of every source of `topology` (or of `sources`), filtered, oldest first. Read to
    the end offsets (app/cli/dlq.py `read_to_end`), not "until quiet", so a slow broker cannot hide
    records. Filtered as they are read, and with `limit` only the `limit` oldest matches are held
    (a heap): `prism dlq list` (50 by default) held the whole DLQ - 200k records, ~580 MiB - to
    print 50. A `reason` no record has raises `BadSelector` (`check_reason`, shared with the
    replay)."""
    import heapq
    import itertools
    from collections import Counter

    from app.cli.dlq import read_to_end

    topics = {s.topic + topology.dlq.topic_suffix: s.partitions for s in topology.sources
              if sources is None or s.topic in sources}
    #: (-sort key, tie, record): a max-heap of the `limit` oldest matches (all of them without a limit)
    kept: list[tuple[Any, int, Any]] = []
    out: list[Any] = []
    tie = itertools.count()
    rank = {t: i for i, t in enumerate(sorted(topics))}

    #: every record's reason, for the typo check (`check_reason`)
    seen: Counter[str] = Counter()

    def take(records: list[Any]) -> None:
        for r in records:
            if reason is not None:
                got = _reason(r)
                seen[got] += 1
                if got != reason:
                    continue
            if since is not None and (r.timestamp or 0) / 1000 < since:
                continue
            if not limit:
                out.append(r)
                continue
            key = (-(r.timestamp or 0), -rank[r.topic], -r.partition, -r.offset)
            if len(kept) < limit:
                heapq.heappush(kept, (key, next(tie), r))
            elif key > kept[0][0]:
                heapq.heapreplace(kept, (key, next(tie), r))

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=con or Console(stderr=True, emoji=False), transient=True) as progress:
        progress.add_task(escape(f"reading {', '.join(topics)}"), total=None)
        for topic, partitions in topics.items():
            await read_to_end(bootstrap, topic, partitions, settings=settings, take=take)
    if reason is not None:  # a typo lists nothing: say so, naming the reasons there are (as replay does)
        from app.cli.dlq import check_reason

        check_reason(reason, seen, list(topics))
    out.extend(r for _, _, r in kept)
    out.sort(key=lambda r: (r.timestamp or 0, r.topic, r.partition, r.offset))
    return out


def _reason(rec: Any) -> str:
    """A DLQ record's `prism.errors.reason` (what `dlq_row` shows as its reason)."""
    from app.agents.dlq import error_context

    return str(error_context(list(rec.headers or [])).get("reason", ""))


def dlq_table(rows: list[dict[str, Any]]) -> Table:
    """`prism dlq list` for people, readable at 80 columns (a pipe, `less`, a small terminal).

    Why this shape: seven side-by-side columns left the error a few characters wide and its text
    was cut at 120 characters - usually in the middle of the `fix:` hint, the part an operator
    needs. Now two narrow columns carry a few short lines each, and the error column takes the
    rest of the width and wraps the whole message (never cut). Cells are `Text`: record data is
    never read as markup."""
    table = Table(title=f"{len(rows)} DLQ record(s)", show_lines=True, expand=True)
    table.add_column("record", no_wrap=True)
    table.add_column("source, reason, attested identity", overflow="fold", max_width=26)
    table.add_column("error and fix", overflow="fold", ratio=1, min_width=30)
    for row in rows:
        when = (row["timestamp"] or "")[:19].replace("T", "\n")
        topic, _, where = row["source"].rpartition("/")
        identity = f"\nas {row['attested_identity']}\n({row['attestation']})" if row["attested_identity"] else ""
        record = f"{row['dlq_partition']}@{row['dlq_offset']}"
        left = "\n".join(_cell(v, _MAX_CODE, record) for v in (f"{topic} {where}", row["reason"], f"({row['stage']})"))
        table.add_row(Text(f"{record}\n{when}"), Text(left + _cell(identity, _MAX_CODE, record)),
                      Text(_cell(row["error"], _MAX_ERROR, record)))
    return table


#: What one cell of `prism dlq list` shows of a header: the worker writes codes and topic names of
#: a few dozen characters and errors of a few hundred; headers are data anyone who can write to
#: the DLQ topic chooses - a 200 KB `prism.errors.reason` filled 7,700 lines of the table.
_MAX_CODE = 200
_MAX_ERROR = 4000
#: what `prism dlq show` prints of one header value (or the key); `--json` prints all of it
_MAX_HEADER = 1000


def _cell(text: str, most: int, record: str, *, whole: str = "") -> str:
    """`text`, or its first `most` characters and how to see the rest (`prism dlq show RECORD`,
    plus `whole`: ` --json` where `show` itself caps)."""
    if len(text) <= most:
        return text
    return f"{text[:most]}… ({len(text) - most} more characters: prism dlq show {record}{whole})"


def dlq_show_doc(rec: Any, attestations: Any = None, *, unchecked: str = "no worker key here",
                 ) -> dict[str, Any]:
    """`prism dlq show --json`: the row of `dlq list`, the key, the headers (secret ones redacted)
    and the value - decoded (an envelope with its token redacted, JSON, text or hex), with its
    size and SHA-256. The raw bytes are what `--export FILE` writes."""
    import hashlib

    from app.agents.dlq import _SECRET_HEADERS, mask_secrets
    from app.cli.envelope_view import REDACTED, value_doc
    from app.observability.redaction import is_sensitive_key, redact_patterns

    value = rec.value or b""
    # A header is secret by the names the log redaction uses too (api-key, password, *-token,
    # *-secret, session...): the producer's headers are kept on the DLQ copy, and only the
    # worker's short list of auth headers was masked there - `x-api-key: sk_live_...` and
    # `password: ...` were shown to every reader of the record page.
    # then every text shown through the log redaction's rules (a URL's `user:password@`, `Basic`
    # credentials, `password=...`): they were shown as written
    headers = {k: REDACTED if (k.lower() in _SECRET_HEADERS or is_sensitive_key(k)) and v
               else redact_patterns(mask_secrets(v or b"").decode(errors="replace")) for k, v in rec.headers or []}
    key = None if rec.key is None else redact_patterns(mask_secrets(rec.key).decode(errors="replace"))
    return {**dlq_row(rec, attestations, unchecked=unchecked), "key": key,
            "headers": headers, "value_bytes": len(value), "value_sha256": hashlib.sha256(value).hexdigest(),
            "value": value_doc(value)}


def print_dlq_record(doc: dict[str, Any], con: Console) -> None:
    """`prism dlq show` for people: what failed and why, then the decoded value."""
    def say(text: str) -> None:
        con.print(text, markup=False, highlight=False, soft_wrap=True)

    # Every field but the value is a header (or the key) anyone who can write the DLQ topic
    # chooses: capped as `dlq list` caps its cells - a 200 KB header filled thousands of lines -
    # with how to get all of it (`--json` prints every field whole).
    record = f"{doc['dlq_partition']}@{doc['dlq_offset']}"

    def cap(text: Any, most: int) -> str:
        return _cell(str(text), most, record, whole=" --json")

    say(f"{doc['dlq_topic']} {record}  ({doc['timestamp'] or 'no timestamp'})")
    say(f"source     {cap(doc['source'], _MAX_CODE)}")
    say(f"failed     {cap(doc['reason'], _MAX_CODE)} at stage {cap(doc['stage'], _MAX_CODE)} "
        f"(attempts {cap(doc['attempts'] or '?', _MAX_CODE)})")
    say(f"error      {cap(doc['error'], _MAX_ERROR)}")
    if doc["attested_identity"]:
        say(f"identity   {cap(doc['attested_identity'], _MAX_CODE)} (attestation {doc['attestation']}; the worker "
            "verifies it again on replay)")
    say(f"key        {cap(doc['key'], _MAX_HEADER) if doc['key'] is not None else '(none)'}")
    say("headers")
    for k, v in doc["headers"].items():
        say(f"  {cap(k, _MAX_CODE)}: {cap(v, _MAX_HEADER)}")
    value = doc["value"]
    say(f"value      {doc['value_bytes']} bytes, sha256 {doc['value_sha256']}, {value['kind']}"
        + (f" (not an envelope: {value['not_an_envelope']})" if value.get("not_an_envelope") else ""))
    body = {k: v for k, v in value.items() if k not in ("kind", "not_an_envelope")}
    con.print_json(json.dumps(body, default=str))


def print_group_lag(doc: dict[str, Any], con: Console) -> None:
    """``prism status --group``: one row per partition, committed offset against the log end."""
    con.print(Text(f"group {doc['group']}: lag {doc['lag']} "
                   f"(committed offsets against the log end, {doc['end_from'].replace('_', ' ')})"))
    if not doc["partitions"]:
        con.print(Text("no committed offsets and no such topics: nothing to report"))
        return
    table = Table()
    for col in ("topic", "partition", "committed", "log end", "lag"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    for p in doc["partitions"]:
        table.add_row(*_cells(p["topic"], p["partition"], "-" if p["committed"] is None else p["committed"],
                              p["log_end"], p["lag"]))
    con.print(table)


def _bootstrap() -> tuple[str, Any]:
    """PRISM_BROKER_URL, else the running local broker (`prism broker start`), said on stderr
    so that --json output stays one document."""
    from app.broker.local import cli_bootstrap
    from app.cli.output import err_console

    return cli_bootstrap(lambda line: err_console.print(line, markup=False, highlight=False, soft_wrap=True))


def register(app: typer.Typer, dlq_app: typer.Typer) -> None:
    """Add `status` to `app` and `list`/`show` to `dlq_app`."""

    @app.command("status")
    @friendly
    def status(
        url: Annotated[str, typer.Option(envvar=URL_ENV,
                                         help="the worker's web address (prism run --web-port)")] = DEFAULT_URL,
        json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
        interval: Annotated[float, typer.Option(min=0.1, max=3600, help="seconds between the two scrapes for rates")] = 1.0,
        user: Annotated[str | None, typer.Option(envvar="PRISM_ADMIN_USER",
                                                 help="management API user (HTTP basic)")] = None,
        password: Annotated[str | None, typer.Option(envvar="PRISM_ADMIN_PASSWORD",
                                                     help="its password (prefer the env var)")] = None,
        token: Annotated[str | None, typer.Option(envvar="PRISM_ADMIN_TOKEN",
                                                  help="bearer JWT (wins over --user)")] = None,
        cafile: Annotated[Path | None, typer.Option(envvar="PRISM_ADMIN_CAFILE",
                                                    help="PEM CA(s) to trust for an https:// --url")] = None,
        group: Annotated[str | None, typer.Option(
            help="read GROUP's lag from the broker (PRISM_BROKER_URL) instead of a worker: works with "
                 "no worker running (a topology's group is prism-<topology name>)")] = None,
        topic: Annotated[list[str] | None, typer.Option(
            help="with --group: only this topic (repeatable; default: every topic the group committed on)")] = None,
    ) -> None:
        """Topology, per-partition lag, rates, DLQ depth and table sizes of a running worker;
        with --group, a consumer group's lag straight from the broker."""
        from app.security.http_auth import client_auth_header

        if group is not None:
            from app.worker.lag import read_group_lag_from_env

            lag_doc = read_group_lag_from_env(group, topic, note=lambda line: Console(stderr=True, emoji=False).print(
                line, markup=False, highlight=False, soft_wrap=True)).to_dict()
            if json_out:
                typer.echo(json.dumps(lag_doc, indent=2, sort_keys=True))
            else:
                print_group_lag(lag_doc, console)
            return

        try:
            context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load CA file: {exc}", path=str(cafile),
                              hint="pass the PEM certificate (or CA) the worker serves") from None
        client = WorkerClient(client_auth_header(user=user, password=password, token=token), context)
        doc = collect_status(url, interval, client)
        from app.broker.local import status_doc, status_line

        local = status_doc()  # the `prism broker` a worker without PRISM_BROKER_URL uses
        if json_out:
            typer.echo(json.dumps({**doc, **({"local_broker": local} if local is not None else {})}, indent=2,
                                  sort_keys=True))
        else:
            print_status(doc, console)
            if local is not None:
                console.print(status_line(local), markup=False, highlight=False, soft_wrap=True)

    @dlq_app.command("list")
    @friendly
    def dlq_list(
        topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
        reason: Annotated[str | None, typer.Option(help="only this prism.errors.reason")] = None,
        since: Annotated[str | None, typer.Option(help="only newer: 10m, 2h, 7d or ISO-8601")] = None,
        limit: Annotated[int, typer.Option(min=0, help="at most this many (0: all)")] = 50,
        json_out: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Dead-lettered records with why they failed (oldest first)."""
        from app.sdk.audit import parse_since
        from app.topology import load_topology

        # the user's own words first: a bad --since is reported before any broker is looked for
        after = parse_since(since).timestamp() if since else None
        topo = load_topology(topology)
        bootstrap, settings = _bootstrap()
        recs = asyncio.run(read_dlq(topo, bootstrap, settings=settings, reason=reason, since=after, limit=limit))
        reader, unchecked = attestation_reader_for(topo)
        rows = [dlq_row(r, reader, unchecked=unchecked) for r in recs]
        if json_out:
            typer.echo(json.dumps(rows, indent=2))
            return
        console.print(dlq_table(rows))

    @dlq_app.command("show")
    @friendly
    def dlq_show(
        ref: Annotated[str, typer.Argument(metavar="RECORD",
                                           help="PARTITION@OFFSET in the DLQ topic (as `prism dlq list` prints)")],
        topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
        source: Annotated[str | None, typer.Option(
            help="the source topic whose DLQ holds it (needed when the topology has several)")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="the record as one JSON document")] = False,
        export: Annotated[Path | None, typer.Option(
            "--export", metavar="FILE",
            help="write the record's value bytes to FILE (for `prism envelope inspect FILE`)")] = None,
    ) -> None:
        """One DLQ record in full: error context, headers (secrets masked), the value decoded (an
        envelope with its token redacted); --export writes the value's bytes."""
        from app.cli.dlq import choose_sources, parse_ref, read_record
        from app.topology import load_topology

        topo = load_topology(topology)
        if len(topo.sources) > 1 and source is None:
            raise ConfigError(f"topology {topo.name!r} has {len(topo.sources)} DLQ topics", path="--source",
                              hint="add --source TOPIC (one of " + ", ".join(s.topic for s in topo.sources) + ")")
        chosen = choose_sources(topo, source, True)[0]
        dlq_topic = chosen.topic + topo.dlq.topic_suffix
        part, off = parse_ref(ref, chosen.partitions, dlq_topic, option="RECORD")
        if export is not None and export.is_dir():
            raise ConfigError(f"--export {str(export)!r} is a directory", path="--export",
                              hint="name a file, e.g. --export record.bin")
        bootstrap, settings = _bootstrap()
        # that one offset, not the whole DLQ (a flooded DLQ made every `show` read all of it)
        rec = asyncio.run(read_record(bootstrap, dlq_topic, chosen.partitions, part, off, settings=settings))
        if rec is None:
            raise PrismError(f"no record at {part}@{off} in {dlq_topic}", path=ref,
                             hint="list them with `prism dlq list`")
        reader, unchecked = attestation_reader_for(topo)
        doc = dlq_show_doc(rec, reader, unchecked=unchecked)
        if export is not None:
            try:
                export.write_bytes(rec.value or b"")
            except OSError as exc:
                raise ConfigError(f"cannot write {export}: {exc.strerror}", path="--export",
                                  hint="name a writable file") from None
            doc["exported_to"] = str(export)
        if json_out:
            typer.echo(json.dumps(doc, indent=2, default=str))
            return
        print_dlq_record(doc, console)
        if export is not None:
            note = (f"read it with: prism envelope inspect {export} --payload" if doc["value"]["kind"] == "envelope"
                    else "it is not an envelope (see value above), so `prism envelope inspect` will refuse it")
            truncated = " - cut to fit the DLQ topic, not the whole record" if "value.truncated" in " ".join(
                doc["headers"]) else ""
            console.print(f"wrote {doc['value_bytes']} value bytes to {export}{truncated}; {note}", markup=False,
                          highlight=False, soft_wrap=True)
