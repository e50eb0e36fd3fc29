"""Where exactly_once's added latency goes (issue 29): each step of a record's way through a
transaction, timed in the worker, joined with the moment the `read_committed` reader saw it.

``bench_transactions --rounds 0 --latency-rate 700 --trace out.json`` installs this in its
in-process latency workers (both modes; the at_least_once worker gives the steps it shares).
Nothing in app/ changes: the steps are wrapped here, on top of bench/_latency_trace.py's
(produced, fetched, taken, chained, ...). Per exactly_once batch (one source partition, one
transaction), wall-clock seconds:

* ``ready`` - `ExactlyOnce._finish` entered: the batch is through the chain, signed and fitted;
* ``previous_done`` - the previous batch of its partition has committed (a partition's
  transactions run in order);
* ``begun`` - `begin_transaction` returned;
* ``sent`` - every output, DLQ and changelog record of the batch acknowledged by the broker
  (the transaction's body returned; includes `AddPartitionsToTxn`);
* ``offsets_sent`` - `send_offsets_to_transaction` returned (`AddOffsetsToTxn` +
  `TxnOffsetCommit`; since issue 29 they run alongside the writes, so this step is the part of
  them that outlasted the writes - or is missing when they finished first);
* ``committed`` - `commit_transaction` returned (`EndTxn` answered);
* ``visible`` - per record, the reader's `getmany` returned it (bench/_latency_client.py writes
  (bench-sent header, seen) pairs to the file named by `BENCH_SEEN_FILE`; joined here on the
  header the worker copies onto the outputs).

And per coordinator request aiokafka's sender made (`AddPartitionsToTxn`, `AddOffsetsToTxn`,
`TxnOffsetCommit`, `EndTxn`): how long the round trip took and how often it was answered with
a retriable error (then aiokafka sleeps a backoff: 20 ms for `CONCURRENT_TRANSACTIONS` right
after a commit, `retry_backoff_ms` = 100 ms otherwise), with the error names seen.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import _latency_trace

#: per batch: {"records": [bench-sent header values], "n": size, "partition": p, step: wall-clock s}
_txns: list[dict[str, Any]] = []
#: (request name, ms, ok) per coordinator request handled by aiokafka's sender
_requests: list[tuple[str, float, bool]] = []
_errors: Counter[str] = Counter()
_row: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("prism_eos_row", default=None)


def _header(m: Any, name: str = "bench-sent") -> str | None:
    headers = getattr(m, "headers", None) or []
    items = headers.items() if isinstance(headers, dict) else headers
    for k, v in items:
        if k == name:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def install() -> None:
    """Wrap the steps (module docstring) on top of `_latency_trace.install`'s."""
    from aiokafka.producer import sender as sender_mod

    from app.worker import exactly_once as eo
    from app.worker.transactions import PartitionProducers

    finish, run = eo.ExactlyOnce._finish, PartitionProducers.run

    async def traced_finish(self: Any, batch: Any, previous: Any, end: Any) -> None:
        row: dict[str, Any] = {"ready": time.time(), "n": len(batch.records),
                               "partition": batch.records[0].partition,
                               "records": [_header(m) for m in batch.records]}
        _txns.append(row)
        _row.set(row)  # this batch's task: read by traced_run (its transaction runs in it)
        if previous is not None:
            inner = previous

            async def timed_previous() -> None:
                try:
                    await inner
                finally:
                    row["previous_done"] = time.time()
            previous = timed_previous()
        else:
            row["previous_done"] = row["ready"]
        await finish(self, batch, previous, end)

    async def traced_run(self: Any, producer: Any, body: Any, *args: Any, **kw: Any) -> None:
        row = _row.get()
        if row is None:
            row = {}
        begin, send_offsets, commit = (producer.begin_transaction, producer.send_offsets_to_transaction,
                                       producer.commit_transaction)

        async def t_begin() -> None:
            await begin()
            row["begun"] = time.time()

        async def t_body(*a: Any) -> Any:  # (handed_over) since issue 29, () before
            out = await body(*a)
            row["sent"] = time.time()
            return out

        async def t_offsets(offsets: Any, gid: str) -> None:
            await send_offsets(offsets, gid)
            row["offsets_sent"] = time.time()

        async def t_commit() -> None:
            await commit()
            row["committed"] = time.time()

        producer.begin_transaction, producer.send_offsets_to_transaction = t_begin, t_offsets
        producer.commit_transaction = t_commit
        try:
            await run(self, producer, t_body, *args, **kw)
        finally:
            del producer.begin_transaction, producer.send_offsets_to_transaction, producer.commit_transaction

    eo.ExactlyOnce._finish = traced_finish  # type: ignore[method-assign]
    PartitionProducers.run = traced_run  # type: ignore[method-assign]

    for cls_name in ("AddPartitionsToTxnHandler", "AddOffsetsToTxnHandler", "TxnOffsetCommitHandler",
                     "EndTxnHandler"):
        cls = getattr(sender_mod, cls_name)
        do, handle = cls.do, cls.handle_response

        async def traced_do(self: Any, node_id: Any, _do: Any = do, _name: str = cls_name) -> Any:
            t0 = time.perf_counter()
            ok = await _do(self, node_id)
            _requests.append((_name.removesuffix("Handler"), (time.perf_counter() - t0) * 1000, bool(ok)))
            return ok

        def traced_handle(self: Any, resp: Any, _handle: Any = handle, _name: str = cls_name) -> Any:
            out = _handle(self, resp)
            if out is not None:
                _errors[f"{_name.removesuffix('Handler')}: {_errors_in(resp)} -> backoff {out * 1000:.0f} ms"] += 1
            return out

        cls.do, cls.handle_response = traced_do, traced_handle


