"""Envelope codec benchmark (issue 2). Every comparison is a ratio measured in the same run.

    .venv/bin/python -m bench.bench_codec [--quick] [--json bench/results/codec.json]

1. Header-only parse cost vs payload size (1 KB .. 10 MB): `decode()` + reading every
   header context, against upb's full `FromString` of the same bytes as the baseline.
   Target: 10 MB cost <= 2x the 1 KB cost.
2. Typical envelope (all contexts set, 1 KB JSON payload): encode + decode + payload
   bytes, vs the same content as a CloudEvents structured-mode JSON event through the
   `cloudevents` SDK's Kafka binding (to_structured_event + from_structured_event).
   Targets: >= 5x faster; metadata overhead in bytes <= half of CloudEvents'.
3. HMAC-SHA256 signing + verification added to encode + decode. Target: <= +25%.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.v1.event import CloudEvent

from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope import Layout, decode, encode, new_envelope
from app.security.signing import SigningKey, VerificationKeys, sign, verify, verify_and_decode
from bench._timing import compare_us

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def json_payload(size: int) -> bytes:
    items, out = [], b""
    i = 0
    while len(out) < size:
        items.append({"sku": f"SKU-{i:05d}", "qty": i % 7 + 1, "price": round(9.99 + i, 2)})
        out = json.dumps({"order_id": "ord-12345", "customer": "c-981", "items": items}, separators=(",", ":")).encode()
        i += 1
    return out


def typical_envelope(payload: bytes):
    env = new_envelope("orders.created", payload, namespace="order-events", content_type="application/json",
                       priority=8, ttl_seconds=3600, correlation_id="req-12345",
                       causality_parent="01890a5d-ac96-774b-bcce-b302099a8057",
                       labels={"region": "us-west", "tier": "premium"})
    sec = env.ensure_security()
    sec.publisher_id, sec.publisher_team = "svc-orders", "commerce"
    sec.data_classification, sec.contains_pii = "internal", True
    obs = env.ensure_observability()
    obs.trace_id, obs.span_id, obs.trace_flags = TRACE_ID, SPAN_ID, 1
    obs.baggage["tenant"] = "acme"
    sch = env.ensure_schema()
    sch.schema_url = "https://registry.example.com/schemas/orders.created/v2"
    sch.schema_version, sch.schema_format, sch.schema_name = "v2", "protobuf", "OrderCreated"
    sch.schema_hash = "sha256:" + "ab" * 32
    sch.compatibility_mode = "backward"
    env.extensions["x-retry-count"] = b"0"
    return env


def typical_cloudevent(payload: bytes) -> CloudEvent:
    """The same information as `typical_envelope`, expressed the CloudEvents way."""
    return CloudEvent(
        attributes={
            "id": "01890a5d-ac96-774b-bcce-b302099a8058",
            "source": "order-events/svc-orders",
            "type": "orders.created",
            "time": datetime.now(UTC),
            "datacontenttype": "application/json",
            "dataschema": "https://registry.example.com/schemas/orders.created/v2",
            "traceparent": f"00-{TRACE_ID}-{SPAN_ID}-01",
            "tracestate": "tenant=acme",
            "dataclassification": "internal",
            "priority": 8,
            "ttlseconds": 3600,
            "correlationid": "req-12345",
            "causalityparent": "01890a5d-ac96-774b-bcce-b302099a8057",
            "publisherteam": "commerce",
            "containspii": True,
            "schemaversion": "v2",
            "schemaname": "OrderCreated",
            "schemahash": "sha256:" + "ab" * 32,
            "compatibilitymode": "backward",
            "labelregion": "us-west",
            "labeltier": "premium",
            "retrycount": 0,
        },
        data=json.loads(payload),
    )


def header_only(sizes: list[int]) -> list[dict]:
    rows = []
    for size in sizes:
        env = typical_envelope(b"x" * size)
        data = encode(env)

        def header_parse(data=data):
            e = decode(data)
            return (e.metadata.message_id, e.security.publisher_id, e.observability.trace_id,
                    e.schema.schema_version, e.priority)

        def full_parse(data=data):
            return vpb.PrismEnvelope.FromString(data).metadata.message_id

        t = compare_us({"h": header_parse, "f": full_parse})
        rows.append({"payload_bytes": size, "header_only_us": t["h"], "full_upb_parse_us": t["f"]})
    base = rows[0]["header_only_us"]
    for r in rows:
        r["vs_1kb"] = r["header_only_us"] / base
    return rows


def typical(payload_size: int = 1024) -> dict:
    payload = json_payload(payload_size)
    env = typical_envelope(payload)
    ce = typical_cloudevent(payload)
    key = SigningKey.hmac_sha256("bench", b"k" * 32)
    keys = VerificationKeys.of([key])

    def prism_roundtrip():
        return bytes(decode(encode(env)).payload_bytes())

    def prism_roundtrip_json():
        return decode(encode(env)).payload_json()

    def prism_signed_roundtrip():
        env2, _ = verify_and_decode(sign(env, key), keys)
        return bytes(env2.payload_bytes())

    def prism_signed_roundtrip_separate():
        data = sign(env, key)
        verify(data, keys)
        return bytes(decode(data).payload_bytes())

    def ce_roundtrip():
        msg = ce_kafka.to_structured_event(ce)
        return ce_kafka.from_structured_event(msg).get_data()

    wire = encode(env)
    ce_value = ce_kafka.to_structured_event(ce).value
    ce_data_len = len(json.dumps(json.loads(payload), separators=(",", ":")).encode())
    t = compare_us({
        "prism_encode_us": lambda: encode(env),
        "prism_decode_us": lambda: bytes(decode(wire).payload_bytes()),
        "prism_roundtrip_us": prism_roundtrip,
        "prism_roundtrip_json_us": prism_roundtrip_json,
        "prism_draft_roundtrip_us": lambda: bytes(decode(encode(env, Layout.DRAFT)).payload_bytes()),
        "prism_signed_roundtrip_us": prism_signed_roundtrip,
        "prism_signed_roundtrip_separate_calls_us": prism_signed_roundtrip_separate,
        "cloudevents_roundtrip_us": ce_roundtrip,
    })
    r = {
        "payload_bytes": len(payload),
        **t,
        "prism_wire_bytes": len(wire),
        "prism_overhead_bytes": len(wire) - len(payload),
        "cloudevents_wire_bytes": len(ce_value),
        "cloudevents_overhead_bytes": len(ce_value) - ce_data_len,
    }
    r["speedup_vs_cloudevents"] = r["cloudevents_roundtrip_us"] / r["prism_roundtrip_us"]
    r["speedup_vs_cloudevents_json_payload"] = r["cloudevents_roundtrip_us"] / r["prism_roundtrip_json_us"]
    r["overhead_ratio_vs_cloudevents"] = r["prism_overhead_bytes"] / r["cloudevents_overhead_bytes"]
    r["signing_added_fraction"] = r["prism_signed_roundtrip_us"] / r["prism_roundtrip_us"] - 1
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer payload sizes")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = [1024, 10 * 1024 * 1024] if args.quick else [1024, 10 * 1024, 100 * 1024, 1024 * 1024, 10 * 1024 * 1024]
    result = {"python": sys.version.split()[0], "machine": platform.machine(),
              "header_only": header_only(sizes), "typical": typical()}
    ho, ty = result["header_only"], result["typical"]
    print("Header-only parse (decode + read every header context)")
    print(f"{'payload':>10} {'header-only µs':>15} {'full upb parse µs':>18} {'vs 1 KB':>8}")
    for r in ho:
        print(f"{r['payload_bytes']:>10} {r['header_only_us']:>15.2f} {r['full_upb_parse_us']:>18.2f} {r['vs_1kb']:>8.2f}")
    print("\nTypical envelope, all contexts, 1 KB JSON payload")
    for k, v in ty.items():
        print(f"  {k:38} {v:.3f}" if isinstance(v, float) else f"  {k:38} {v}")
    checks = {
        "header-only 10 MB <= 2x 1 KB": ho[-1]["vs_1kb"] <= 2.0,
        ">= 5x faster than CloudEvents": ty["speedup_vs_cloudevents"] >= 5.0,
        "<= half CloudEvents metadata bytes": ty["overhead_ratio_vs_cloudevents"] <= 0.5,
        "HMAC sign+verify adds <= 25%": ty["signing_added_fraction"] <= 0.25,
    }
    result["targets"] = checks
    print("\nTargets")
    for k, ok in checks.items():
        print(f"  [{'PASS' if ok else 'MISS'}] {k}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
