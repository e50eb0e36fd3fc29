"""`prism migrate status`: who still depends on `.v2`, before its cutoff (RFC-031 "Breaking Change
Procedure", memo-031 migration tracking; docs/operations.md, ".v2 sunset").

A sunset (`outputs.migration`, app/sunset.py) ends when nobody needs `.v2` any more. Two kinds of
party can still need it, and this command shows both from the broker alone (no worker needed):

* **consumers**: every consumer group with a committed offset on a `<source>.v2` topic (ListGroups,
  then OffsetFetch for the `.v2` partitions; DescribeGroups adds the group's state and members),
  with its committed offset and lag per partition - lag as :mod:`app.worker.lag` reads it for
  `prism status --group` (the log end from a fetch's high watermark, right on the embedded broker
  too). A group that reads only `.v3` has no committed `.v2` offset and is not listed; a group
  whose lag is 0 has read everything written so far and can move to `.v3` now.
* **producers**: the `producer_sdk_version` of the most recent source records (at most `--sample`
  per source topic, spread over its partitions): how many came from which SDK version, how many
  envelopes carry no version (an older SDK or another encoder) and how many were not Prism
  envelopes at all. Only these counts leave the command, never record contents (source records
  hold producer tokens).

Plus the migration phase and both dates from the topology, with the same clock as the worker
(`PRISM_MIGRATION_CLOCK_OFFSET_S` shifts it).

The broker: `PRISM_BROKER_URL` (and its SASL/TLS settings) as for `prism dlq`; without it, the
local broker of `prism broker start` when one runs.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from app.cli.output import CliTable as Table  # headers break between words, ids fold
from app.cli.output import friendly
from app.errors import NoBrokerError

if TYPE_CHECKING:
    from app.worker.lag import GroupLag

DEFAULT_TOPOLOGY = Path("topologies/orders-created.yaml")
#: recent source records read per source topic for the SDK adoption
DEFAULT_SAMPLE = 1000
#: distinct SDK versions listed per source topic; the rest are summed under "other"
MAX_VERSIONS = 32
NOT_ENVELOPE = "not_envelope"

migrate_app = typer.Typer(help="Track the .v2 sunset: consumers still on .v2, producer SDK adoption.",
                          no_args_is_help=True)
console = Console(emoji=False)


@dataclass(frozen=True, slots=True)
class V2Group:
    """A consumer group with committed offsets on a `.v2` topic."""

    group: str
    state: str | None
    members: int | None
    lag: GroupLag  # only the .v2 partitions the group committed on

    def to_dict(self) -> dict[str, Any]:
        parts = [p.to_dict() for p in self.lag.partitions]
        return {"group": self.group, "state": self.state, "members": self.members, "lag": self.lag.total,
                "topics": sorted({p["topic"] for p in parts}), "partitions": parts}


def v2_topics(topology: Any) -> list[str]:
    """The `.v2` topic of every source (whether the topology still writes it or not: a consumer can
    outlive the layout)."""
    return sorted({f"{s.topic}.v2" for s in topology.sources})


def migration_doc(topology: Any, clock: Callable[[], float] | None = None) -> dict[str, Any]:
    """The phase and dates as the worker's `/connectors/{name}/status` reports them under `migration`,
    or `{"configured": False}` without `outputs.migration`."""
    from app.sunset import Sunset, clock_from_env

    mig = topology.outputs.migration
    if mig is None:
        return {"configured": False, "v2_written": "v2" in topology.outputs.layouts}
    return {"configured": True, **Sunset(mig.deprecation_date, mig.cutoff_date, clock or clock_from_env()).status()}


async def v2_groups(bootstrap: str, topics: Sequence[str], *, client_kwargs: Mapping[str, Any] | None = None,
                    end_from_fetch: bool = True) -> list[V2Group]:
    """Every consumer group with a committed offset on one of `topics`, with its lag there."""
    from aiokafka.structs import TopicPartition

    from app.worker.lag import GroupLag, LagReader

    reader = LagReader(bootstrap, client_kwargs=client_kwargs, end_from_fetch=end_from_fetch)
    try:
        consumer, admin = await reader._clients()
        cluster = await consumer._client.fetch_all_metadata()  # never creates a topic by naming it
        tps = [TopicPartition(t, p) for t in topics for p in sorted(cluster.partitions_for_topic(t) or ())]
        if not tps:
            return []
        groups = sorted({str(g[0]) for g in await admin.list_consumer_groups()})
        found: dict[str, list[str]] = {}
        for group in groups:
            committed = await admin.list_consumer_group_offsets(group, partitions=tps)
            on = sorted({tp.topic for tp, om in committed.items() if om is not None and om.offset >= 0})
            if on:
                found[group] = on
        described = await _describe(admin, sorted(found))
        out = []
        for group, on in found.items():
            snap = await reader.read(group, on)
            kept = tuple(p for p in snap.partitions if p.committed is not None)
            lag = GroupLag(snap.group, snap.topics, kept, snap.at, snap.end_from)
            state, members = described.get(group, (None, None))
            out.append(V2Group(group, state, members, lag))
        return out
    finally:
        await reader.stop()


async def _describe(admin: Any, groups: list[str]) -> dict[str, tuple[str | None, int | None]]:
    """group -> (state, members) from DescribeGroups; best effort (a group can vanish meanwhile,
    and the embedded broker answers only part of it), so a failure leaves the group undescribed."""
    if not groups:
        return {}
    out: dict[str, tuple[str | None, int | None]] = {}
    try:
        responses = await admin.describe_consumer_groups(groups)
    except Exception:  # the listing works without it
        return out
    for response in responses:
        for g in getattr(response, "groups", ()):
            # (error_code, group_id, state, protocol_type, protocol, members, ...)
            if g[0] == 0:
                out[str(g[1])] = (str(g[2]) or None, len(g[5]))
    return out


async def sdk_adoption(bootstrap: str, topics: Sequence[str], *, sample: int = DEFAULT_SAMPLE,
                       client_kwargs: Mapping[str, Any] | None = None, timeout_s: float = 20.0) -> dict[str, Any]:
    """Per source topic: how many of its (at most `sample`) most recent records came from which
    producer SDK version - "none" for an envelope without one, "invalid" for a value that is not
    `<name>/<version>`, `not_envelope` for another input shape."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    from app.envelope import decode
    from app.envelope.validation import required_problems
    from app.sdk.version import version_label
    from app.worker.offsets import true_end_offsets

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, client_id="prism-migrate", enable_auto_commit=False,
                                **dict(client_kwargs or {}))
    await consumer.start()
    result: dict[str, Any] = {}
    try:
        cluster = await consumer._client.fetch_all_metadata()
        for topic in topics:
            parts = sorted(cluster.partitions_for_topic(topic) or ())
            counts: Counter[str] = Counter()
            if not parts or sample <= 0:
                result[topic] = {"records": 0, "versions": {}}
                continue
            tps = [TopicPartition(topic, p) for p in parts]
            consumer.assign(tps)
            ends = await true_end_offsets(consumer, tps)  # the embedded broker's ListOffsets is short
            starts = await consumer.beginning_offsets(tps)
            window = math.ceil(sample / len(tps))
            todo: dict[Any, int] = {}
            for tp in tps:
                end, begin = ends.get(tp, 0), int(starts.get(tp) or 0)
                first = max(begin, end - window)
                if end > first:
                    consumer.seek(tp, first)
                    todo[tp] = end
            deadline = time.monotonic() + timeout_s
            while todo and time.monotonic() < deadline:
                batch = await consumer.getmany(*todo, timeout_ms=500, max_records=500)
                for tp, records in batch.items():
                    for rec in records:
                        if tp in todo and rec.offset < todo[tp]:
                            counts[_version_of(rec.value, decode, required_problems, version_label)] += 1
                    if records and records[-1].offset + 1 >= todo.get(tp, 0):
                        todo.pop(tp, None)
            result[topic] = {"records": sum(counts.values()), "versions": _capped(counts),
                             "complete": not todo}
    finally:
        await consumer.stop()
    return result


