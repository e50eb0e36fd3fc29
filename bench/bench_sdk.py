"""SDK publish latency: the envelope's overhead over publishing the bare payload, per backend.

RFC-031 target: < 5% latency overhead. For each backend this publishes the same ~512-byte
JSON document N times each way, interleaved (bare, envelope, bare, envelope, ...) so that
load drift on the shared machine hits both equally, through ONE connection of one client:

* bare     - `json.dumps(payload)` then the backend's plain publish of those bytes
             (Kafka `send_and_wait(value)`, Redis `XADD key payload <bytes>`, JetStream
             `publish(subject, bytes)`, PostgreSQL INSERT of the bytes);
* envelope - `PrismClient.publish(topic, payload)` with the default options: builds the
             envelope (UUIDv7 id, timestamp, JSON payload), encodes it with the backend's
             binding (headers, stream fields, JSONB document) and publishes it, waiting for
             the same confirmation.

* raw      - Kafka only (issue 29): a plain aiokafka producer of its own, configured as the SDK's
             (acks, linger 0, no idempotence), `send_and_wait(topic, json.dumps(payload))` - what
             a user would write without the SDK. `overhead_vs_raw_pct` compares the envelope
             path with it; RFC-031's "< 5 %" is read against this row.

* bare+meta - the bare payload plus the binding's duplicated metadata (the same `prism-*`
             headers / stream fields / NATS headers, computed once); on PostgreSQL the
             envelope's whole row (its JSONB document) built once, with a fresh message_id
             per insert. Splits the overhead into "what the server and the wire pay for the
             envelope's extra bytes" and "building + encoding the envelope in Python".

Each publish is awaited before the next (latency, not throughput). Reported: p50, p99 and
mean in microseconds, the overhead of the envelope path in percent, and the same overhead
in microseconds (what it costs whatever the network's latency is).

Two CPU figures, because the wall-clock overhead on this shared 2-core machine swings:

* envelope CPU before I/O (`envelope_pre_io_added_us`) - the library's send call (aiokafka
  `send`, redis-py `xadd`, nats-py `publish`, psycopg `execute`) is wrapped to
  stamp when it is entered; per publish, the thread CPU time (`thread_time_ns`, so time
  the process spends descheduled does not count) from the start of the publish to that
  stamp is the Python work before the I/O. p50 of the envelope path minus p50 of the bare
  path = what building and encoding the envelope costs *inside* the publish loop. The
  wrapper costs every path the same.
* hot loop (`cpu_hot_loop`) - the same work (`publish_cpu`: `_build`, `_outgoing` and the
  backend's encoder, exactly what `publish` runs) in a tight loop against `json.dumps`
  alone: the floor. On Kafka: `publish` itself against a producer whose `send` confirms at
  once, against the raw path's `send_and_wait` of `json.dumps` on the same stand-in. The loop above pays 3-5x more for the same code, its caches being
  cold after every round trip (the broker, the event loop and the other processes on the
  two cores run in between).

The load average (1 min) before and after each backend is printed and stored (`loadavg_1m`).

    .venv/bin/python -m bench.bench_sdk                    # kafka (embedded broker) + redis
    .venv/bin/python -m bench.bench_sdk --backends kafka,redis,nats,postgres -n 5000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import time
import types
import uuid
from typing import Any

from app.sdk import PrismClient

REDIS = "redis://127.0.0.1:6379/0"
NATS = "nats://127.0.0.1:4222"
PG = "postgresql://postgres@127.0.0.1:5432/test"

PAYLOAD = {
    "order_id": "ord-000123456", "customer_id": "cus-98765", "currency": "EUR", "total": 1234.56,
    "status": "created", "channel": "web", "items": [
        {"sku": f"SKU-{i:05d}", "qty": i % 3 + 1, "price": 19.99 + i, "name": f"Item number {i} of the order"}
        for i in range(5)
    ],
    "shipping": {"street": "Musterstrasse 1", "city": "Berlin", "zip": "10115", "country": "DE"},
}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50_us": round(percentile(samples, 50), 1), "p99_us": round(percentile(samples, 99), 1),
            "mean_us": round(statistics.fmean(samples), 1)}


def with_metadata(client: PrismClient, topic: str) -> Any:
    """A publish of the bare payload carrying the binding's metadata copies (PostgreSQL: the
    envelope's row itself, built once)."""
    from app.bindings import kafka as kb
    from app.bindings import nats as nb
    from app.bindings import redis as rb
    from app.envelope.codec import Layout

    env = client.build_envelope(topic, PAYLOAD)
    backend = client.backend
    if backend.scheme == "kafka":
        headers = kb.headers_for(env, Layout.REVIEWED)

        async def send(value: bytes) -> None:
            await backend._producer.send_and_wait(topic, value, headers=headers)
    elif backend.scheme == "redis":
        fields = rb.encode_stream_fields(env, Layout.REVIEWED)

        async def send(value: bytes) -> None:
            await backend.client.xadd(backend.key(topic), {**fields, "envelope": value})
    elif backend.scheme == "nats":
        headers = nb.encode(env, Layout.REVIEWED).headers

        async def send(value: bytes) -> None:
            await backend.js.publish(topic, value, headers=headers)
    else:  # PostgreSQL: the envelope's whole row (JSONB document) built once, a fresh message_id per insert
        from app.bindings import postgres as pgb
        from app.sdk.backends.postgres import INSERT_NOTIFY_SQL

        row = list(pgb.encode(env).params())
        ids = itertools.count()
        prefix = uuid.uuid4().hex[:8]

        async def send(value: bytes) -> None:
            row[0] = f"{prefix}-{next(ids)}"
            async with backend._pub_lock:
                await backend._pub.execute(INSERT_NOTIFY_SQL, row)
    return send


