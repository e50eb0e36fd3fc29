"""Where a worker's per-message latency goes: the worker `prism run` runs, with timestamps taken
at each step of a source record's way through it (issue 29, "added p99 latency").

    PRISM_LATENCY_TRACE=out.json python -m app.worker.faust_app bench._latency_trace:app_from_env

``bench_release --latency --trace`` starts its latency workers this way (``PRISM_TRACE_SAMPLE=N``
in its environment traces one record in N: `SAMPLE_ENV`). Nothing in app/ changes:
the steps are wrapped here, so the traced worker runs the shipped code between them. Per source
record (topic, partition, offset), wall-clock seconds:

* ``produced`` - the record's timestamp (CreateTime: the load client's producer sets it at send);
* ``received`` - its fetch response parsed by aiokafka in Faust's consumer thread (the
  `FetchResult` holding it created): broker, network and the consumer thread's turn; split at
  the send of the fetch request that brought it (``requested``, aiokafka's
  `_proc_fetch_request` task started) into "waiting for a fetch" (aiokafka keeps one fetch in
  flight per broker connection) and "answer" (the broker's long poll, reading and parsing);
* ``drained`` - handed out of aiokafka's buffer to Faust's `getmany` (`FetchResult.getall`,
  still in the consumer thread): how long the fetched records waited for the main loop to ask;
* ``resumed`` - Faust's `_wait_next_records` returned in the worker's event loop: the hop back
  from the consumer thread (`call_soon_threadsafe`, the GIL, the loop's other work);
* ``fetched`` - appended to the batch source's buffer (`BatchBuffer.put`);
* ``taken`` - its batch taken from the buffer (`BatchBuffer.take` returned);
* ``chained`` - its batch through the chain, signed and fitted (`BatchRunner.start` returned);
* ``written`` - every output of its batch acknowledged by the broker (`write_all` returned,
  at_least_once; the transaction's commit under exactly_once);
* ``acked`` - its offset acknowledged to Faust (`ack_all` / `release_all`).

Also Faust's offset commits (start, duration), and how many of the records that took over 50 ms
from produce to fetch were fetched during a commit or just after it.

The file (rewritten every ~2 s and at exit) holds, per consecutive pair of steps and from
``produced`` to each step, p50/p90/p99/max in ms over the records that passed both.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import gc
import itertools
import json
import os
import statistics
import threading
import time
from typing import Any

import faust

TRACE_ENV = "PRISM_LATENCY_TRACE"
#: seconds: `sys.setswitchinterval` in the traced worker (an experiment knob; default Python's 5 ms)
SWITCH_ENV = "PRISM_TRACE_SWITCH_INTERVAL"
#: ms: the traced worker's fetch_max_wait_ms on the embedded broker (an experiment knob; default 20,
#: app/worker/offsets.py EMBEDDED_FETCH_MAX_WAIT_MS)
FETCH_WAIT_ENV = "PRISM_TRACE_FETCH_MAX_WAIT_MS"
#: "1": an experiment - the consumer thread drains aiokafka's buffer as records arrive (a pump
#: task in the thread) and Faust's getmany takes them from there, so a partition's next fetch is
#: not held back until the worker's loop asks. Steady state only: no rebalance handling.
EAGER_ENV = "PRISM_TRACE_EAGER_DRAIN"
#: N: trace one source record in N (those whose offset is a multiple of N; default 1, every one).
#: Why: the full trace stamps every record at every step (dicts built and looked up under a
#: lock, in both threads), which at half of the Apache Kafka backlog maximum is more than the
#: worker has spare (a traced run fell behind, BENCHMARKS.md "Added latency on a quiet
#: machine"); a tail round can only be attributed by a trace that leaves the worker its pace. Percentiles over 1 in N records of a
#: stream whose offsets are not chosen by latency are the stream's, with 1/N of the samples.
SAMPLE_ENV = "PRISM_TRACE_SAMPLE"
_every = max(1, int(os.environ.get(SAMPLE_ENV, "1") or "1"))
STEPS = ("produced", "received", "drained", "resumed", "fetched", "taken", "chained", "written", "acked")

_marks: dict[tuple[str, int, int], dict[str, float]] = {}
#: the steps before ``fetched`` (received, drained, resumed), merged into _marks at the put
#: the fetch request in flight in this task of aiokafka's fetcher: when it was sent
#: the consumer thread's event loop lag (as _lags for the worker's loop) and its probe task
_thread_lags: list[tuple[float, float]] = []
_thread_probe: list[Any] = []
#: (topic, partition) -> when each fetch request that asked for it was sent (ascending)
_fetch_sent: dict[tuple[str, int], list[float]] = {}
_requested: contextvars.ContextVar[float | None] = contextvars.ContextVar("prism_fetch_requested", default=None)
_pre: dict[tuple[str, int, int], dict[str, float]] = {}
_lock = threading.Lock()
#: per batch, in take order: [taken, chained, written] (0.0 until reached)
_batches: list[list[float]] = []
_batch_of: dict[int, int] = {}  # id(first Faust message of a batch) -> index in _batches
#: garbage collections: (generation, ms, when) and event-loop lag (how late a 5 ms sleep woke,
#: ms, when); only those after the first record was fetched are summarised (not start-up's)
_gcs: list[tuple[int, float, float]] = []
_lags: list[tuple[float, float]] = []
_first_fetch: list[float] = []
#: Faust's offset commits: (start, end) wall-clock seconds
_commits: list[tuple[float, float]] = []
#: at each take: how long the oldest buffered record had waited for the taker to ask (ms)
_late_take: list[float] = []


def _key(m: Any) -> tuple[str, int, int]:
    return (m.topic, m.partition, m.offset)


def _traced(offset: int) -> bool:
    return _every == 1 or offset % _every == 0


def _stamp(messages: Any, step: str, now: float | None = None) -> None:
    now = time.time() if now is None else now
    for m in messages:
        if not _traced(m.offset):
            continue
        d = _marks.get(_key(m))
        if d is not None and step not in d:
            d[step] = now


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(len(values) * q) - 1))]


def summary() -> dict[str, Any]:
    with _lock:
        rows = [dict(d) for d in _marks.values()]
    out: dict[str, Any] = {"records": len(rows), "sampled_one_in": _every}
    pairs = list(itertools.pairwise(STEPS)) + [("produced", s) for s in STEPS[2:]]
    for a, b in pairs:
        vals = [(r[b] - r[a]) * 1000 for r in rows if a in r and b in r]
        if vals:
            out[f"{a}->{b}"] = {"n": len(vals), "p50": round(statistics.median(vals), 1),
                                "p90": round(_pct(vals, 0.9), 1), "p99": round(_pct(vals, 0.99), 1),
                                "max": round(max(vals), 1)}
    # produced->received, split at the send of the fetch request that brought the record: how
    # long it waited for a fetch to be sent (one in flight per broker connection; the consumer
    # thread's turn), and from then (or from its produce, if later) to the parsed response
    waits = [(r["requested"] - r["produced"]) * 1000 for r in rows if "requested" in r and "received" in r]
    answers = [(r["received"] - max(r["produced"], r["requested"])) * 1000
               for r in rows if "requested" in r and "received" in r]
    for name, vals in (("produced->request_sent(waiting for a fetch)", [max(0.0, v) for v in waits]),
                       ("request_sent_or_produced->received(answer)", answers)):
        if vals:
            out[name] = {"n": len(vals), "p50": round(statistics.median(vals), 1), "p90": round(_pct(vals, 0.9), 1),
                         "p99": round(_pct(vals, 0.99), 1), "max": round(max(vals), 1)}

    # Why the wait: was a fetch for the partition sent between the produce and the request that
    # brought the record (then the record was not in the broker yet: the load client's produce
    # path, the broker's write) or none (aiokafka had no fetch of it out: one in flight per
    # connection, the partition's records still in its buffer, the consumer thread's turn)?
    import bisect

    sent = {tp: sorted(ts) for tp, ts in list(_fetch_sent.items())}
    no_fetch: list[float] = []
    not_there: list[float] = []
    for key, r in ((k, r) for k, r in list(_marks.items()) if "requested" in r):
        wait = (r["requested"] - r["produced"]) * 1000
        if wait <= 0:
            continue
        ts = sent.get((key[0], key[1]), [])
        i = bisect.bisect_right(ts, r["produced"])
        earlier = i < len(ts) and ts[i] < r["requested"] - 1e-6
        (not_there if earlier else no_fetch).append(wait)
    for name, vals in (("wait: no fetch of the partition sent", no_fetch),
                       ("wait: fetches sent, record not in the broker yet", not_there)):
        if vals:
            out[name] = {"n": len(vals), "p50": round(statistics.median(vals), 1), "p90": round(_pct(vals, 0.9), 1),
                         "p99": round(_pct(vals, 0.99), 1), "max": round(max(vals), 1),
                         "over_20ms": sum(1 for v in vals if v > 20)}

    def dist(vals: list[float]) -> dict[str, float]:
        if not vals:
            return {"n": 0}
        return {"n": len(vals), "p50": round(statistics.median(vals), 1), "p99": round(_pct(vals, 0.99), 1),
                "max": round(max(vals), 1), "sum": round(sum(vals), 1)}

    since = _first_fetch[0] if _first_fetch else float("inf")
    out["loop_lag_ms"] = dist([ms for ms, t in list(_lags) if t >= since])
    out["consumer_thread_loop_lag_ms"] = dist([ms for ms, t in list(_thread_lags) if t >= since])
    # per partition, the time between two fetch requests that asked for it
    gaps = [(b - a) * 1000 for ts in sent.values() for a, b in itertools.pairwise(t for t in ts if t >= since)]
    out["fetch_request_gap_per_partition_ms"] = dist(gaps)
    out["late_take_ms"] = dist(list(_late_take))
    for gen in (0, 1, 2):
        out[f"gc{gen}_ms"] = dist([ms for g, ms, t in list(_gcs) if g == gen and t >= since])
    commits = [(a, b) for a, b in list(_commits) if a >= since]
    out["commits_ms"] = dist([(b - a) * 1000 for a, b in commits])
    # the fetch tail: of the records that took > 50 ms from produce to fetch, how many were
    # fetched during a commit or within 50 ms after it ended
    slow = [r for r in rows if "fetched" in r and (r["fetched"] - r["produced"]) > 0.05]
    near = sum(1 for r in slow if any(a <= r["fetched"] <= b + 0.05 for a, b in commits))
    at = sorted(round(r["fetched"] - since, 2) for r in slow)  # seconds after the first fetch
    out["slow_fetches"] = {"over_50ms": len(slow), "during_or_just_after_a_commit": near,
                           "seconds_after_first_fetch": sorted(set(at))[:40]}
    batches = [b for b in list(_batches) if all(b)]
    if len(batches) > 1:
        # pipelining: was the next batch through the chain before this one's outputs were written?
        overlapped = sum(1 for a, b in itertools.pairwise(batches) if b[1] < a[2])
        out["batches"] = {"n": len(batches), "next_chained_before_written": overlapped}
    sizes = [r["batch"] for r in rows if "batch" in r]
    if sizes:
        out["batch_size_seen_by_record"] = {"p50": statistics.median(sizes), "max": max(sizes)}
    return out


def _dump(path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(summary(), f, indent=1)
    os.replace(tmp, path)


def install(path: str) -> None:
    """Wrap the steps (see the module docstring); write the summary to `path`."""
    from app.worker import at_least_once, exactly_once
    from app.worker.at_least_once import AtLeastOnce
    from app.worker.batch_runner import BatchRunner
    from app.worker.batch_source import BatchBuffer

    put, take, start, write_all = BatchBuffer.put, BatchBuffer.take, BatchRunner.start, AtLeastOnce.write_all
    ack_all, release_all = at_least_once.ack_all, exactly_once.release_all

    def traced_put(self: Any, message: Any) -> None:
        now = time.time()
        if not _first_fetch:
            _first_fetch.append(now)
        if not _traced(message.offset):
            put(self, message)
            return
        key = _key(message)
        with _lock:
            d = _pre.pop(key, {})
            d["produced"], d["fetched"] = message.timestamp, now
            _marks[key] = d
        put(self, message)

    async def traced_take(self: Any, max_n: int, within: float, **kw: Any) -> list[Any]:
        if self._items:
            d = _marks.get(_key(self._items[0]))
            if d is not None:
                _late_take.append((time.time() - d["fetched"]) * 1000)
        batch = await take(self, max_n, within, **kw)
        _stamp(batch, "taken")
        if batch:
            _batch_of[id(batch[0])] = len(_batches)
            _batches.append([time.time(), 0.0, 0.0])
        for m in batch:
            d = _marks.get(_key(m)) if _traced(m.offset) else None
            if d is not None:
                d["batch"] = len(batch)
        return batch

    async def traced_start(self: Any, chain: Any, batch: list[Any], previous: Any) -> Any:
        finish = await start(self, chain, batch, previous)
        _stamp(batch, "chained")
        i = _batch_of.get(id(batch[0])) if batch else None
        if i is not None:
            _batches[i][1] = time.time()

            async def written_then(finish: Any = finish, i: int = i) -> None:
                try:
                    await finish
                finally:
                    _batches[i][2] = time.time()
            return written_then()
        return finish

    async def traced_write_all(self: Any, chain: Any, producer: Any, pending: list[Any], **kw: Any) -> Any:
        out = await write_all(self, chain, producer, pending, **kw)
        _stamp((m for m, _ in pending), "written")
        return out

    def traced_ack_all(consumer: Any, messages: Any) -> int:
        messages = list(messages)
        _stamp(messages, "acked")
        return ack_all(consumer, messages)

    def traced_release_all(consumer: Any, messages: Any) -> None:
        messages = list(messages)
        now = time.time()
        _stamp(messages, "written", now)  # the transaction committed just before
        _stamp(messages, "acked", now)
        release_all(consumer, messages)

    from faust.transport.consumer import Consumer

    commit = Consumer.commit

    async def traced_commit(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time()
        try:
            return await commit(self, *args, **kwargs)
        finally:
            _commits.append((t0, time.time()))

    Consumer.commit = traced_commit  # type: ignore[method-assign]

    # the fetch, split: aiokafka's FetchResult (consumer thread) and Faust's wait in the loop
    from aiokafka.consumer.fetcher import FetchResult

    fr_init, fr_getall, wait_next = FetchResult.__init__, FetchResult.getall, Consumer._wait_next_records

    from aiokafka.consumer.fetcher import Fetcher

    proc_fetch = Fetcher._proc_fetch_request

    async def traced_proc_fetch(self: Any, assignment: Any, node_id: Any, request: Any) -> Any:
        now = time.time()
        if not _thread_probe:  # the consumer thread's loop: how late it wakes a 5 ms sleep
            _thread_probe.append(asyncio.get_running_loop().create_task(lag_probe(_thread_lags)))
        _requested.set(now)  # this fetch request's task: sent now
        with _lock:
            for topic, partitions in request.topics:
                for partition, *_ in partitions:
                    _fetch_sent.setdefault((topic, partition), []).append(now)
        return await proc_fetch(self, assignment, node_id, request)

    def traced_fr_init(self: Any, *args: Any, **kwargs: Any) -> None:
        fr_init(self, *args, **kwargs)
        self._prism_t = time.time()
        self._prism_req = _requested.get()

    def traced_getall(self: Any, max_records: Any = None) -> Any:
        out = fr_getall(self, max_records)
        if out:
            now, t = time.time(), getattr(self, "_prism_t", None)
            with _lock:
                req = getattr(self, "_prism_req", None)
                for r in out:
                    if not _traced(r.offset):
                        continue
                    d = _pre[(r.topic, r.partition, r.offset)] = {"received": t or now, "drained": now}
                    if req is not None:
                        d["requested"] = req
        return out

    async def traced_wait_next(self: Any, timeout: float) -> Any:
        records, active = await wait_next(self, timeout)
        if records:
            now = time.time()
            with _lock:
                for tp, recs in records.items():
                    for r in recs:
                        if not _traced(r.offset):
                            continue
                        d = _pre.get((tp.topic, tp.partition, r.offset))
                        if d is not None:
                            d["resumed"] = now
        return records, active

    Fetcher._proc_fetch_request = traced_proc_fetch  # type: ignore[method-assign]
    FetchResult.__init__ = traced_fr_init  # type: ignore[method-assign]
    FetchResult.getall = traced_getall  # type: ignore[method-assign]
    Consumer._wait_next_records = traced_wait_next  # type: ignore[method-assign]
    BatchBuffer.put = traced_put  # type: ignore[method-assign]
    BatchBuffer.take = traced_take  # type: ignore[method-assign]
    BatchRunner.start = traced_start  # type: ignore[method-assign]
    AtLeastOnce.write_all = traced_write_all  # type: ignore[method-assign]
    at_least_once.ack_all = traced_ack_all
    exactly_once.release_all = traced_release_all

    def every_2s() -> None:
        while True:
            time.sleep(2)
            _dump(path)

    def on_gc(phase: str, info: dict[str, int], t: list[float] = [0.0]) -> None:  # noqa: B006
        if phase == "start":
            t[0] = time.perf_counter()
        else:
            _gcs.append((info["generation"], (time.perf_counter() - t[0]) * 1000, time.time()))

    gc.callbacks.append(on_gc)
    threading.Thread(target=every_2s, daemon=True, name="latency-trace").start()
    atexit.register(_dump, path)


def app_from_env() -> faust.App:
    """`app.worker.pipeline.app_from_env`, traced when PRISM_LATENCY_TRACE names a file."""
    from app.worker.pipeline import app_from_env as shipped

    path = os.environ.get(TRACE_ENV)
    if path:
        install(path)
    if os.environ.get(SWITCH_ENV):  # an experiment: the GIL hand-over between the consumer thread and the loop
        import sys

        sys.setswitchinterval(float(os.environ[SWITCH_ENV]))
    if os.environ.get(FETCH_WAIT_ENV):  # an experiment: the embedded broker's fetch long-poll bound
        from app.worker import offsets

        offsets.EMBEDDED_FETCH_MAX_WAIT_MS = int(os.environ[FETCH_WAIT_ENV])
    if os.environ.get(EAGER_ENV) == "1":
        install_eager_drain()
    app = shipped()
    if path:
        app.task(worker_lag_probe)
    return app


async def lag_probe(into: list[tuple[float, float]] | None = None) -> None:
    """How late an event loop (the worker's; with `into`, the consumer thread's) wakes a 5 ms
    sleep: its stalls (a long callback, GC, the GIL held by the other thread)."""
    lags = _lags if into is None else into
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(0.005)
        lags.append(((time.perf_counter() - t0) * 1000 - 5, time.time()))


async def worker_lag_probe() -> None:
    """`lag_probe` on the worker's loop (a Faust app task: takes no argument, or Faust passes the app)."""
    await lag_probe()