def _version_of(value: bytes | None, decode: Any, problems: Any, label: Callable[[str], str]) -> str:
    try:
        env = decode(value or b"")
    except Exception:  # any other input shape: legacy headers, CloudEvents, LNMP, raw bytes
        return NOT_ENVELOPE
    if problems(env):
        return NOT_ENVELOPE
    return label(env.producer_sdk_version)


def _capped(counts: Counter[str]) -> dict[str, int]:
    """The counts, most frequent first, at most MAX_VERSIONS of them (the rest as "other")."""
    ranked = counts.most_common()
    out = dict(ranked[:MAX_VERSIONS])
    rest = sum(n for _, n in ranked[MAX_VERSIONS:])
    if rest:
        out["other"] = out.get("other", 0) + rest
    return out


async def collect(topology: Any, bootstrap: str, *, client_kwargs: Mapping[str, Any] | None = None,
                  sample: int = DEFAULT_SAMPLE, clock: Callable[[], float] | None = None) -> dict[str, Any]:
    """The whole `prism migrate status` document (what `--json` prints)."""
    topics = v2_topics(topology)
    groups = await v2_groups(bootstrap, topics, client_kwargs=client_kwargs)
    adoption = await sdk_adoption(bootstrap, sorted({s.topic for s in topology.sources}), sample=sample,
                                  client_kwargs=client_kwargs)
    return {"topology": topology.name, "migration": migration_doc(topology, clock), "v2_topics": topics,
            "v2_groups": [g.to_dict() for g in sorted(groups, key=lambda g: g.group)],
            "sdk_adoption": {"sample": sample, "topics": adoption}}