class _ConfirmingProducer:
    """Stands in for aiokafka's producer in the hot loop: `send` returns a future that is
    already done, so a publish runs to its end without I/O and without yielding."""

    def __init__(self) -> None:
        self._md = types.SimpleNamespace(partition=0, offset=0)

    async def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None,
                   timestamp_ms: int | None = None, headers: Any = None) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        future.set_result(self._md)
        return future

    async def send_and_wait(self, *args: Any, **kwargs: Any) -> Any:
        return await (await self.send(*args, **kwargs))


def _run(coro: Any) -> Any:
    """Drive a coroutine that never suspends (`_ConfirmingProducer`) to its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("the coroutine suspended")


def publish_cpu(client: PrismClient, topic: str) -> Any:
    """What `client.publish(topic, PAYLOAD)` computes before its I/O call, as a function:
    the envelope, the `Outgoing` and the backend's native record (same methods as publish).
    Kafka (issue 29): `publish` itself, whole, against `_ConfirmingProducer` (the caller
    installs it): the direct path's own code, coroutines included."""
    from app.sdk.options import DEFAULT_OPTIONS

    backend = client.backend
    if backend.scheme == "kafka":
        return lambda: _run(client.publish(topic, PAYLOAD))
    encode = {"redis": lambda b: b._fields, "nats": lambda b: b._message,
              "postgresql": lambda b: b._row}[backend.scheme](backend)

    def run() -> Any:
        env, plain, wire = client._build(topic, PAYLOAD, DEFAULT_OPTIONS)
        return encode(client._outgoing(env, DEFAULT_OPTIONS, plain, wire))
    return run


def envelope_cpu_us(client: PrismClient, topic: str) -> dict[str, float]:
    """Hot-loop CPU of building + encoding one envelope exactly as `publish` does (no I/O),
    against `json.dumps` alone, which the bare path pays too: the floor of the overhead; the
    I/O-interleaved loop pays it with colder caches (see `pre_io` for what it costs there).
    On Kafka both sides are whole publishes against `_ConfirmingProducer`: the SDK's
    `publish` and the raw path's `send_and_wait(topic, json.dumps(payload))`."""
    from bench._timing import compare_us

    backend = client.backend
    if backend.scheme == "kafka":
        real, backend._producer = backend._producer, _ConfirmingProducer()
        try:
            send = backend._producer.send_and_wait
            times = compare_us({
                "json": lambda: _run(send(topic, json.dumps(PAYLOAD, separators=(",", ":")).encode())),
                "envelope": publish_cpu(client, topic),
            })
        finally:
            backend._producer = real
    else:
        times = compare_us({
            "json": lambda: json.dumps(PAYLOAD, separators=(",", ":")).encode(),
            "envelope": publish_cpu(client, topic),
        })
    return {"json_us": round(times["json"], 1), "envelope_us": round(times["envelope"], 1),
            "added_us": round(times["envelope"] - times["json"], 1)}


