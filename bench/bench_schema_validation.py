"""Cost of publish-time schema validation against RFC-030's "< 15 ms p99" criterion.

    .venv/bin/python -m bench.bench_schema_validation [--n 20000] [--json out.json]

What is timed, per call, with `time.perf_counter_ns` around each one (so the percentiles are
real per-publish latencies, not means):

* `check`: what `PrismClient.publish(..., schema_validation=True)` adds before sending -
  serializing the payload for the validator and validating it (`SchemaValidation.check`, the
  compiled validator cached per schema id), for a valid order of ~20 fields with 10 line items,
  in each format: JSON Schema (jsonschema), Avro JSON datum (fastavro), protobuf (upb parse).
* `invalid`: the same for a payload failing in the last line item (the error path, with the
  field-path search).
* `publish`: the whole `publish` call with and without validation, on a backend whose publish
  records the message (no network: the broker round trip is the same either way).
* `cold`: the first validation of a schema (compiling the validator), once per format.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from typing import Any

from app.schema import payload_check
from app.schema.resolve import build_resolved
from app.sdk import PrismClient
from app.sdk.validation import SchemaValidation

ITEMS = 10
JSON_SCHEMA = {"title": "Order", "type": "object", "required": ["order_id", "customer_id", "items"],
               "properties": {
                   "order_id": {"type": "string", "maxLength": 64}, "customer_id": {"type": "string"},
                   "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]}, "total": {"type": "number"},
                   "created_at": {"type": "string"}, "channel": {"type": "string"}, "notes": {"type": "string"},
                   "shipping": {"type": "object", "properties": {k: {"type": "string"} for k in
                                                                  ("street", "city", "zip", "country")}},
                   "items": {"type": "array", "items": {
                       "type": "object", "required": ["sku", "qty", "price"],
                       "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1},
                                      "price": {"type": "number"}}}}}}
AVRO = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    *({"name": n, "type": "string"} for n in ("order_id", "customer_id", "currency", "created_at", "channel",
                                               "notes")),
    {"name": "total", "type": "double"},
    {"name": "shipping", "type": {"type": "record", "name": "Address", "fields": [
        {"name": k, "type": "string"} for k in ("street", "city", "zip", "country")]}},
    {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
        {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}, {"name": "price", "type": "double"}]}}}]}
PROTO = """syntax = "proto3";
package shop;
message Address { string street = 1; string city = 2; string zip = 3; string country = 4; }
message Item { string sku = 1; int32 qty = 2; double price = 3; }
message Order {
  string order_id = 1; string customer_id = 2; string currency = 3; double total = 4; string created_at = 5;
  string channel = 6; string notes = 7; Address shipping = 8; repeated Item items = 9;
}
"""


def order(bad: bool = False) -> dict[str, Any]:
    items = [{"sku": f"SKU-{i:05d}", "qty": 1 + i % 3, "price": 9.99 + i} for i in range(ITEMS)]
    if bad:
        items[-1]["price"] = "free"
    return {"order_id": "0190f3c2-7d1e-7b6a-9c1f-3b5a2e4d6f70", "customer_id": "c-1234567", "currency": "EUR",
            "total": 123.45, "created_at": "2026-11-27T18:00:00Z", "channel": "web", "notes": "leave at the door",
            "shipping": {"street": "Main St 1", "city": "Berlin", "zip": "10115", "country": "DE"}, "items": items}


def percentiles(ns: list[int]) -> dict[str, float]:
    s = sorted(ns)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] / 1000

    return {"p50_us": q(0.50), "p99_us": q(0.99), "p999_us": q(0.999), "max_us": s[-1] / 1000,
            "mean_us": statistics.fmean(s) / 1000}


def proto_payload(schema: Any, bad: bool) -> Any:
    from google.protobuf import descriptor_pool, json_format, message_factory

    from app.schema.protoparse import compile_proto

    pool = descriptor_pool.DescriptorPool()
    for fd in compile_proto(schema.schema_text).fds.file:
        pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
    msg = json_format.ParseDict(order(), cls())
    return msg.SerializeToString()[:-3] if bad else msg  # bad: cut inside the last item


def time_calls(fn: Any, n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        with contextlib.suppress(Exception):  # the invalid case raises SchemaValidationError: the path timed
            fn()
        out.append(clock() - t0)
    return out


async def time_publish(schema: Any, n: int, validate: bool) -> list[int]:
    client = PrismClient("kafka://127.0.0.1:1", namespace="order-events", schema=schema)

    async def sent(items: Any) -> None:
        return None

    client.backend.publish = sent  # type: ignore[method-assign]
    client._connected = True
    payload = order()
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        await client.publish("orders.created", payload, schema_validation=validate)
        out.append(clock() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results: dict[str, Any] = {"n": args.n, "items_per_order": ITEMS}
    check = SchemaValidation(None, None)
    for fmt, text in (("json", json.dumps(JSON_SCHEMA)), ("avro", json.dumps(AVRO)), ("protobuf", PROTO)):
        schema = build_resolved(text, fmt, url=f"bench://{fmt}", version="v1",
                                message="shop.Order" if fmt == "protobuf" else None)
        payload_check._CACHE.clear()
        t0 = time.perf_counter_ns()
        payload_check.validator_for(schema)
        cold_ms = (time.perf_counter_ns() - t0) / 1e6
        good = proto_payload(schema, False) if fmt == "protobuf" else order()
        bad = proto_payload(schema, True) if fmt == "protobuf" else order(bad=True)
        ct = "application/avro+json" if fmt == "avro" else None
        def call(payload: Any, schema: Any = schema, ct: str | None = ct) -> Any:
            return lambda: check.check(schema, "ns", payload, ct)

        time_calls(call(good), 500)  # warm-up
        valid = percentiles(time_calls(call(good), args.n))
        invalid = percentiles(time_calls(call(bad), max(args.n // 10, 100)))
        results[fmt] = {"cold_ms": round(cold_ms, 2), "valid": valid, "invalid": invalid}
        print(f"{fmt:9s} cold {cold_ms:7.2f} ms | valid p50 {valid['p50_us']:7.1f} p99 {valid['p99_us']:7.1f} "
              f"p99.9 {valid['p999_us']:7.1f} max {valid['max_us']:8.1f} us | invalid p50 {invalid['p50_us']:7.1f} "
              f"p99 {invalid['p99_us']:7.1f} us")
    schema = build_resolved(json.dumps(JSON_SCHEMA), "json", url="bench://json", version="v1")
    for validate in (False, True):
        asyncio.run(time_publish(schema, 500, validate))
        r = percentiles(asyncio.run(time_publish(schema, args.n, validate)))
        results[f"publish_{'validated' if validate else 'plain'}"] = r
        print(f"publish (JSON Schema) validate={validate!s:5s} p50 {r['p50_us']:7.1f} p99 {r['p99_us']:7.1f} "
              f"p99.9 {r['p999_us']:7.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