def _errors_in(resp: Any) -> str:
    from aiokafka import errors as Errors

    codes: set[int] = set()
    if hasattr(resp, "error_code"):
        codes.add(resp.error_code)
    for field in ("errors", "topics"):
        for _topic, parts in getattr(resp, field, []) or []:
            for part in parts:
                codes.add(part[-1])
    return ",".join(sorted(Errors.for_code(c).__name__ for c in codes if c)) or "?"


def _dist(vals: list[float]) -> dict[str, float]:
    if not vals:
        return {"n": 0}
    vals = sorted(vals)
    return {"n": len(vals), "p50": round(statistics.median(vals), 1),
            "p90": round(vals[min(len(vals) - 1, int(len(vals) * 0.9))], 1),
            "p99": round(vals[min(len(vals) - 1, int(len(vals) * 0.99))], 1), "max": round(vals[-1], 1)}


def summary(seen_file: Path | None, since: float = 0.0) -> dict[str, Any]:
    """Per-step distributions over the transactions (and, weighted by record, with the reader's
    visibility), after `since` (wall clock: the load client's warm-up excluded)."""
    rows = [r for r in _txns if "committed" in r and r["ready"] >= since]
    out: dict[str, Any] = {"transactions": len(rows)}
    if rows:
        span = max(r["committed"] for r in rows) - min(r["ready"] for r in rows)
        out["transactions_per_s"] = round(len(rows) / span, 1) if span > 0 else None
        out["batch_size"] = _dist([r["n"] for r in rows])
    steps = ("ready", "previous_done", "begun", "sent", "offsets_sent", "committed")
    for a, b in itertools.pairwise(steps):
        out[f"{a}->{b}"] = _dist([(r[b] - r[a]) * 1000 for r in rows if a in r and b in r])
    out["ready->committed"] = _dist([(r["committed"] - r["ready"]) * 1000 for r in rows])
    # the batches that found their partition's previous transaction still running
    out["waited_on_previous"] = sum(1 for r in rows if r["previous_done"] - r["ready"] > 0.001)
    seen: dict[str, float] = {}
    if seen_file is not None and seen_file.exists():
        seen = dict(json.loads(seen_file.read_text()))
    # per record: produced (the bench-sent header) -> fetched/taken/chained from _latency_trace,
    # -> the batch's transaction steps -> visible to the reader
    per: dict[str, list[float]] = {}
    marks = _latency_trace._marks
    for r in rows:
        for key_sent in r["records"]:
            if key_sent is None:
                continue
            sent = float(key_sent)
            chain = [("produced", sent)]
            m = _by_sent.get(key_sent)
            if m is not None:
                d = marks.get(m, {})
                chain += [(s, d[s]) for s in ("fetched", "taken") if s in d]
            chain += [(s, r[s]) for s in steps if s in r]
            if key_sent in seen:
                chain.append(("visible", seen[key_sent]))
            for (a, ta), (b, tb) in itertools.pairwise(chain):
                per.setdefault(f"{a}->{b}", []).append((tb - ta) * 1000)
            if key_sent in seen:
                per.setdefault("produced->visible", []).append((seen[key_sent] - sent) * 1000)
                per.setdefault("produced->committed", []).append((r["committed"] - sent) * 1000)
    out["per_record_ms"] = {k: _dist(v) for k, v in per.items()}
    if rows:  # the timeline: per transaction, [s after the first ready, partition, size, ms per step]
        t0 = min(r["ready"] for r in rows)
        out["timeline"] = [[round(r["ready"] - t0, 3), r["partition"], r["n"]]
                           + [round((r[b] - r[a]) * 1000, 1) if a in r and b in r else None
                              for a, b in itertools.pairwise(steps)] for r in rows]
    # produced->visible by the second of the run the record was produced in: start-up vs steady state
    if seen:
        t0 = min(float(k) for k in seen)
        by_s: dict[int, list[float]] = {}
        for k, v in seen.items():
            by_s.setdefault(int(float(k) - t0), []).append((v - float(k)) * 1000)
        out["visible_p50_by_second_ms"] = [round(statistics.median(by_s[i]), 1) for i in sorted(by_s)]
    reqs: dict[str, list[float]] = {}
    fails: Counter[str] = Counter()
    for name, ms, ok in _requests:
        reqs.setdefault(name, []).append(ms)
        if not ok:
            fails[name] += 1
    out["coordinator_requests_ms"] = {k: {**_dist(v), "retried": fails[k]} for k, v in reqs.items()}
    out["retriable_errors"] = dict(_errors)
    return out


#: bench-sent header -> record key, filled by the put wrapper below
_by_sent: dict[str, tuple[str, int, int]] = {}


def install_all() -> None:
    """`_latency_trace.install` (its file output unused: summarised here) plus the transaction
    steps, and the header index that joins the reader's view."""
    import tempfile

    from app.worker.batch_source import BatchBuffer

    _latency_trace.install(tempfile.mktemp(prefix="prism-eos-trace-", suffix=".json"))
    put = BatchBuffer.put

    def indexed_put(self: Any, message: Any) -> None:
        h = _header(message)
        if h is not None:
            _by_sent[h] = (message.topic, message.partition, message.offset)
        put(self, message)

    BatchBuffer.put = indexed_put  # type: ignore[method-assign]
    install()


def reset() -> None:
    """Forget what was traced (between the two modes' latency phases)."""
    _txns.clear()
    _requests.clear()
    _errors.clear()
    _by_sent.clear()
    _latency_trace._marks.clear()