def stamp_target(client: PrismClient) -> tuple[Any, str]:
    """(object, method name) of the backend library's send call that every path ends in."""
    backend = client.backend
    # Kafka: aiokafka's `send`, which `send_and_wait` calls and the SDK's direct path calls itself.
    owner_attr, name = {"kafka": ("_producer", "send"), "redis": ("client", "xadd"),
                        "nats": ("js", "publish"), "postgresql": ("_pub", "execute")}[backend.scheme]
    return getattr(backend, owner_attr), name


def stamp_io(owner: Any, name: str, stamp: list[int]) -> None:
    """Wrap the backend library's send call (the one every path ends in: `stamp_target`, and
    the raw producer's `send`) so it records when it was entered in `stamp`:
    `[perf_counter_ns, thread_time_ns]`. Time from the start of a publish to that stamp is the
    Python work before the I/O; the wrapper costs every path the same (the raw producer's
    too: before issue 29's last change it was unwrapped, and the envelope path paid the
    wrapper's coroutine alone)."""
    original = getattr(owner, name)
    wall, cpu = time.perf_counter_ns, time.thread_time_ns

    async def stamped(*args: Any, **kwargs: Any) -> Any:
        stamp[0], stamp[1] = wall(), cpu()
        return await original(*args, **kwargs)

    setattr(owner, name, stamped)


async def measure(url: str, n: int, warmup: int) -> dict[str, Any]:
    topic = f"bench.sdk.{uuid.uuid4().hex[:10]}"
    bare_topic, meta_topic = topic + ".bare", topic + ".meta"
    samples: dict[str, list[float]] = {"bare": [], "bare+meta": [], "envelope": []}
    async with PrismClient(url, namespace="bench") as client:
        await client.publish(topic, PAYLOAD)  # creates topics/streams before timing
        await client.publish_bytes(bare_topic, b"{}")
        await client.publish_bytes(meta_topic, b"{}")
        meta = with_metadata(client, meta_topic)
        clock = time.perf_counter_ns

        async def bare() -> None:
            await client.publish_bytes(bare_topic, json.dumps(PAYLOAD, separators=(",", ":")).encode())

        async def envelope() -> None:
            await client.publish(topic, PAYLOAD)

        async def bare_meta() -> None:
            await meta(json.dumps(PAYLOAD, separators=(",", ":")).encode())

        paths = {"bare": bare, "envelope": envelope, "bare+meta": bare_meta}
        raw_producer = None
        if client.backend.scheme == "kafka":
            from aiokafka import AIOKafkaProducer

            backend = client.backend
            raw_topic = topic + ".raw"
            raw_producer = AIOKafkaProducer(bootstrap_servers=backend.bootstrap, acks=backend.acks,
                                            linger_ms=0, enable_idempotence=False)
            await raw_producer.start()
            await raw_producer.send_and_wait(raw_topic, b"{}")
            raw_send = raw_producer.send_and_wait

            async def raw() -> None:
                await raw_send(raw_topic, json.dumps(PAYLOAD, separators=(",", ":")).encode())
            paths["raw"] = raw
            samples["raw"] = []
        order = list(paths)
        pre_io: dict[str, list[float]] = {name: [] for name in paths}
        pre_io_cpu: dict[str, list[float]] = {name: [] for name in paths}
        stamp_original = getattr(*stamp_target(client))
        stamp = [0, 0]
        stamp_io(*stamp_target(client), stamp)
        if raw_producer is not None:  # the raw path pays the same wrapper, on its own producer
            stamp_io(raw_producer, "send", stamp)
        cpu = time.thread_time_ns
        rng = random.Random(7)
        for i in range(warmup + n):
            rng.shuffle(order)  # no path always runs right after another (server-side after-effects)
            for name in order:
                c0 = cpu()
                t0 = clock()
                await paths[name]()
                if i >= warmup:
                    samples[name].append((clock() - t0) / 1000)
                    pre_io[name].append((stamp[0] - t0) / 1000)
                    pre_io_cpu[name].append((stamp[1] - c0) / 1000)
        if raw_producer is not None:
            await raw_producer.stop()
        setattr(*stamp_target(client), stamp_original)
        hot_loop = envelope_cpu_us(client, topic)  # connected: the Kafka loop runs `publish` itself
        await cleanup(client, [topic, bare_topic, meta_topic])
    out: dict[str, Any] = {name: summary(v) for name, v in samples.items() if v}
    b, e = out["bare"], out["envelope"]
    out["n"] = n
    out["overhead_pct"] = {k.replace("_us", ""): round((e[k] - b[k]) / b[k] * 100, 1) for k in b}
    out["overhead_us"] = {k.replace("_us", ""): round(e[k] - b[k], 1) for k in b}
    if "raw" in out:
        r = out["raw"]
        out["overhead_vs_raw_pct"] = {k.replace("_us", ""): round((e[k] - r[k]) / r[k] * 100, 1) for k in r}
        out["overhead_vs_raw_us"] = {k.replace("_us", ""): round(e[k] - r[k], 1) for k in r}
    out["pre_io_p50_us"] = {name: round(percentile(v, 50), 1) for name, v in pre_io.items() if v}
    out["pre_io_cpu_p50_us"] = {name: round(percentile(v, 50), 1) for name, v in pre_io_cpu.items() if v}
    out["envelope_pre_io_added_us"] = round(percentile(pre_io_cpu["envelope"], 50)
                                            - percentile(pre_io_cpu["bare"], 50), 1)
    if "raw" in pre_io_cpu:  # issue 29: the SDK's CPU before aiokafka's send, over the raw producer's
        out["envelope_pre_io_vs_raw_us"] = round(percentile(pre_io_cpu["envelope"], 50)
                                                 - percentile(pre_io_cpu["raw"], 50), 1)
    out["cpu_hot_loop"] = hot_loop
    return out