def install_eager_drain() -> None:
    """The `EAGER_ENV` experiment (bench only): Faust's `_fetch_records` (run in the consumer
    thread for each `getmany` of the worker's loop) takes records from a list that a pump task in
    the same thread fills from aiokafka as soon as they arrive."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    async def fetch_records(self: Any, consumer: Any, active_partitions: Any, timeout: float | None = None,
                            max_records: int | None = None) -> Any:
        if not self.consumer.flow_active:
            return {}
        st = getattr(self, "_prism_eager", None)
        if st is None:
            st = self._prism_eager = {"buf": {}, "ev": asyncio.Event(), "active": active_partitions}

            async def pump() -> None:
                fetcher = consumer._fetcher
                while not (consumer._closed or fetcher._closed):
                    if not self.consumer.flow_active:
                        await asyncio.sleep(0.005)
                        continue
                    with fetcher._subscriptions.fetch_context():
                        got = await fetcher.fetched_records(st["active"], timeout=1.0)
                    for tp, recs in got.items():
                        st["buf"].setdefault(tp, []).extend(recs)
                    if got:
                        st["ev"].set()

            st["task"] = asyncio.get_running_loop().create_task(pump())
        st["active"] = active_partitions
        if not st["buf"]:
            st["ev"].clear()
            try:
                await asyncio.wait_for(st["ev"].wait(), timeout)
            except TimeoutError:
                return {}
        out, st["buf"] = st["buf"], {}
        return out

    AIOKafkaConsumerThread._fetch_records = fetch_records  # type: ignore[method-assign]