# --------------------------------------------------------------------------- output


def print_doc(doc: dict[str, Any], con: Console) -> None:
    """Tables for people; every value is plain text (never read as rich markup)."""
    mig = doc["migration"]
    if mig.get("configured"):
        con.print(Text(f"topology {doc['topology']}: .v2 is {mig['v2']} (deprecation {mig['deprecation_date']}, "
                       f"cutoff {mig['cutoff_date']}); .v2 written now: {'yes' if mig['v2_written'] else 'no'}"))
    else:
        con.print(Text(f"topology {doc['topology']}: no outputs.migration (.v2 "
                       f"{'written' if mig['v2_written'] else 'not written'}, no sunset dates)"))
    groups = doc["v2_groups"]
    if not groups:
        con.print(Text(f"no consumer group has committed offsets on {', '.join(doc['v2_topics'])}"))
    for g in groups:
        state = g["state"] or "state unknown"
        members = f", {g['members']} member(s)" if g["members"] is not None else ""
        con.print(Text(f"group {g['group']} ({state}{members}) is still on .v2: {g['lag']} message(s) behind"))
        table = Table(show_edge=False, pad_edge=False)
        for name, justify in (("topic", "left"), ("partition", "right"), ("committed", "right"),
                              ("log end", "right"), ("lag", "right")):
            table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
        for p in g["partitions"]:
            table.add_row(Text(p["topic"]), str(p["partition"]), _num(p["committed"]), _num(p["log_end"]),
                          _num(p["lag"]))
        con.print(table)
    if groups:
        con.print(Text(f"{len(groups)} group(s) on .v2, {sum(g['lag'] for g in groups)} message(s) behind in all"))
    adoption = doc["sdk_adoption"]
    table = Table(title=Text(f"producer SDK versions, last {adoption['sample']} source records per topic"),
                  title_justify="left")
    for name, justify in (("source topic", "left"), ("sdk version", "left"), ("records", "right"),
                          ("share", "right")):
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for topic, entry in sorted(adoption["topics"].items()):
        total = entry["records"]
        if not total:
            table.add_row(Text(topic), Text("(no records)"), "0", "")
        for i, (version, n) in enumerate(entry["versions"].items()):
            table.add_row(Text(topic if i == 0 else ""), Text(version), str(n), f"{100 * n / total:.0f}%")
    con.print(table)


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _bootstrap() -> tuple[str, Any]:
    """PRISM_BROKER_URL (with its SASL/TLS settings), else the running local broker of `prism
    broker start` - where `prism dlq` looks, said on stderr so that --json stays one document."""
    from app.cli.output import err_console

    try:
        from app.broker.local import cli_bootstrap
    except ImportError:  # a build without `prism broker`: PRISM_BROKER_URL only
        from app.broker.admin import BrokerSettings

        settings = BrokerSettings.from_env()
        if settings.embedded:
            raise NoBrokerError("no broker configured", path="PRISM_BROKER_URL",
                             hint="set PRISM_BROKER_URL=host:port of the broker the topology runs on") from None
        from app.broker.preflight import preflight

        preflight(settings)
        return settings.bootstrap, settings
    return cli_bootstrap(lambda line: err_console.print(line, markup=False, highlight=False, soft_wrap=True))


@migrate_app.command("status")
@friendly
def status(
    topology: Annotated[Path, typer.Option("--topology", "-t")] = DEFAULT_TOPOLOGY,
    sample: Annotated[int, typer.Option(min=0, max=100_000, help="recent source records read per source topic "
                                                                 "for the producer SDK adoption (0: skip)")]
    = DEFAULT_SAMPLE,
    json_out: Annotated[bool, typer.Option("--json", help="one JSON document")] = False,
) -> None:
    """Consumer groups still reading <source>.v2 (committed offset and lag per partition), the
    migration phase and dates, and which producer SDK versions wrote the recent source records."""
    from app.topology import load_topology

    topo = load_topology(topology)
    bootstrap, settings = _bootstrap()
    kwargs = settings.aiokafka_kwargs() if settings is not None else None
    doc = asyncio.run(collect(topo, bootstrap, client_kwargs=kwargs, sample=sample))
    if json_out:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print_doc(doc, console)


__all__ = ["V2Group", "collect", "migrate_app", "migration_doc", "sdk_adoption", "v2_groups", "v2_topics"]