async def cleanup(client: PrismClient, topics: list[str]) -> None:
    backend = client.backend
    if backend.scheme == "redis":
        await backend.client.delete(*[backend.key(t) for t in topics])
    elif backend.scheme == "nats":
        for t in topics:
            name = await backend.stream_for(t, create=False)
            if name:
                await backend.js.delete_stream(name)
    elif backend.scheme == "postgresql":
        await backend._pub.execute("DROP SCHEMA IF EXISTS " + backend.schema + " CASCADE")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="kafka,redis")
    ap.add_argument("-n", type=int, default=3000, help="publishes per path and backend")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args()

    results: dict[str, Any] = {}
    broker = None
    try:
        for name in args.backends.split(","):
            if name == "kafka":
                from app.broker.embedded import EmbeddedBroker

                broker = EmbeddedBroker().start()
                url = f"kafka://{broker.bootstrap}"
            else:
                url = {"redis": REDIS, "nats": NATS + "?storage=memory&stream_prefix=BENCH",
                       "postgres": PG + f"?schema=bench_sdk_{uuid.uuid4().hex[:8]}"}[name]
            load_before = os.getloadavg()[0]
            results[name] = await measure(url, args.n, args.warmup)
            r = results[name]
            r["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            meta = f" | bare+meta p50 {r['bare+meta']['p50_us']:7.1f}  p99 {r['bare+meta']['p99_us']:7.1f}"
            print(f"{name:9s} bare p50 {r['bare']['p50_us']:7.1f}  p99 {r['bare']['p99_us']:7.1f} | "
                  f"envelope p50 {r['envelope']['p50_us']:7.1f}  p99 {r['envelope']['p99_us']:7.1f}{meta} (µs) | "
                  f"overhead p50 {r['overhead_pct']['p50']:+5.1f}% ({r['overhead_us']['p50']:+.0f} µs)  "
                  f"p99 {r['overhead_pct']['p99']:+5.1f}% ({r['overhead_us']['p99']:+.0f} µs)  "
                  f"mean {r['overhead_pct']['mean']:+5.1f}% | envelope CPU before I/O "
                  f"+{r['envelope_pre_io_added_us']} µs, hot loop +{r['cpu_hot_loop']['added_us']} µs | "
                  f"load {r['loadavg_1m'][0]}-{r['loadavg_1m'][1]}"
                  + (f" | raw aiokafka p50 {r['raw']['p50_us']:7.1f}, envelope vs raw p50 "
                     f"{r['overhead_vs_raw_pct']['p50']:+5.1f}% ({r['overhead_vs_raw_us']['p50']:+.0f} µs), "
                     f"CPU before send vs raw +{r['envelope_pre_io_vs_raw_us']} µs"
                     if "raw" in r else ""),
                  flush=True)
            if broker is not None:
                broker.stop()
                broker = None
    finally:
        if broker is not None:
            broker.stop()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    asyncio.run(main())
